"""Where an archive's backups are: ``ARCHIVE/backups/`` of a directory, or
``s3://BUCKET/PREFIX/backups/`` (files opened, objects listed and read).

:func:`open_place` gives what ``backup``, ``recover`` and ``verify`` need of either, by the
same names: the archive's identity, its WAL files (which segments it holds, its timeline
histories), the catalog of its backups, one backup's files, and a new backup's target.

In a bucket, a backup is complete once its record object is there and the listing of its
prefix shows every object the record names, of its size
(:func:`~receivewal.backup.catalog.proven`); one without a record is reported
as :attr:`~receivewal.backup.catalog.EntryState.UNKNOWN` (no lock tells a running upload from
a dead one).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from receivewal.archive.compression import CompressSpec
from receivewal.archive.identity import ArchiveIdentity
from receivewal.archive.location import is_bucket_url
from receivewal.archive.reading import HISTORY_FILE_CAP
from receivewal.archive.recipients import RecipientSet
from receivewal.archive.sources import ArchiveSource, list_source, read_capped, recorded_identity
from receivewal.backup.catalog import (
    BackupEntry,
    EntryState,
    proven,
    read_catalog,
    unrecorded_in_bucket,
)
from receivewal.backup.directory import BACKUPS, BackupDirectory
from receivewal.backup.record import RECORD_CAP, RECORD_NAME, record_from_json
from receivewal.backup.stored import BackupFiles, DirectoryFiles
from receivewal.backup.transfer import BackupTarget
from receivewal.errors import ArchiveError, ObjectNotFound, StoreError
from receivewal.wal.names import (
    ENCRYPTED_SUFFIX,
    AtRest,
    parse_encrypted_segment_name,
    parse_history_file_name,
    parse_segment_file_name,
)
from receivewal.wal.timeline import TimelineSwitch, parse_history

if TYPE_CHECKING:
    from receivewal.archive.bucket import Bucket


def held_segments(names: Iterable[str], segment_size: int) -> set[str]:
    """The WAL file names of the segments ``names`` hold complete (plain, compressed or
    encrypted; never a ``.partial``)."""
    held = set()
    for name in names:
        segment = parse_segment_file_name(name, segment_size) \
            or parse_encrypted_segment_name(name, segment_size)
        if segment is not None and not segment.partial:
            held.add(segment.wal_name(segment_size))
    return held


def segment_forms(wal_name: str) -> list[str]:
    """The file names a complete segment may have in an archive."""
    plain = [wal_name + fmt.suffix for fmt in AtRest]
    return plain + [name + ENCRYPTED_SUFFIX for name in plain]


class BackupPlace(ABC):
    """An archive's WAL files and backups (the directory's or the bucket's: see the two
    subclasses)."""

    poll = 1.0  # seconds between looks for a segment the archive does not hold yet

    def __init__(self, archive: str) -> None:
        self.archive = archive
        self._source: ArchiveSource | None = None

    def source(self) -> ArchiveSource:
        """The archive's WAL files, listed once."""
        if self._source is None:
            self._source = list_source(self.archive)
        return self._source

    def identity(self) -> ArchiveIdentity | None:
        """The archive's identity record; None when it has none."""
        source = self.source()
        return recorded_identity(source.base, source.names, source.open_binary)

    def histories(self) -> dict[int, list[TimelineSwitch]]:
        """The archive's timeline history files, parsed, by timeline."""
        source = self.source()
        found = {}
        for name in source.names:
            timeline = parse_history_file_name(name)
            if timeline is None:
                continue
            try:
                text = read_capped(source.path(name), HISTORY_FILE_CAP,
                                   source.open_binary).decode()
            except (OSError, UnicodeDecodeError) as exc:
                raise ArchiveError(f'could not read history file "{source.path(name)}": '
                                   f"{exc}") from exc
            found[timeline] = parse_history(text, timeline)
        return found

    def held(self, segment_size: int) -> set[str]:
        """The segments the archive holds complete, as last listed."""
        return held_segments(self.source().names, segment_size)

    @abstractmethod
    def holds_segment(self, wal_name: str) -> bool:
        """Whether the archive holds the segment ``wal_name`` complete now."""

    @abstractmethod
    def catalog(self) -> list[BackupEntry]:
        """The archive's backups, by ID."""

    @abstractmethod
    def files(self, backup_id: str) -> BackupFiles:
        """The files of one backup."""

    @abstractmethod
    def backup_where(self, backup_id: str) -> str:
        """A backup's place, for messages."""

    @abstractmethod
    def new_backup(self, started: datetime, compress: CompressSpec, *, sync: bool,
                   file_mode: int, recipients: RecipientSet | None = None) -> BackupTarget:
        """A new backup's target, named for its start (its files sealed to ``recipients``
        when given)."""

    @abstractmethod
    def adopt_recipients(self, recipients: RecipientSet, *, sync: bool, file_mode: int,
                         ) -> None:
        """List ``recipients`` in the archive's identity record before a backup is sealed
        to them (``--encrypt-to``)."""


