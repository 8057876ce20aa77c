"""A base backup as it arrives: the COPY stream's messages, each tar's members and
their checksums, the manifest, all checked before the backup is declared received (pure).

:class:`Receipt` is fed BASE_BACKUP's CopyData payloads. Each tar's bytes go, as they came,
to a :class:`BackupSink` (the backup directory writes them) and, decompressed when the server
compressed them, through a :class:`~receivewal.backup.tar.TarReader`: every file's size and
digest are taken on the way (:class:`~receivewal.backup.manifest.ManifestCheck`). The manifest
comes last in the stream, so the comparison happens at :meth:`Receipt.finish`: every file the
manifest lists received exactly once, with its size and checksum, nothing else, and the WAL
range it names that of the result sets. Memory: one digest per file and the manifest.

A file of a tablespace's tar is named in the manifest ``pg_tblspc/<oid>/<member>``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from receivewal.archive.inflate import Inflater, compression_of
from receivewal.backup.backupstream import (
    BackupData,
    BackupStream,
    BackupStreamError,
    ManifestStart,
    NewArchive,
    Part,
)
from receivewal.backup.command import Position, Tablespace
from receivewal.backup.manifest import (
    MANIFEST_CAP,
    Manifest,
    ManifestCheck,
    ManifestError,
    parse_manifest,
)
from receivewal.backup.tar import MemberEnd, MemberKind, TarReader
from receivewal.wal.lsn import format_lsn


@dataclass(frozen=True)
class ArchiveInfo:
    """One tar of the backup: the server's name for it (``base.tar``, ``16385.tar.zst``),
    its tablespace (None and "" for the main data directory) and the server's compression."""

    name: str
    tablespace_oid: int | None
    location: str
    compression: str  # "", "gzip", "lz4" or "zstd"

    def manifest_path(self, member: str) -> str:
        """How the manifest names a member of this tar."""
        if self.tablespace_oid is None:
            return member
        return f"pg_tblspc/{self.tablespace_oid}/{member}"


@dataclass(frozen=True)
class ArchiveSummary:
    """What one tar held: bytes as sent, tar bytes, files."""

    info: ArchiveInfo
    sent_bytes: int
    tar_bytes: int
    files: int


@dataclass(frozen=True)
class ReceivedBackup:
    """A base backup received whole and checked against its manifest."""

    start: Position
    end: Position
    archives: tuple[ArchiveSummary, ...]
    manifest: Manifest
    manifest_bytes: bytes

    @property
    def database_bytes(self) -> int:
        """The size of the files the manifest lists."""
        return sum(entry.size for entry in self.manifest.files.values())


class BackupSink(Protocol):
    """Where the tars' bytes go as they arrive, in order."""

    def begin_archive(self, archive: ArchiveInfo) -> None: ...

    def archive_bytes(self, data: memoryview) -> None: ...

    def end_archive(self) -> None: ...


class _Current:
    """The tar being received."""

    def __init__(self, info: ArchiveInfo) -> None:
        self.info = info
        self.tar = TarReader(info.name)
        self.inflater = Inflater(info.compression, info.name) if info.compression else None
        self.sent = self.files = 0


class Receipt:
    """BASE_BACKUP's COPY stream fed in, checked (see the module's docstring)."""

    def __init__(self, tablespaces: list[Tablespace], sink: BackupSink, *, algorithm: str,
                 where: str = "base backup",
                 on_progress: Callable[[int], None] | None = None) -> None:
        self.tablespaces = tablespaces
        self.sink = sink
        self.check = ManifestCheck(algorithm, where)
        self.stream = BackupStream()
        self.on_progress = on_progress
        self.summaries: list[ArchiveSummary] = []
        self._current: _Current | None = None
        self._manifest = bytearray()

    def receive(self, payload: bytes | memoryview) -> None:
        """One CopyData payload."""
        data = self.stream.archive_data(payload)
        if data is not None:
            self._sent_bytes(data)
            return
        message = self.stream.read(payload)
        if isinstance(message, BackupData):
            if self.stream.part is Part.MANIFEST:
                if len(self._manifest) + len(message.data) > MANIFEST_CAP:
                    raise ManifestError(f"the manifest is larger than {MANIFEST_CAP} bytes")
                self._manifest += message.data
            else:
                self._sent_bytes(message.data)
        elif isinstance(message, NewArchive):
            self._end_tar()
            self._begin_tar(message)
        elif isinstance(message, ManifestStart):
            self._end_tar()
        elif self.on_progress is not None:
            self.on_progress(message.done)

    def finish(self, start: Position, end: Position) -> ReceivedBackup:
        """The COPY stream ended and the server reported the end position: compare what came
        with the manifest."""
        self.stream.finish(manifest=True)
        sent = {summary.info.tablespace_oid for summary in self.summaries}
        missing = [t.oid for t in self.tablespaces if t.oid not in sent]
        if missing:
            raise BackupStreamError(f"the base backup stream held no archive for tablespace "
                                    f"{missing[0] or 'pg_default'}")
        data = bytes(self._manifest)
        manifest = parse_manifest(data, "the manifest of the base backup")
        self.check.compare(manifest)
        first, last = manifest.wal_ranges[0], manifest.wal_ranges[-1]
        if (first.timeline, first.start, last.timeline, last.end) != \
                (start.timeline, start.lsn, end.timeline, end.lsn):
            raise ManifestError(
                f"the manifest's WAL ranges ({format_lsn(first.start)} on timeline "
                f"{first.timeline} to {format_lsn(last.end)} on timeline {last.timeline}) are "
                f"not the backup's ({format_lsn(start.lsn)} on timeline {start.timeline} to "
                f"{format_lsn(end.lsn)} on timeline {end.timeline})")
        return ReceivedBackup(start, end, tuple(self.summaries), manifest, data)

    # -- tars --------------------------------------------------------------------------------
    def _begin_tar(self, message: NewArchive) -> None:
        stem = message.name.split(".", 1)[0]
        if message.location:
            match = [t for t in self.tablespaces if t.location == message.location]
            if not match or str(match[0].oid) != stem:
                raise BackupStreamError(f"archive {message.name} is for a tablespace at "
                                        f"{message.location!r} that the server did not list")
            oid = match[0].oid
        elif stem != "base":
            raise BackupStreamError(f"archive {message.name} has no tablespace location")
        else:
            oid = None
        info = ArchiveInfo(message.name, oid, message.location, compression_of(message.name))
        self._current = _Current(info)
        self.sink.begin_archive(info)

    def _sent_bytes(self, data: memoryview) -> None:
        current = self._current
        assert current is not None  # BackupStream refuses data before a tar
        self.sink.archive_bytes(data)
        current.sent += len(data)
        if current.inflater is None:
            self._tar_bytes(current, data)
        else:
            for piece in current.inflater.feed(data):
                self._tar_bytes(current, memoryview(piece))

    def _tar_bytes(self, current: _Current, data: memoryview) -> None:
        if current.tar.take_data(data):
            self.check.member_data(data)
            return
        for event in current.tar.feed(data):
            self.check.follow(event, current.info.manifest_path)
            if isinstance(event, MemberEnd) and event.member.kind is MemberKind.FILE:
                current.files += 1

    def _end_tar(self) -> None:
        current, self._current = self._current, None
        if current is None:
            return
        if current.inflater is not None:
            current.inflater.close()
        current.tar.close()
        self.sink.end_archive()
        self.summaries.append(ArchiveSummary(current.info, current.sent, current.tar.offset,
                                             current.files))

