"""The archive directory on disk: the only module that writes, fsyncs and renames files.

A segment being received is ``<name>.partial``, preallocated to the full segment size. When its
last byte arrives it is fsynced, renamed to ``<name>`` and the directory is fsynced, so a file
without the suffix is always complete. History files and the archive's identity file are
written to a temporary name, fsynced, renamed and the directory fsynced.
"""

from __future__ import annotations

import errno
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from receivewal.archive.compression import (
    NO_COMPRESSION,
    Compressor,
    CompressSpec,
    CorruptFile,
    decompressed_size,
    new_compressor,
)
from receivewal.archive.layout import check_continuity, plan_writes, resume_order
from receivewal.archive.syncer import WRITE_BEHIND_BYTES, SegmentSyncer
from receivewal.errors import ArchiveError, DiskFullError
from receivewal.wal.lsn import format_lsn
from receivewal.wal.names import (
    COMPRESSION_SUFFIXES,
    PARTIAL_SUFFIX,
    SegmentFile,
    parse_segment_file_name,
    wal_file_name,
)
from receivewal.wal.pageheader import SIZE_OF_LONG_PHD, parse_long_header

IDENTITY_FILE = ".receivewal-archive.json"
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}


def _os_error(exc: OSError, what: str) -> ArchiveError:
    """Turn an OSError into the project's error, marking a full disk as retryable."""
    if exc.errno in _DISK_FULL:
        return DiskFullError(f"{what}: no space left on device ({exc.strerror})")
    return ArchiveError(f"{what}: {exc.strerror or exc}")


