"""The backups an archive holds: ``ARCHIVE/backups/*/`` read (files opened: their records).

A directory with a readable record (:mod:`receivewal.backup.record`) is a complete backup; one
without is an interrupted backup, or one being written (its writer holds ``flock`` on the
directory: :func:`~receivewal.archive.lock.is_locked` tells them apart); one whose record
cannot be read is damaged. Recovery uses only the complete ones; retention removes complete
ones that its policy drops and interrupted ones, never a running or a damaged one.

The writer makes the directory, then takes its lock, then writes files, and lets the lock go
only once the record is written (or the directory removed). So a directory is called
interrupted only when it is not empty (its writer had the lock), the lock is free, and then
still no record is there: a writer that dies never writes its record later. An empty
directory may be a backup between its ``mkdir`` and its lock: it is left alone.

A record is not proof that the files are there: a file deleted, lost or cut short later leaves
a record that lies. So a backup is :attr:`EntryState.COMPLETE` only when a listing of its
directory (or its prefix) shows every file its record names, each tar of its recorded
size (:func:`~receivewal.backup.record.absent_files`: names and sizes, no data read); else it is
:attr:`EntryState.INCOMPLETE`, with what is missing, and neither recovery nor retention counts
it (:func:`proven`).

In a bucket no lock tells a running upload from a dead one; a backup's ID is its start time
(UTC), so one without a record that started more than :data:`ABANDONED_AFTER` ago is
:attr:`EntryState.ABANDONED` (:func:`abandoned`), which retention removes; a backup still
running that long finds its objects gone before it writes its record, and fails.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from pathlib import Path

from receivewal.archive.location import Location
from receivewal.archive.lock import is_locked
from receivewal.archive.reading import read_small_file
from receivewal.archive.view import ArchiveView
from receivewal.backup.backupdir import BACKUPS, is_backup_id
from receivewal.backup.record import (
    RECORD_CAP,
    RECORD_NAME,
    BackupRecord,
    absent_files,
    record_from_json,
)
from receivewal.backup.stored import BackupFiles, DirectoryFiles, LocationFiles
from receivewal.errors import ArchiveError, StoreError


class EntryState(Enum):
    """What a directory of ``backups/`` is."""

    COMPLETE = "complete"
    RUNNING = "being written"
    INTERRUPTED = "interrupted (no record)"
    UNKNOWN = "no record, and whether it is being written cannot be told"
    ABANDONED = "no record, started more than 7 days ago: abandoned"
    EMPTY = "empty: a backup starting, or one that never began"
    DAMAGED = "record unreadable"
    INCOMPLETE = "its record is there, not all its files"


@dataclass(frozen=True)
class BackupEntry:
    """One directory of ``backups/``: its record when complete, else what it is."""

    backup_id: str
    state: EntryState
    record: BackupRecord | None = None
    problem: str = ""  # a damaged record's problem
    bytes: int | None = None  # an interrupted one's files in a directory (disk it still uses)

    def describe(self) -> str:
        """The entry's state in words."""
        return f"{self.state.value}: {self.problem}" if self.problem else self.state.value

    @property
    def interrupted(self) -> bool:
        """Whether this is a backup that stopped before its record (SIGKILL, a crash, the
        host down) and nobody writes any more: no recovery starts from it, it holds disk or
        objects until ``cleanup`` removes it."""
        return self.state in (EntryState.INTERRUPTED, EntryState.ABANDONED)


ABANDONED_AFTER = timedelta(days=7)  # far longer than a backup runs; EntryState.ABANDONED says it
ID_TIME = "%Y%m%dT%H%M%SZ"  # directory.backup_id_for's format


def abandoned(backup_id: str, now: datetime | None = None,
              after: timedelta = ABANDONED_AFTER) -> bool:
    """Whether a backup without its record, in a bucket, is abandoned: its ID (its start,
    ``-N`` aside) is more than ``after`` before ``now``. An ID that is no time: never."""
    try:
        started = datetime.strptime(backup_id.split("-", 1)[0], ID_TIME).replace(tzinfo=UTC)
    except ValueError:
        return False
    return (now or datetime.now(UTC)) - started > after


def unrecorded_in_bucket(backup_id: str, now: datetime | None = None) -> BackupEntry:
    """The entry of a bucket's backup without its record."""
    state = EntryState.ABANDONED if abandoned(backup_id, now) else EntryState.UNKNOWN
    return BackupEntry(backup_id, state)


def catalog_of(view: ArchiveView, unfinished: Iterable[str] = ()) -> list[BackupEntry]:
    """The backups of the archive ``view`` sees, by ID: a directory's (:func:`read_catalog`),
    or each backup the listing of a bucket's ``backups/`` shows, and each that only the
    ``unfinished`` multipart uploads name (names from the prefix: a killed backup's)."""
    if view.location.is_local:
        return read_catalog(Path(view.archive))
    by_id = bucket_backups(view.files_under(BACKUPS))
    for name in unfinished:
        by_id.setdefault(backup_of(name), {})
    by_id.pop("", None)
    return [proven(_bucket_entry(view.location, backup_id, files), files)
            for backup_id, files in sorted(by_id.items())]


def backup_files(view: ArchiveView, backup_id: str) -> BackupFiles:
    """The files of the backup ``backup_id`` of the archive ``view`` sees."""
    if view.location.is_local:
        return DirectoryFiles(Path(view.archive) / BACKUPS / backup_id)
    return LocationFiles(view.location, f"{BACKUPS}/{backup_id}")


