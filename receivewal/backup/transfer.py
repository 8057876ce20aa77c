"""One base backup from a replication connection into a backup directory.

:func:`take_backup` sends BASE_BACKUP (:mod:`receivewal.backup.command`), reads the start
position and the tablespaces, feeds the COPY stream to a
:class:`~receivewal.backup.receipt.Receipt` that writes into a
:class:`~receivewal.backup.backupdir.BackupDirectory`, reads the end position, checks the
backup against its manifest, writes the manifest, and (once ``before_commit`` has had its say,
e.g. waited for the archive to hold the backup's WAL) the record. On any error the directory
is removed; a crash leaves it without a record.

It needs of the connection only :class:`BackupLink`, which
:class:`~receivewal.replication.connection.ReplicationConnection` is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from receivewal.archive.compression import NO_COMPRESSION, CompressSpec
from receivewal.archive.recipients import RecipientSet
from receivewal.backup.backupdir import BackupDirectory
from receivewal.backup.command import (
    BackupRequest,
    base_backup_command,
    parse_position,
    parse_tablespaces,
)
from receivewal.backup.receipt import BackupSink, Receipt, ReceivedBackup
from receivewal.backup.record import BackupRecord, StoredArchive, WalSpan
from receivewal.errors import ConnectionLost, ProtocolError, ServerError, StopRequested
from receivewal.replication.commands import ServerInfo
from receivewal.replication.link import COPY_DONE, CopyData, CopyDone, Result, ResultStatus, Row

WAIT = 1.0  # seconds between looks at the stop signal while the server is quiet


class BackupTarget(BackupSink, Protocol):
    """Where a backup is written: a backup directory, or a bucket's backup
    (:class:`~receivewal.backup.upload.BucketBackup`)."""

    backup_id: str
    stored: list[StoredArchive]
    recipients: RecipientSet | None  # --encrypt-to: the files are sealed to them
    manifest_name: str  # the manifest as stored (backup_manifest, or .age when sealed)

    def write_manifest(self, data: bytes) -> str:
        """Store the manifest; its SHA-256."""

    def commit(self, record: BackupRecord) -> None:
        """Store the record, last."""

    def abort(self) -> list[str]:
        """Give the backup up: remove what was stored; what could not be, one line each."""


class BackupLink(Protocol):
    """What a base backup needs of a replication connection."""

    def start_copy_out(self, sql: str) -> list[list[Row]]:
        """Send ``sql``; the rows of each result set before the COPY OUT it starts."""

    def read_copy(self, timeout: float) -> CopyData | CopyDone | None: ...

    def next_result(self) -> Result | None: ...


def receive_backup(link: BackupLink, request: BackupRequest, receipt_for: Callable[
        [list[Row]], Receipt], *, stopping: Callable[[], bool] = lambda: False,
) -> ReceivedBackup:
    """Run BASE_BACKUP on ``link`` and feed its stream to the receipt ``receipt_for`` makes
    from the tablespace rows; the checked backup. The server's refusal or the connection's loss
    is raised as it came, its message starting with "base backup failed"."""
    try:
        results = link.start_copy_out(base_backup_command(request))
        if len(results) != 2:
            raise ProtocolError(f"BASE_BACKUP sent {len(results)} result sets before its COPY "
                                "stream, expected 2")
        start = parse_position(results[0], "start position")
        receipt = receipt_for(results[1])
        while True:
            if stopping():  # looked at between messages too: a throttled stream never pauses
                raise StopRequested("base backup stopped before it was complete")
            payload = link.read_copy(WAIT)
            if payload is COPY_DONE:
                break
            if payload is None:
                continue
            assert not isinstance(payload, CopyDone)
            receipt.receive(payload)
        end = parse_position(_end_rows(link), "end position")
    except ServerError as exc:
        raise type(exc)(f"base backup failed: {exc}", exc.sqlstate) from exc
    except ConnectionLost as exc:
        raise ConnectionLost(f"base backup failed: {exc}") from exc
    return receipt.finish(start, end)


def _end_rows(link: BackupLink) -> list[Row]:
    """The end position's rows, then the command's completion."""
    result = link.next_result()
    done = link.next_result()
    if result is None or result.status is not ResultStatus.TUPLES_OK:
        raise ProtocolError("BASE_BACKUP ended without its end position")
    if done is None or done.status is not ResultStatus.COMMAND_OK:
        raise ProtocolError("BASE_BACKUP ended without its command completion")
    while link.next_result() is not None:
        pass
    return result.rows


def take_backup(link: BackupLink, request: BackupRequest, archive: Path, server: ServerInfo, *,
                compress: CompressSpec = NO_COMPRESSION, sync: bool = True,
                now: Callable[[], datetime] = lambda: datetime.now(UTC),
                stopping: Callable[[], bool] = lambda: False,
                before_commit: Callable[[BackupRecord], None] | None = None,
                on_progress: Callable[[int], None] | None = None) -> BackupRecord:
    """A complete base backup of ``server`` (IDENTIFY_SYSTEM's answer on ``link``) in
    ``archive/backups/<id>/``; its record.

    ``before_commit`` is given the record before it is written: the place to wait until the
    archive holds the WAL the backup needs (:meth:`BackupRecord.wal_segments`), or to raise
    when it does not come (the directory is then removed)."""
    return take_backup_into(
        link, request,
        lambda started: BackupDirectory.create(archive, started, compress, sync=sync,
                                               file_mode=server.file_mode),
        server, now=now, stopping=stopping, before_commit=before_commit,
        on_progress=on_progress)


def take_backup_into(link: BackupLink, request: BackupRequest,
                     open_target: Callable[[datetime], BackupTarget], server: ServerInfo, *,
                     now: Callable[[], datetime] = lambda: datetime.now(UTC),
                     stopping: Callable[[], bool] = lambda: False,
                     before_commit: Callable[[BackupRecord], None] | None = None,
                     on_progress: Callable[[int], None] | None = None,
                     on_started: Callable[[int | None], None] | None = None,
                     say: Callable[[str], None] = lambda _: None) -> BackupRecord:
    """:func:`take_backup` into the target ``open_target`` makes for the start time (a
    directory, a bucket's backup); on any error the target is given up (``say`` is told
    what of it could not be removed). ``on_started`` is told, once the server's checkpoint is
    done and its stream starts, the server's estimate of the backup's size in bytes (with
    ``request.progress``; None without)."""
    started = now()
    directory = open_target(started)

    def receipt_for(rows: list[Row]) -> Receipt:
        tablespaces = parse_tablespaces(rows)
        if on_started is not None:
            sizes = [t.size_kb for t in tablespaces]
            on_started(None if None in sizes else 1024 * sum(s or 0 for s in sizes))
        return Receipt(tablespaces, directory, algorithm=request.checksum,
                       where=f"backup {directory.backup_id}", on_progress=on_progress)

    try:
        received = receive_backup(link, request, receipt_for, stopping=stopping)
        manifest_sha256 = directory.write_manifest(received.manifest_bytes)
        record = backup_record(directory, request, server, received, started=started,
                               ended=now(), manifest_sha256=manifest_sha256)
        if before_commit is not None:
            before_commit(record)
        directory.commit(record)
    except BaseException:
        for line in directory.abort():
            say(line)
        raise
    return record


def backup_record(directory: BackupTarget, request: BackupRequest, server: ServerInfo,
                  received: ReceivedBackup, *, started: datetime, ended: datetime,
                  manifest_sha256: str) -> BackupRecord:
    """The record of a backup received into ``directory``."""
    archives = tuple(dataclasses.replace(stored, tar_bytes=summary.tar_bytes)
                     for stored, summary in zip(directory.stored, received.archives, strict=True))
    return BackupRecord(
        backup_id=directory.backup_id, label=request.label,
        system_identifier=server.system_identifier, server_version=server.version,
        wal_segment_size=server.segment_size, timeline=received.start.timeline,
        start_lsn=received.start.lsn, end_timeline=received.end.timeline,
        end_lsn=received.end.lsn, start_time=started, end_time=ended, archives=archives,
        wal_spans=tuple(WalSpan(r.timeline, r.start, r.end)
                        for r in received.manifest.wal_ranges),
        manifest_name=directory.manifest_name, manifest_sha256=manifest_sha256,
        database_bytes=received.database_bytes,
        encrypted_to=() if directory.recipients is None else directory.recipients.recipients)
