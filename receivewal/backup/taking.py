"""``receivewal backup``: one base backup of a server into its WAL archive, end to end.

The archive must be receivewal's (its identity record: ``receivewal stream`` writes it) and of
the server's system: another system identifier or segment size is refused before anything is
written. The backup goes to ``ARCHIVE/backups/<id>/`` or is uploaded to
``s3://BUCKET/PREFIX/backups/<id>/`` (:func:`new_backup`), checked against its manifest as it
arrives (:mod:`receivewal.backup.receipt`); then, before its record is written, the archive
must hold every WAL segment from the backup's start to its end: the ``stream``
daemon archives them, and the end segment is completed by the switch the server makes at the
backup's end. After ``wal_wait`` seconds without one of them the backup is given up (its
directory removed, no record written) with an error naming the segment.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol

from receivewal.archive.compression import NO_COMPRESSION, CompressSpec
from receivewal.archive.identity import ArchiveIdentity, check_same_cluster
from receivewal.archive.recipients import RecipientSet
from receivewal.archive.view import ArchiveView
from receivewal.backup.catalog import backup_where
from receivewal.backup.command import BackupRequest
from receivewal.backup.record import BackupRecord
from receivewal.backup.transfer import BackupTarget, take_backup_into
from receivewal.errors import ArchiveError, StopRequested
from receivewal.replication.commands import identify_server
from receivewal.replication.connection import ReplicationConnection
from receivewal.wal.lsn import format_lsn


class MissingWal(ArchiveError):  # noqa: N818 - a state, as the brief names errors
    """The archive lacks a WAL segment the backup needs, after the wait."""


@dataclass(frozen=True)
class BackupSettings:
    """What ``receivewal backup`` was asked to do."""

    archive: str  # a directory or s3://BUCKET/PREFIX
    conninfo: str
    request: BackupRequest = field(default_factory=BackupRequest)
    compress: CompressSpec = NO_COMPRESSION  # client-side, unless the server compresses
    wal_wait: float = 60.0  # seconds to wait for the backup's WAL in the archive
    sync: bool = True
    encrypt_to: RecipientSet | None = None  # --encrypt-to: every file sealed to them


def archive_identity(place: ArchiveView) -> ArchiveIdentity:
    """The archive's identity; ArchiveError when it has none (it is no receivewal archive
    yet)."""
    identity = place.identity()
    if identity is None:
        raise ArchiveError(f"{place.archive} is not a receivewal archive (it has no identity "
                           "record): run receivewal stream into it first, base backups need "
                           "its WAL")
    return identity


def wait_for_wal(place: ArchiveView, record: BackupRecord, wait: float, *,
                 stopping: Callable[[], bool] = lambda: False,
                 say: Callable[[str], None] = lambda _: None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
    """Return once the archive holds every WAL segment ``record`` needs; MissingWal naming the
    first one missing when ``wait`` seconds pass without it."""
    deadline = clock() + wait
    needed = record.wal_segments()
    said = ""
    while needed:
        if place.holds_segment(needed[0]):
            needed.pop(0)
            continue
        if clock() >= deadline:
            raise MissingWal(
                f"backup {record.backup_id} is not complete: the archive {place.archive} lacks "
                f"WAL segment {needed[0]} (it needs {', '.join(needed[:3])}"
                f"{' ...' if len(needed) > 3 else ''} for the WAL from "
                f"{format_lsn(record.start_lsn)} to {format_lsn(record.end_lsn)}) after "
                f"{wait:g} s: is receivewal stream archiving this server's WAL there?")
        if said != needed[0]:
            say(f"waiting up to {wait:g} s for the archive to hold WAL segment {needed[0]}")
            said = needed[0]
        if stopping():
            raise StopRequested("base backup stopped while it waited for its WAL")
        sleep(place.poll)


class BackupWatch(Protocol):
    """Who follows a backup's bytes (``receivewal backup --progress``)."""

    def estimate(self, total: int | None) -> None:
        """The checkpoint is done and the stream starts: the server's estimate in bytes."""

    def update(self, done: int) -> None:
        """The server has sent ``done`` bytes of the backup."""