def backup_where(view: ArchiveView, backup_id: str) -> str:
    """Where the backup ``backup_id`` of the archive ``view`` sees is, for messages."""
    if view.location.is_local:
        return str(Path(view.archive) / BACKUPS / backup_id)
    return view.location.where(f"{BACKUPS}/{backup_id}")


def backup_of(name: str) -> str:
    """The backup ID of a file named ``backups/<id>/...`` from the archive's top; "" if none
    (a folder whose name is no ID of ours, ``backups/manual-copy/``, is no backup: it is
    neither counted nor removed)."""
    parts = name.split("/", 2)
    return parts[1] if len(parts) == 3 and is_backup_id(parts[1]) else ""


def bucket_backups(listing: Iterable[tuple[str, int]]) -> dict[str, dict[str, int]]:
    """Each backup's files (name within the backup: size) by ID, of a listing of
    ``backups/`` in a bucket (names from the top)."""
    by_id: dict[str, dict[str, int]] = {}
    for name, size in listing:
        backup_id = backup_of(name)
        if backup_id:
            by_id.setdefault(backup_id, {})[name.split("/", 2)[2]] = size
    return by_id


def _bucket_entry(location: Location, backup_id: str, files: Mapping[str, int]) -> BackupEntry:
    """What a bucket's backup is: complete with a readable record naming it, damaged with one
    that is not, unrecorded (:func:`unrecorded_in_bucket`) without."""
    if RECORD_NAME not in files:
        return unrecorded_in_bucket(backup_id)
    name = f"{BACKUPS}/{backup_id}/{RECORD_NAME}"
    where = location.where(name)
    try:
        record = record_from_json(location.read_small(name, RECORD_CAP), where)
    except (ArchiveError, StoreError) as exc:
        return BackupEntry(backup_id, EntryState.DAMAGED, problem=str(exc))
    if record.backup_id != backup_id:
        return BackupEntry(backup_id, EntryState.DAMAGED,
                           problem=f"{where} names backup {record.backup_id}")
    return BackupEntry(backup_id, EntryState.COMPLETE, record)


def read_catalog(archive: Path) -> list[BackupEntry]:
    """Every backup directory of ``archive``, by name (none when there is no ``backups``)."""
    backups = archive / BACKUPS
    try:
        with os.scandir(backups) as found:
            names = sorted(e.name for e in found
                           if e.is_dir(follow_symlinks=False) and not e.name.startswith("."))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ArchiveError(f'could not list "{backups}": {exc.strerror or exc}') from exc
    return [read_entry(backups / name) for name in names]


def read_entry(path: Path) -> BackupEntry:
    """What the backup directory ``path`` is (the order of the looks: see the module's
    docstring)."""
    entry = _complete(path) or _unrecorded(path)
    return entry if entry.record is None else _proven_directory(entry, path)


def _unrecorded(path: Path) -> BackupEntry:
    """What the directory ``path``, which had no record at the first look, is."""
    try:
        empty = not any(path.iterdir())
    except OSError as exc:
        return BackupEntry(path.name, EntryState.DAMAGED, problem=str(exc))
    running = is_locked(path)
    if running is None:
        return BackupEntry(path.name, EntryState.UNKNOWN)
    if running:
        return BackupEntry(path.name, EntryState.RUNNING)
    if empty:
        return BackupEntry(path.name, EntryState.EMPTY)
    return _complete(path) or BackupEntry(path.name, EntryState.INTERRUPTED,
                                          bytes=tree_bytes(path))


def proven(entry: BackupEntry, listing: Mapping[str, int]) -> BackupEntry:
    """``entry`` when it is no complete backup or its files are all in ``listing`` (the
    backup's files, name: size); else the backup as :attr:`EntryState.INCOMPLETE`, saying
    what is missing."""
    if entry.record is None:
        return entry
    problem = absent_files(entry.record, listing)
    if problem is None:
        return entry
    return BackupEntry(entry.backup_id, EntryState.INCOMPLETE, problem=problem)


def directory_listing(path: Path) -> dict[str, int]:
    """The regular files of the directory ``path`` and their sizes (one scan, nothing read)."""
    with os.scandir(path) as found:
        return {e.name: e.stat(follow_symlinks=False).st_size for e in found
                if e.is_file(follow_symlinks=False)}


def _proven_directory(entry: BackupEntry, path: Path) -> BackupEntry:
    try:
        listing = directory_listing(path)
    except OSError as exc:
        return BackupEntry(path.name, EntryState.DAMAGED,
                           problem=f'could not list "{path}": {exc.strerror or exc}')
    return proven(entry, listing)


def tree_bytes(path: Path) -> int:
    """The bytes of the regular files under ``path`` (0 when there is none)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                info = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            total += info.st_size
    return total


def _complete(path: Path) -> BackupEntry | None:
    """The entry of ``path`` when it has a record (a damaged one when it cannot be read);
    None when it has none."""
    record_path = path / RECORD_NAME
    try:
        data = read_small_file(record_path, RECORD_CAP)
    except FileNotFoundError:
        return None
    except (OSError, ArchiveError) as exc:
        return BackupEntry(path.name, EntryState.DAMAGED, problem=str(exc))
    try:
        record = record_from_json(data, str(record_path))
    except ArchiveError as exc:
        return BackupEntry(path.name, EntryState.DAMAGED, problem=str(exc))
    if record.backup_id != path.name:
        return BackupEntry(path.name, EntryState.DAMAGED,
                           problem=f"{record_path} names backup {record.backup_id}")
    return BackupEntry(path.name, EntryState.COMPLETE, record)