def fsync_path(path: Path) -> None:
    """fsync a file or a directory by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class ArchiveIdentity:
    """Whose WAL an archive holds."""

    system_identifier: str
    segment_size: int
    timeline: int


class Archive:
    """An archive directory: scanning, identity, and durable writes of small files."""

    def __init__(self, directory: Path, *, sync: bool = True, file_mode: int = 0o600) -> None:
        self.directory = directory
        self.sync = sync
        self.file_mode = file_mode

    # -- checks ------------------------------------------------------------------------------
    def check_usable(self) -> None:
        """Raise ArchiveError unless the directory exists and we can create files in it."""
        if not self.directory.exists():
            raise ArchiveError(f'directory "{self.directory}" does not exist')
        if not self.directory.is_dir():
            raise ArchiveError(f'"{self.directory}" is not a directory')
        probe = self.directory / f".receivewal-probe-{os.getpid()}"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.close(fd)
            probe.unlink()
        except OSError as exc:
            raise ArchiveError(
                f'directory "{self.directory}" is not writable: {exc.strerror or exc}'
            ) from exc

    def fsync_directory(self) -> None:
        """Make renames and new entries in the directory durable."""
        if self.sync:
            fsync_path(self.directory)

    # -- scanning ----------------------------------------------------------------------------
    def segment_names(self, segment_size: int) -> list[SegmentFile]:
        """Every segment file in the directory, by name only (nothing is opened)."""
        return [parsed for entry in os.scandir(self.directory)
                if (parsed := parse_segment_file_name(entry.name, segment_size)) is not None
                and entry.is_file()]

    def resume_point(self, segment_size: int) -> tuple[SegmentFile | None, list[str]]:
        """The newest segment file that passes pg_receivewal's checks, and the ones that failed.

        Candidates are checked newest first, so only the files that matter are opened: a
        complete plain file must have exactly the segment size, a complete compressed one must
        decompress (or, for gzip, say in its trailer it decompresses) to exactly that size.
        """
        rejected: list[str] = []
        for parsed in sorted(self.segment_names(segment_size), key=resume_order, reverse=True):
            name = parsed.file_name(segment_size)
            reason = _size_problem(self.directory / name, parsed, segment_size)
            if reason is None:
                return parsed, rejected
            rejected.append(f"{name}: {reason}")
        return None, rejected

    # -- identity ----------------------------------------------------------------------------
    def read_identity(self) -> ArchiveIdentity | None:
        """The recorded identity, None when the archive has none yet."""
        path = self.directory / IDENTITY_FILE
        try:
            data = json.loads(path.read_text())
            return ArchiveIdentity(
                str(data["system_identifier"]), int(data["wal_segment_size"]),
                int(data["timeline"]),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ArchiveError(f'cannot read archive identity file "{path}": {exc}') from exc

    def sniff_system_identifier(self, files: list[SegmentFile], segment_size: int) -> str | None:
        """The system identifier in the long page header of the newest complete plain segment."""
        plain = sorted(f for f in files if not f.partial and not f.compression)
        if not plain:
            return None
        path = self.directory / plain[-1].file_name(segment_size)
        with path.open("rb") as fh:
            header = parse_long_header(fh.read(SIZE_OF_LONG_PHD))
        return None if header is None else str(header.system_identifier)

    def write_identity(self, identity: ArchiveIdentity) -> None:
        """Record whose archive this is (durably)."""
        body = json.dumps({
            "system_identifier": identity.system_identifier,
            "wal_segment_size": identity.segment_size,
            "timeline": identity.timeline,
        }, indent=2).encode() + b"\n"
        self.write_file_durably(IDENTITY_FILE, body)

    # -- small files -------------------------------------------------------------------------
    def write_file_durably(self, name: str, body: bytes) -> None:
        """Write ``name`` through a temporary file, fsync, rename, fsync the directory."""
        final = self.directory / name
        tmp = self.directory / f"{name}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self.file_mode)
            try:
                os.fchmod(fd, self.file_mode)
                os.write(fd, body)
                if self.sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except OSError as exc:
            raise _os_error(exc, f'could not write file "{final}"') from exc
        self.fsync_directory()


def _size_problem(path: Path, parsed: SegmentFile, segment_size: int) -> str | None:
    """Why a complete segment file cannot be trusted as complete, or None."""
    if parsed.partial:
        return None
    size = path.stat().st_size
    if parsed.compression == "":
        return None if size == segment_size else f"has {size} bytes, should be {segment_size}"
    if parsed.compression == "gzip":
        with path.open("rb") as fh:
            if size < 4:
                return "gzip file too short"
            fh.seek(-4, os.SEEK_END)
            (isize,) = struct.unpack("<I", fh.read(4))
        expected = segment_size & 0xFFFFFFFF
        return None if isize == expected else f"gzip trailer says {isize} bytes, should be " \
            f"{segment_size}"
    # LZ4 and zstd frames do not record the size: decompress, as pg_receivewal does for .lz4
    try:
        with path.open("rb") as fh:
            size = decompressed_size(fh, parsed.compression)
    except CorruptFile as exc:
        return str(exc)
    return None if size == segment_size else f"decompresses to {size} bytes, should be " \
        f"{segment_size}"


class SegmentWriter:
    """Writes WAL of one timeline into segment files, one open ``.partial`` at a time.

    ``position`` is the LSN the next byte must have; ``flushed`` is the LSN up to which every
    byte is fsynced (or, with ``sync`` off, written). Bytes are only ever written at
    ``position``: anything else is a gap or an overlap and raises before touching the disk.
    """

    suffix = ""  # compression suffix of the files written

    def __init__(self, archive: Archive, segment_size: int, timeline: int, start_lsn: int) -> None:
        self.archive = archive
        self.segment_size = segment_size
        self.timeline = timeline
        self.position = start_lsn
        self.flushed = start_lsn
        self._fd: int | None = None
        self._segno: int | None = None
        # overlapped durability (archive/syncer.py): fsync + rename in the background
        self.syncer = SegmentSyncer(start_lsn) if archive.sync else None
        self._behind = 0  # offset in the open segment up to which writeback was started

    @property
    def open_segment_name(self) -> str | None:
        """WAL file name of the segment currently open, if any."""
        if self._segno is None:
            return None
        return wal_file_name(self.timeline, self._segno, self.segment_size)

    def write(self, lsn: int, data: bytes | memoryview) -> list[str]:
        """Append WAL at ``lsn``; return the names of segments this write completed."""
        check_continuity(self.position, lsn)
        if self.syncer is not None:
            self.syncer.check()
        completed: list[str] = []
        view = memoryview(data)
        for plan in plan_writes(lsn, len(view), self.segment_size):
            fd = self._open(plan.segno)
            chunk = view[plan.data_offset : plan.data_offset + plan.length]
            self._pwrite(fd, chunk, plan.offset)
            self.position += plan.length
            if plan.offset + plan.length == self.segment_size:
                completed.append(self._complete())
        return completed

    def flush(self, wait: bool = False) -> int:
        """fsync the open segment; return the new flushed position.

        While a completed segment is still being fsynced in the background, the flushed
        position is what the syncer has finished: the receiving goes on (unless ``wait``).
        """
        if self.syncer is not None:
            if self.syncer.completing and not wait:
                self.syncer.check()
                self.flushed = max(self.flushed, self.syncer.synced)
                return self.flushed
            self.syncer.drain()
        if self._fd is not None and self.archive.sync and self.flushed < self.position:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise _os_error(exc, f'could not fsync file "{self._partial_path()}"') from exc
        self.flushed = self.position
        return self.flushed

    def close(self) -> None:
        """fsync and close the open segment, leaving it as ``.partial``."""
        try:
            if self._fd is not None:
                try:
                    self.flush(wait=True)
                finally:
                    os.close(self._fd)
                    self._fd = None
                    self._segno = None
        finally:
            if self.syncer is not None:
                self.syncer.close()  # stop its thread, even after a failure

    # -- internals ---------------------------------------------------------------------------
    def _partial_path(self) -> Path:
        assert self._segno is not None
        name = wal_file_name(self.timeline, self._segno, self.segment_size)
        return self.archive.directory / (name + self.suffix + PARTIAL_SUFFIX)

    def _open(self, segno: int) -> int:
        if self._fd is not None and self._segno == segno:
            return self._fd
        if self._fd is not None:
            raise ArchiveError(
                f"internal error: segment {self.open_segment_name} still open at "
                f"{format_lsn(self.position)}"
            )
        name = wal_file_name(self.timeline, segno, self.segment_size)
        path = self.archive.directory / (name + self.suffix + PARTIAL_SUFFIX)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, self.archive.file_mode)
        except OSError as exc:
            raise _os_error(exc, f'could not open file "{path}"') from exc
        try:
            self._prepare(fd, path)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._segno = fd, segno
        return fd

    def _prepare(self, fd: int, path: Path) -> None:
        """Check a reopened ``.partial``, or preallocate a new one to the full segment size."""
        size = os.fstat(fd).st_size
        if size == self.segment_size:
            return
        if size != 0:
            raise ArchiveError(
                f'file "{path}" has {size} bytes, should be 0 or {self.segment_size}'
            )
        try:
            os.fchmod(fd, self.archive.file_mode)
            os.posix_fallocate(fd, 0, self.segment_size)
            if self.syncer is not None:
                self.syncer.submit(self.position, lambda: self._fsync_new(fd, path))
                self._behind = 0
            elif self.archive.sync:
                os.fsync(fd)
                self.archive.fsync_directory()
        except OSError as exc:
            path.unlink(missing_ok=True)  # never leave a short .partial behind
            raise _os_error(exc, f'could not preallocate file "{path}"') from exc

    def _pwrite(self, fd: int, chunk: memoryview, offset: int) -> None:
        done = 0
        try:
            while done < len(chunk):
                done += os.pwrite(fd, chunk[done:], offset + done)
            end = offset + done
            if self.syncer is not None and end - self._behind >= WRITE_BEHIND_BYTES:
                self.syncer.write_behind(fd, self._behind, end - self._behind)
                self._behind = end
        except OSError as exc:
            raise _os_error(
                exc,
                f'could not write {len(chunk)} bytes at {format_lsn(self.position)} '
                f'to "{self._partial_path()}"',
            ) from exc

    def _complete(self) -> str:
        """fsync, close and rename the open segment; fsync the directory. With a syncer,
        this is handed to its thread and ``flushed`` moves once it is done."""
        assert self._fd is not None
        assert self._segno is not None
        partial = self._partial_path()
        name = wal_file_name(self.timeline, self._segno, self.segment_size) + self.suffix
        fd, self._fd, self._segno = self._fd, None, None
        if self.syncer is not None:
            self.syncer.submit(self.position, lambda: self._finish_file(fd, partial, name),
                               segment=name)
            return name
        self._finish_file(fd, partial, name)
        self.flushed = self.position
        return name

    def _finish_file(self, fd: int, partial: Path, name: str) -> None:
        try:
            if self.archive.sync:
                os.fsync(fd)
            os.close(fd)
            os.replace(partial, self.archive.directory / name)
        except OSError as exc:
            raise _os_error(exc, f'could not complete segment "{name}"') from exc
        self.archive.fsync_directory()
        self._drop_superseded_partials(partial)

    def _fsync_new(self, fd: int, path: Path) -> None:
        """Make a new preallocated ``.partial`` and its directory entry durable."""
        try:
            os.fsync(fd)
        except OSError as exc:
            raise _os_error(exc, f'could not fsync file "{path}"') from exc
        self.archive.fsync_directory()

    def _drop_superseded_partials(self, completed: Path) -> None:
        """Remove ``.partial`` files of the segment just completed left in another form (a
        run with another -Z method): the complete file supersedes them."""
        wal = completed.name[:24]
        removed = False
        for suffix in COMPRESSION_SUFFIXES.values():
            stale = self.archive.directory / (wal + suffix + PARTIAL_SUFFIX)
            if stale != completed and stale.exists():
                try:
                    stale.unlink()
                except OSError as exc:
                    raise _os_error(exc, f'could not remove superseded file "{stale}"') from exc
                removed = True
        if removed:
            self.archive.fsync_directory()


class CompressedSegmentWriter(SegmentWriter):
    """Writes ``<name>.gz``, ``.lz4`` or ``.zst`` files, each ``.partial`` until complete.

    As pg_receivewal does, a compressed file is not preallocated and cannot be appended to:
    it is always written from its segment's first byte (a restart restreams the segment and
    truncates the old ``.partial``). Before the flush position moves, the compressor's pending
    output is flushed (a sync flush that keeps the stream open) and the file fsynced, so a
    crash leaves a ``.partial`` that decodes up to the flushed position.
    """

    def __init__(self, archive: Archive, segment_size: int, timeline: int, start_lsn: int,
                 compress: CompressSpec) -> None:
        super().__init__(archive, segment_size, timeline, start_lsn)
        self.compress = compress
        self.suffix = COMPRESSION_SUFFIXES[compress.method]
        self._compressor: Compressor | None = None

    def flush(self, wait: bool = False) -> int:
        """Flush the compressor's pending output, fsync; return the new flushed position."""
        if self._fd is not None and self._compressor is not None \
                and self.flushed < self.position:
            self._append(self._compressor.flush())
        return super().flush(wait)

    def close(self) -> None:
        """End the compressed stream and close, leaving the file as ``.partial``."""
        if self._fd is not None and self._compressor is not None:
            self._append(self._compressor.finish())
            self._compressor = None
        super().close()

    def _prepare(self, fd: int, path: Path) -> None:
        """Start (or truncate and restart) a compressed file at its segment's first byte."""
        offset = self.position % self.segment_size
        if offset != 0:
            raise ArchiveError(
                f'cannot append to compressed file "{path}" at {format_lsn(self.position)}: '
                "a compressed segment is written from its start"
            )
        compressor = new_compressor(self.compress)
        try:
            os.ftruncate(fd, 0)
            os.fchmod(fd, self.archive.file_mode)
            _write_all(fd, compressor.begin())
            if self.archive.sync:
                os.fsync(fd)
                self.archive.fsync_directory()
        except OSError as exc:
            raise _os_error(exc, f'could not start file "{path}"') from exc
        self._compressor = compressor

    def _pwrite(self, fd: int, chunk: memoryview, offset: int) -> None:
        assert self._compressor is not None
        self._append(self._compressor.compress(chunk))

    def _complete(self) -> str:
        assert self._compressor is not None
        self._append(self._compressor.finish())
        self._compressor = None
        return super()._complete()

    def _append(self, data: bytes) -> None:
        assert self._fd is not None
        try:
            _write_all(self._fd, data)
        except OSError as exc:
            raise _os_error(exc, f'could not write to "{self._partial_path()}" at '
                            f"{format_lsn(self.position)}") from exc


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def open_segment_writer(archive: Archive, segment_size: int, timeline: int, start_lsn: int,
                        compress: CompressSpec = NO_COMPRESSION) -> SegmentWriter:
    """A writer for plain segments, or for compressed ones when ``compress`` names a method."""
    if compress.method:
        return CompressedSegmentWriter(archive, segment_size, timeline, start_lsn, compress)
    return SegmentWriter(archive, segment_size, timeline, start_lsn)