def checkpoint_wait(fast: bool) -> str:
    """What the backup waits for before the server sends a byte."""
    if fast:
        return "waiting for the server's immediate checkpoint (--fast)"
    return ("waiting for the server's checkpoint, spread over checkpoint_completion_target "
            "(minutes on a quiet server); --fast asks for an immediate one")


def run_backup(settings: BackupSettings, *, stopping: Callable[[], bool] = lambda: False,
               say: Callable[[str], None] = lambda _: None,
               prompt: Callable[[], str | None] | None = None,
               watch: BackupWatch | None = None) -> tuple[BackupRecord, str]:
    """Take the backup; its record and where it is. ``prompt`` is asked for a password once
    when the server wants one the connection string lacks; ``watch`` follows the bytes (the
    server is asked for its estimate, an extra pass over its files, only then)."""
    place = ArchiveView.open(settings.archive)
    identity = archive_identity(place)
    conn = ReplicationConnection.open(settings.conninfo, prompt)
    try:
        server = identify_server(conn)
        check_same_cluster(place.archive, identity, ArchiveIdentity(
            server.system_identifier, server.segment_size, server.timeline))
        if settings.encrypt_to is not None:  # listed before anything is sealed to it
            adopt_recipients(place, settings.encrypt_to, sync=settings.sync,
                             file_mode=server.file_mode)
        say(f"base backup of database system {server.system_identifier} started: "
            + checkpoint_wait(settings.request.fast))
        request = settings.request
        if watch is not None:
            request = dataclasses.replace(request, progress=True)

        def checkpoint_done(estimate: int | None) -> None:
            say("checkpoint done: receiving the backup" + (
                "" if estimate is None else f" (the server estimates {estimate / 2**20:.1f} MB)"))
            if watch is not None:
                watch.estimate(estimate)

        record = take_backup_into(
            conn, request,
            lambda started: new_backup(place, started, settings.compress, sync=settings.sync,
                                       file_mode=server.file_mode,
                                       recipients=settings.encrypt_to),
            server, stopping=stopping,
            before_commit=lambda rec: wait_for_wal(place, rec, settings.wal_wait,
                                                   stopping=stopping, say=say), say=say,
            on_started=checkpoint_done, on_progress=None if watch is None else watch.update)
    finally:
        conn.close()
    return record, backup_where(place, record.backup_id)


def new_backup(place: ArchiveView, started: datetime, compress: CompressSpec, *, sync: bool,
               file_mode: int, recipients: RecipientSet | None = None) -> BackupTarget:
    """A new backup's target in the archive, named for its start (its files sealed to
    ``recipients`` when given): a directory of ``backups/``, or a bucket's uploads."""
    if place.location.is_local:
        from receivewal.backup.backupdir import BackupDirectory  # noqa: PLC0415

        return BackupDirectory.create(Path(place.archive), started, compress, sync=sync,
                                      file_mode=file_mode, recipients=recipients)
    from receivewal.archive.bucket import Bucket  # noqa: PLC0415 - a bucket's location
    from receivewal.backup.upload import BucketBackup  # noqa: PLC0415

    assert isinstance(place.location, Bucket)  # what is_local says
    return BucketBackup.create(place.location, started, compress, recipients)


def adopt_recipients(place: ArchiveView, recipients: RecipientSet, *, sync: bool,
                     file_mode: int) -> None:
    """List ``recipients`` in the archive's identity record before a backup is sealed to
    them (``--encrypt-to``). A bucket's identity object is create-only (``stream
    --upload-to`` writes it, with the sets it knew): it is not rewritten; the backup's record
    and recipients objects say to whom its files are sealed."""
    if place.location.is_local:
        from receivewal.archive.directory import Archive  # noqa: PLC0415

        Archive(Path(place.archive), sync=sync, file_mode=file_mode).adopt_recipients(
            recipients)
