"""The files of ``cleanup``: the archive read for the planner, and what a plan removes.

:func:`read_contents` gathers what :func:`~receivewal.retention.plan.plan_retention` judges:
the backups (:func:`~receivewal.backup.catalog.read_catalog`), the archive directory's names and
its history files, parsed. :func:`apply_plan` removes the backups first, then the WAL files. A
backup's record goes first, with the directory fsynced, so that a crash in the middle of a
removal leaves a directory without a record (no backup, which a later cleanup removes), never
one that recovery would take for complete. Removals are made durable with an fsync of each
directory through :mod:`receivewal.archive.durable`.

:func:`apply_policy` is the whole of ``cleanup --keep-backups | --recovery-window``, and what
``backup`` runs after a backup when a policy is set: it reads the archive, takes what the
running daemon holds (:class:`Holds`: its slot's restart position and its timeline, as the
state file says; the command line reads that, and with a connection asks the server where the
slot is now, :func:`read_server_slot`) and the upload backlog, plans, and removes (nothing with
``dry_run``). It reads a directory and a bucket's prefix alike, through the archive's view
(:class:`~receivewal.archive.view.ArchiveView`: one plan for both); only the removal differs.
In a bucket no daemon state is read (the daemon's slot and upload backlog are in its
directory), a backup without its record is kept while it may still be uploading (no lock
tells it from an interrupted one) until it is abandoned
(:func:`~receivewal.backup.catalog.abandoned`), and is then removed with the multipart uploads
it left unfinished; a backup goes record first there too, so that a cleanup cut short leaves
files without a record, never a record without its files.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from receivewal.archive.directory import Archive
from receivewal.archive.durable import sync_path
from receivewal.archive.identity import ArchiveIdentity, check_same_cluster
from receivewal.archive.location import DirectoryLocation, list_directory
from receivewal.archive.sources import recorded_identity
from receivewal.archive.uploads import pending_files, read_upload_record, recorded_destination
from receivewal.archive.view import ArchiveView, locate, parsed_histories
from receivewal.archive.view import read_histories as view_histories
from receivewal.backup.backupdir import BACKUPS
from receivewal.backup.catalog import backup_of, catalog_of, read_catalog
from receivewal.backup.record import RECORD_NAME
from receivewal.errors import ArchiveError, StoreAccessDenied
from receivewal.retention.plan import ArchiveContents, Policy, RetentionPlan, plan_retention
from receivewal.wal.lsn import DEFAULT_SEGMENT_SIZE
from receivewal.wal.names import parse_archive_segment_name
from receivewal.wal.timeline import TimelineSwitch


def read_histories(archive: Path, names: Iterable[str]) -> dict[int, list[TimelineSwitch]]:
    """The history files among ``names`` in the archive directory ``archive``, parsed, by
    timeline (:func:`~receivewal.archive.view.read_histories` reads them)."""
    location = DirectoryLocation(archive)
    return parsed_histories(location, view_histories(location, names))


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


@dataclass(frozen=True)
class Holds:
    """What the daemon streaming into the archive holds on to (its state file says):
    the slot's restart position, the timeline it streams, where it uploads; and the slot's
    name when ``slot_restart`` is what its server said (:func:`read_server_slot`), None when
    it is the state file's."""

    slot_restart: int | None = None
    timeline: int | None = None
    upload_to: str | None = None
    slot: str | None = None


@dataclass(frozen=True)
class ServerSlot:
    """A physical replication slot as its server reports it now (READ_REPLICATION_SLOT)."""

    name: str
    exists: bool
    restart: int | None  # its restart_lsn; None when it reserves no WAL or does not exist


def read_server_slot(conninfo: str, slot: str, archive: Path, *,
                     timeout: float = 30.0) -> ServerSlot:
    """The slot ``slot`` as the server at ``conninfo`` reports it, once the server is shown to
    be the archive's own cluster (its identity record, when it has one). Raises
    ConnectionLost (no answer), ServerError (not a physical slot) and ForeignArchive
    (another cluster's server, whose slots say nothing of this archive)."""
    from receivewal.replication.commands import (  # noqa: PLC0415 - psycopg only if asked
        identify_server,
        read_slot,
        slot_exists,
    )
    from receivewal.replication.connection import ReplicationConnection  # noqa: PLC0415

    names = [name for name, _ in list_directory(archive)]
    identity = recorded_identity(str(archive), names)
    conn = ReplicationConnection.open(conninfo, timeout=timeout)
    try:
        server = identify_server(conn)
        if identity is not None:
            check_same_cluster(f'archive directory "{archive}"', identity, ArchiveIdentity(
                server.system_identifier, server.segment_size, server.timeline))
        if not slot_exists(conn, slot):
            return ServerSlot(slot, exists=False, restart=None)
        position = read_slot(conn, slot)
    finally:
        conn.close()
    return ServerSlot(slot, exists=True, restart=None if position is None else position[0])


@dataclass(frozen=True)
class CleanupReport:
    """What a cleanup removed (or would have, ``dry_run``), kept and why, and the bytes."""

    plan: RetentionPlan
    removed_files: tuple[str, ...]
    freed_bytes: int
    dry_run: bool


