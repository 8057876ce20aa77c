"""The files of ``cleanup``: the archive read for the planner, and what a plan removes.

:func:`read_contents` gathers what :func:`~receivewal.backup.retention.plan_retention` judges:
the backups (:func:`~receivewal.backup.catalog.read_catalog`), the archive directory's names and
its history files, parsed. :func:`apply_plan` removes the backups first, then the WAL files. A
backup's record goes first, with the directory fsynced, so that a crash in the middle of a
removal leaves a directory without a record (no backup, which a later cleanup removes), never
one that recovery would take for complete. Removals are made durable with an fsync of each
directory through :mod:`receivewal.archive.durable`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from receivewal.archive.durable import sync_path
from receivewal.archive.reading import HISTORY_FILE_CAP, read_small_file
from receivewal.archive.sources import list_directory
from receivewal.backup.catalog import read_catalog
from receivewal.backup.directory import BACKUPS
from receivewal.backup.record import RECORD_NAME
from receivewal.backup.retention import ArchiveContents, RetentionPlan
from receivewal.errors import ArchiveError
from receivewal.wal.names import parse_history_file_name
from receivewal.wal.timeline import TimelineSwitch, parse_history


def read_histories(archive: Path, names: Iterable[str]) -> dict[int, list[TimelineSwitch]]:
    """The history files among ``names``, parsed, by timeline."""
    histories = {}
    for name in names:
        timeline = parse_history_file_name(name)
        if timeline is None:
            continue
        path = archive / name
        try:
            text = read_small_file(path, HISTORY_FILE_CAP).decode()
        except (OSError, UnicodeDecodeError) as exc:
            raise ArchiveError(f'could not read history file "{path}": {exc}') from exc
        histories[timeline] = parse_history(text, timeline)
    return histories


def read_contents(archive: Path, current_timeline: int, segment_size: int,
                  slot_restart: int | None = None) -> ArchiveContents:
    """What the retention planner judges in the archive directory ``archive``."""
    names = [name for name, _ in list_directory(archive)]
    return ArchiveContents(read_catalog(archive), names, read_histories(archive, names),
                           current_timeline, segment_size, slot_restart)


def remove_backup(archive: Path, backup_id: str, *, sync: bool = True) -> None:
    """Remove ``archive/backups/<backup_id>``: its record first (fsynced), then the rest."""
    backups = archive / BACKUPS
    path = backups / backup_id
    if "/" in backup_id or backup_id.startswith(".") or not path.is_dir():
        raise ArchiveError(f"no backup directory {path}")
    try:
        (path / RECORD_NAME).unlink(missing_ok=True)
        sync_path(path, sync=sync)
        shutil.rmtree(path)
        sync_path(backups, sync=sync)
    except OSError as exc:
        raise ArchiveError(f'could not remove backup "{path}": {exc.strerror or exc}') from exc


def remove_files(archive: Path, names: Iterable[str], *, sync: bool = True) -> list[str]:
    """Remove the archive files ``names`` (those already gone are skipped); the removed."""
    removed = []
    for name in names:
        if "/" in name or name in ("", ".", ".."):
            raise ArchiveError(f"{name!r} is not a file name of the archive")
        try:
            os.unlink(archive / name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ArchiveError(f'could not remove "{archive / name}": '
                               f"{exc.strerror or exc}") from exc
        removed.append(name)
    if removed:
        sync_path(archive, sync=sync)
    return removed


def apply_plan(archive: Path, plan: RetentionPlan, *, sync: bool = True) -> list[str]:
    """Remove what ``plan`` removes: the backups, then the WAL files; the files removed."""
    for backup_id in plan.removed_backups:
        remove_backup(archive, backup_id, sync=sync)
    return remove_files(archive, plan.removed_files, sync=sync)