class DirectoryPlace(BackupPlace):
    """A local archive directory."""

    poll = 0.1  # seconds between looks for a segment: a few stats

    def __init__(self, archive: str) -> None:
        super().__init__(archive)
        self.path = Path(archive)

    def holds_segment(self, wal_name: str) -> bool:
        return any(os.path.isfile(self.path / name) for name in segment_forms(wal_name))

    def catalog(self) -> list[BackupEntry]:
        return read_catalog(self.path)

    def files(self, backup_id: str) -> BackupFiles:
        return DirectoryFiles(self.path / BACKUPS / backup_id)

    def backup_where(self, backup_id: str) -> str:
        return str(self.path / BACKUPS / backup_id)

    def new_backup(self, started: datetime, compress: CompressSpec, *, sync: bool,
                   file_mode: int, recipients: RecipientSet | None = None) -> BackupTarget:
        return BackupDirectory.create(self.path, started, compress, sync=sync,
                                      file_mode=file_mode, recipients=recipients)

    def adopt_recipients(self, recipients: RecipientSet, *, sync: bool, file_mode: int,
                         ) -> None:
        from receivewal.archive.directory import Archive  # noqa: PLC0415

        Archive(self.path, sync=sync, file_mode=file_mode).adopt_recipients(recipients)


@dataclass(frozen=True)
class BucketFiles:
    """The objects of one backup in a bucket."""

    bucket: Bucket
    backup_id: str

    def key(self, name: str) -> str:
        return f"{BACKUPS}/{self.backup_id}/{name}"

    def where(self, name: str) -> str:
        return self.bucket.url.url(self.key(name))

    def open(self, name: str) -> BinaryIO:
        return self.bucket.open_object(self.key(name))  # type: ignore[return-value]

    def read_small(self, name: str, cap: int) -> bytes:
        return self.bucket.get_bytes(self.key(name), cap)


class BucketPlace(BackupPlace):
    """An archive at ``s3://BUCKET/PREFIX``."""

    poll = 1.0  # seconds between looks for a segment: a HEAD per form

    def __init__(self, archive: str) -> None:
        super().__init__(archive)
        from receivewal.archive.bucket import Bucket  # noqa: PLC0415 - boto3 only if used

        self.bucket = Bucket.connect(archive)

    def holds_segment(self, wal_name: str) -> bool:
        for name in segment_forms(wal_name):
            try:
                self.bucket.head(name)
            except ObjectNotFound:
                continue
            return True
        return False

    def catalog(self) -> list[BackupEntry]:
        by_id: dict[str, dict[str, int]] = {}
        for name, size in self.bucket.list_under(BACKUPS):
            backup_id, _, rest = name.removeprefix(f"{BACKUPS}/").partition("/")
            if rest and not backup_id.startswith("."):
                by_id.setdefault(backup_id, {})[rest] = size
        return [proven(self._entry(backup_id, names), names)
                for backup_id, names in sorted(by_id.items())]

    def _entry(self, backup_id: str, names: dict[str, int]) -> BackupEntry:
        if RECORD_NAME not in names:
            return unrecorded_in_bucket(backup_id)
        files = BucketFiles(self.bucket, backup_id)
        where = files.where(RECORD_NAME)
        try:
            record = record_from_json(files.read_small(RECORD_NAME, RECORD_CAP), where)
        except (ArchiveError, StoreError) as exc:
            return BackupEntry(backup_id, EntryState.DAMAGED, problem=str(exc))
        if record.backup_id != backup_id:
            return BackupEntry(backup_id, EntryState.DAMAGED,
                               problem=f"{where} names backup {record.backup_id}")
        return BackupEntry(backup_id, EntryState.COMPLETE, record)

    def files(self, backup_id: str) -> BackupFiles:
        return BucketFiles(self.bucket, backup_id)

    def backup_where(self, backup_id: str) -> str:
        return self.bucket.url.url(f"{BACKUPS}/{backup_id}")

    def new_backup(self, started: datetime, compress: CompressSpec, *, sync: bool,
                   file_mode: int, recipients: RecipientSet | None = None) -> BackupTarget:
        from receivewal.backup.upload import BucketBackup  # noqa: PLC0415

        return BucketBackup.create(self.bucket, started, compress, recipients)

    def adopt_recipients(self, recipients: RecipientSet, *, sync: bool, file_mode: int,
                         ) -> None:
        """The identity object is create-only (``stream --upload-to`` writes it, with the
        sets it knew): it is not rewritten; the backup's record and recipients objects say
        to whom its files are sealed."""


def open_place(archive: str) -> BackupPlace:
    """The archive ``archive`` names: a directory (which must exist) or s3://BUCKET/PREFIX."""
    if is_bucket_url(archive):
        return BucketPlace(archive)
    if not Path(archive).is_dir():
        raise ArchiveError(f"{archive} is not a directory")
    return DirectoryPlace(archive)