def read_archive(view: ArchiveView, holds: Holds = Holds(),
                 unfinished: Iterable[str] = ()) -> ArchiveContents:
    """The archive ``view`` sees as the planner judges it: its segment size (its identity
    record's, else its segments' headers', else a backup's, else PostgreSQL's default), the
    newest timeline it or the daemon knows, the slot's restart position and, in a directory,
    the files still waiting for their upload (a bucket has no daemon state: its daemon's slot
    and backlog are in the daemon's directory). ``unfinished``: the multipart uploads a
    killed backup left in a bucket (a backup of which only those are left is listed too)."""
    names = view.names
    identity = view.identity()
    catalog = catalog_of(view, unfinished)
    records = [e.record for e in catalog if e.record is not None]
    size = view.segment_size() or \
        next((r.wal_segment_size for r in records), DEFAULT_SEGMENT_SIZE)
    histories = view.histories()
    timelines = [holds.timeline or 1, *histories, *(r.end_timeline for r in records)]
    timelines += [parsed.timeline for name in names
                  if (parsed := parse_archive_segment_name(name, size)) is not None]
    if identity is not None:
        timelines.append(identity.timeline)
    destination = holds.upload_to
    backlog: frozenset[str] = frozenset()
    if view.location.is_local:
        archive = Path(view.archive)
        destination = destination or recorded_destination(archive)
        if destination is not None:
            directory = Archive(archive, sync=False)
            record = read_upload_record(directory, destination)
            backlog = frozenset(p.name for p in pending_files(directory, record, size))
    return ArchiveContents(catalog, names, histories, max(timelines), size,
                           holds.slot_restart, backlog, destination or "", holds.slot or "")


def apply_policy(archive: Path | str, policy: Policy, holds: Holds = Holds(), *,
                 dry_run: bool = False, sync: bool = True) -> CleanupReport:
    """Plan ``policy`` on the archive ``archive`` (a directory, or a bucket's prefix) and
    carry the plan out (not with ``dry_run``): each removed backup's record first, then its
    other files, then the WAL files. Raises ArchiveError (a file that cannot be read or
    removed), StoreError and ConfigurationError (a policy that keeps nothing)."""
    location = locate(str(archive))
    if location.is_local and not Path(archive).is_dir():
        raise ArchiveError(f'archive directory "{archive}" does not exist')
    view = ArchiveView(str(archive), location)
    unfinished = _unfinished(view)
    plan = plan_retention(read_archive(view, holds, [name for name, _ in unfinished]), policy)
    sizes = dict(view.files)
    if location.is_local:
        freed = sum(backup_bytes(Path(archive) / BACKUPS / b) for b in plan.removed_backups)
    else:
        gone = set(plan.removed_backups)
        freed = sum(size for name, size in view.files_under(BACKUPS) if backup_of(name) in gone)
    if dry_run:
        removed = plan.removed_files
    elif location.is_local:
        for backup_id in plan.removed_backups:
            remove_backup(Path(archive), backup_id, sync=sync)
        removed = remove_files(Path(archive), plan.removed_files, sync=sync)
    else:
        removed = _remove_from_bucket(view, plan, unfinished)
    freed += sum(sizes.get(name, 0) for name in removed)
    return CleanupReport(plan, tuple(removed), freed, dry_run)


def _unfinished(view: ArchiveView) -> list[tuple[str, str]]:
    """The unfinished multipart uploads under a bucket's ``backups/`` (name, upload ID); none
    in a directory, nor when the credentials may not list them
    (s3:ListBucketMultipartUploads: the store's lifecycle rule is then their end)."""
    if view.location.is_local:
        return []
    from receivewal.archive.bucket import Bucket  # noqa: PLC0415 - a bucket's location

    assert isinstance(view.location, Bucket)  # what is_local says
    try:
        return view.location.unfinished_uploads(BACKUPS)
    except StoreAccessDenied:
        return []


def _remove_from_bucket(view: ArchiveView, plan: RetentionPlan,
                        unfinished: list[tuple[str, str]]) -> list[str]:
    """Carry ``plan`` out in a bucket: each removed backup's record object, then its other
    objects, its unfinished uploads aborted, then the WAL files; the WAL files removed."""
    from receivewal.archive.bucket import Bucket  # noqa: PLC0415 - a bucket's location

    bucket = view.location
    assert isinstance(bucket, Bucket)  # what is_local says
    gone = set(plan.removed_backups)
    objects = sorted((name for name, _ in view.files_under(BACKUPS) if backup_of(name) in gone),
                     key=lambda name: (backup_of(name), not name.endswith("/" + RECORD_NAME)))
    for name in objects:
        bucket.delete(name)
    for name, upload_id in unfinished:
        if backup_of(name) in gone:
            bucket.abort_upload(name, upload_id)
    for name in plan.removed_files:
        bucket.delete(name)
    return list(plan.removed_files)


def backup_bytes(path: Path) -> int:
    """The bytes of the files of the backup directory ``path`` (0 when it is gone)."""
    total = 0
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    except FileNotFoundError:
        return 0
    return total
