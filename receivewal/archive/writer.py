"""Segment writers: received WAL into ``.partial`` files, completed by an atomic rename.

A plain segment being received is ``<name>.partial``, preallocated to the full segment size
under a temporary name and renamed to ``.partial`` only once complete and fsynced, so a crash
never leaves a ``.partial`` of the wrong size. When its last byte arrives it is fsynced, renamed
to ``<name>`` and the directory fsynced: a file without the suffix is always complete.

A compressed segment is written from its first byte into a temporary file; it replaces the
``.partial`` a previous run left only once it holds at least as much WAL, fsynced. Old WAL is
never removed before it is durable again. A ``.partial`` a previous run left in another form
(another ``-Z`` method) was converted to this one at start-up
(:func:`~receivewal.archive.partials.settle_partials`), so a method change keeps its WAL.
Nothing is ever opened through a symbolic link.

A writer's segments are in one :class:`~receivewal.archive.storedform.StoredForm` (``-Z``'s
compression and ``--encrypt-to``'s recipients, :attr:`SegmentWriter.form`): a ``.partial`` is
the form's compression alone, written through the form's writer, and a completed segment
gets the form's name, sealed once it is checked (the name then carries the fingerprint of its
recipient set, which the identity record lists: one file, no recipients file beside it). The
two writers differ in how a ``.partial`` is written, not in what is stored: in place,
preallocated, for a plain one; as a stream from its first byte for a compressed one.

The file primitives they use (preallocation, opening without following links, the crash
tests' kill points) are in :mod:`receivewal.archive.files`.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path

from receivewal.archive.compression import NO_COMPRESSION, CompressSpec
from receivewal.archive.directory import Archive, os_error
from receivewal.archive.durable import create_temporary, finish_file, sync_file, write_all
from receivewal.archive.files import (
    CRASH_ENV,
    PREALLOCATE_ENV,
    crash_point,
    held_wal,
    open_for_writing,
    preallocate,
)
from receivewal.archive.layout import check_continuity, plan_writes, take_range
from receivewal.archive.sealed import Sealing, seal_stream, sealed_input
from receivewal.archive.storedform import FormWriter, StoredForm
from receivewal.archive.syncer import WRITE_BEHIND_BYTES, SegmentSyncer
from receivewal.errors import ArchiveError, ArchiveNotDurable
from receivewal.wal.lsn import format_lsn
from receivewal.wal.names import (
    COMPRESSION_SUFFIXES,
    PARTIAL_SUFFIX,
    encrypted_file_name,
    wal_file_name,
)


class SegmentWriter:
    """Writes WAL of one timeline into segment files, one open ``.partial`` at a time.

    ``position`` is the LSN the next byte must have; ``flushed`` is the LSN up to which every
    byte is fsynced (or, with ``sync`` off, written): the one holder of the flushed position,
    moved on the caller's thread only, by :meth:`flush`, :meth:`completed` and :meth:`close`,
    to what the syncer's worker says it finished. Bytes are only ever written at
    ``position``: anything else is a gap or an overlap and raises before touching the disk.
    A segment counts as completed once it is durable under its final name (:meth:`completed`),
    as pg_receivewal's "finished segment" comes after the file's close.

    ``kept`` is the LSN up to which the last run made this timeline's WAL durable: a plain
    ``.partial`` keeps its bytes while it is restreamed (the same bytes are written over
    them), so :attr:`durable`, the WAL durable in the archive, does not go back below it while
    ``flushed``, what this writer made durable and a status update reports, starts again at
    the start. A compressed ``.partial`` is rewritten from its first byte: it keeps nothing.
    """

    def __init__(self, archive: Archive, segment_size: int, timeline: int, start_lsn: int, *,
                 kept: int = 0, stopping: Callable[[], bool] | None = None,
                 sealing: Sealing | None = None, compress: CompressSpec = NO_COMPRESSION,
                 ) -> None:
        self.archive = archive
        self.sealing = sealing  # --encrypt-to: each segment sealed when it is completed
        #: the completed segment's stored form; a .partial is its compression alone
        self.form = StoredForm(compress, None if sealing is None else sealing.recipients)
        self.segment_size = segment_size
        self.timeline = timeline
        self.position = start_lsn
        self._flushed = start_lsn
        self._kept = kept
        self._completed: list[tuple[str, int]] = []  # durable, not yet taken by completed()
        self._fd: int | None = None
        self._segno: int | None = None
        self._path: Path | None = None  # the file open now (a temporary name until promoted)
        self._crash = os.environ.get(CRASH_ENV)
        self._zeros = os.environ.get(PREALLOCATE_ENV) == "zeros"
        # overlapped durability (archive/syncer.py): a completed segment is fsynced and renamed
        # in the background while the next one is received
        self.syncer = SegmentSyncer(stopping) if archive.sync else None
        self._behind = 0  # offset in the open segment up to which writeback was started

    @property
    def suffix(self) -> str:
        """The compression suffix of the files written."""
        return self.form.compression().suffix

    @property
    def flushed(self) -> int:
        """The LSN up to which every byte written is durable: what may be reported flushed."""
        return self._flushed

    @property
    def durable(self) -> int:
        """The LSN up to which this timeline's WAL is durable in the archive: :attr:`flushed`,
        or what the plain ``.partial`` restreamed kept from the last run (``kept``)."""
        return max(self._flushed, self._kept)

    @property
    def open_segment_name(self) -> str | None:
        """WAL file name of the segment currently open, if any."""
        if self._segno is None:
            return None
        return wal_file_name(self.timeline, self._segno, self.segment_size)

    def write(self, lsn: int, data: bytes | memoryview | list[memoryview]) -> None:
        """Append WAL at ``lsn``, one buffer or pieces that follow on (written with one
        ``pwritev`` per segment); a segment whose last byte it writes is completed (in the
        background with a syncer: :meth:`completed` says when it is done)."""
        check_continuity(self.position, lsn)
        if self.syncer is not None:
            self.syncer.check()
        pieces = data if isinstance(data, list) else [memoryview(data)]
        for plan in plan_writes(lsn, sum(map(len, pieces)), self.segment_size):
            fd = self._open(plan.segno)
            self._pwrite(fd, take_range(pieces, plan.data_offset, plan.length), plan.offset)
            self.position += plan.length
            if plan.offset + plan.length == self.segment_size:
                self._complete()

    def completed(self) -> list[tuple[str, int]]:
        """The segments completed since the last call: fsynced, renamed to their final name
        and the directory fsynced, each with the LSN it ends at, in order. The flushed
        position moves to what is durable."""
        self._catch_up()
        completed, self._completed = self._completed, []
        return completed

    def flush(self, wait: bool = False) -> int:
        """fsync the open segment; return the new flushed position.

        While a completed segment is still being fsynced in the background, the flushed
        position is what the syncer has finished, and receiving goes on (unless ``wait``);
        so it is after a stop signal that the disk outlasted (the syncer's bound).
        """
        if self.syncer is not None:
            if self.syncer.completing and not wait:
                self.syncer.check()
                self._catch_up()
                return self._flushed
            drained = self.syncer.drain()
            self._catch_up()
            if not drained:
                return self._flushed
        if self._fd is not None and self._flushed < self.position:
            if self.archive.sync:
                try:
                    sync_file(self._fd)
                except OSError as exc:
                    raise os_error(exc, f'could not fsync file "{self._path}"') from exc
            self._synced()
        self._flushed = self.position
        return self._flushed

    def close(self) -> None:
        """fsync and close the open segment, leaving it as ``.partial``; finish the syncer's
        queue (completed segments renamed) and stop its thread, even after a failure.

        After a stop signal that the disk outlasted, the syncer's jobs are left to end with the
        process (the open descriptor too, which one of them may still use), and
        ArchiveNotDurable says from which LSN on the WAL is not durable."""
        try:
            if self._fd is not None:
                try:
                    self.flush(wait=True)
                finally:
                    if self.syncer is None or not self.syncer.busy:
                        os.close(self._fd)
                    self._fd = None
                    self._segno = None
        finally:
            if self.syncer is not None:
                self.syncer.close()
                self._catch_up()
        if self._flushed < self.position:
            bound = "" if self.syncer is None else f" within {self.syncer.stop_bound:g} s"
            raise ArchiveNotDurable(
                f"stopped with the WAL from {format_lsn(self._flushed)} to "
                f"{format_lsn(self.position)} on timeline {self.timeline} not durable: the "
                f"disk did not finish its fsync{bound} of the stop signal; that WAL was never "
                "reported as flushed, and the next start streams it again")

    # -- internals ---------------------------------------------------------------------------
    def _partial_path(self, segno: int) -> Path:
        name = wal_file_name(self.timeline, segno, self.segment_size)
        return self.archive.directory / (name + self.suffix + PARTIAL_SUFFIX)

    def _catch_up(self) -> None:
        """Take what the syncer's worker finished: the flushed position moves there, and the
        segments it completed wait for :meth:`completed`."""
        if self.syncer is not None:
            through, completed = self.syncer.finished()
            self._flushed = max(self._flushed, through)
            self._completed += completed

    def _synced(self) -> None:
        """Called once the open file's bytes up to ``position`` are durable."""

    def _open(self, segno: int) -> int:
        if self._fd is not None and self._segno == segno:
            return self._fd
        if self._fd is not None:
            raise ArchiveError(
                f"internal error: segment {self.open_segment_name} still open at "
                f"{format_lsn(self.position)}"
            )
        fd, self._path = self._start_file(self._partial_path(segno))
        self._fd, self._segno, self._behind = fd, segno, 0
        return fd

    def _start_file(self, path: Path) -> tuple[int, Path]:
        """Reopen a ``.partial`` of the full size, or create one preallocated."""
        fd = open_for_writing(path)
        if fd is None:
            return self._create_preallocated(path), path
        size = os.fstat(fd).st_size
        if size != self.segment_size:
            os.close(fd)
            raise ArchiveError(
                f'file "{path}" has {size} bytes, should be 0 or {self.segment_size}'
            )
        return fd, path

    def _create_temporary(self, path: Path) -> tuple[int, Path]:
        """A new empty file under ``path``'s temporary name (a leftover of this process is
        replaced), never through a symbolic link; return its descriptor and path."""
        try:
            return create_temporary(path, self.archive.file_mode, replace_own=True)
        except OSError as exc:
            raise os_error(exc, f'could not create a temporary file for "{path}"') from exc

    def _create_preallocated(self, path: Path) -> int:
        """Preallocate under a temporary name; rename to ``.partial`` once complete, fsynced."""
        fd, tmp = self._create_temporary(path)
        try:
            preallocate(fd, self.segment_size, zeros=self._zeros, crash=self._crash)
            if self.syncer is not None:
                # fsync and rename in the background, in order with the completions: nothing in
                # this segment is reported flushed before its .partial is durable (a crash
                # before that leaves only the temporary file, removed at the next start)
                self.syncer.submit(self.position, lambda: self._promote(fd, tmp, path))
                return fd
            finish_file(tmp, path, fd=fd, sync=self.archive.sync)
        except OSError as exc:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise os_error(exc, f'could not preallocate file "{path}"') from exc
        return fd

    def _promote(self, fd: int, tmp: Path, path: Path) -> None:
        """The syncer's job for a new segment: make the preallocated file durable, then give it
        its ``.partial`` name and make that durable."""
        try:
            finish_file(tmp, path, fd=fd)
        except OSError as exc:
            raise os_error(exc, f'could not preallocate file "{path}"') from exc

    def _pwrite(self, fd: int, pieces: list[memoryview], offset: int) -> None:
        size = sum(map(len, pieces))
        done = 0
        try:
            while done < size:
                done += os.pwritev(fd, take_range(pieces, done, size - done) if done else pieces,
                                   offset + done)
            end = offset + done
            if self.syncer is not None and end - self._behind >= WRITE_BEHIND_BYTES:
                self.syncer.write_behind(fd, self._behind, end - self._behind)
                self._behind = end
        except OSError as exc:
            raise os_error(
                exc,
                f'could not write {size} bytes at {format_lsn(self.position)} '
                f'to "{self._path}"',
            ) from exc

    def _complete(self) -> None:
        """fsync, close and rename the open segment; fsync the directory. With a syncer this
        is its job, in order after everything before it, and ``flushed`` moves once it is
        done (see :meth:`flush`)."""
        assert self._fd is not None
        assert self._segno is not None
        assert self._path is not None
        wal = wal_file_name(self.timeline, self._segno, self.segment_size)
        name = self.form.compression().name(wal)
        final = name if self.sealing is None else self._sealed_name(name)
        fd, path = self._fd, self._path
        self._fd, self._segno = None, None
        if self.syncer is not None:
            self.syncer.submit(self.position, lambda: self._finish_file(fd, path, name),
                               segment=final)
            return
        self._finish_file(fd, path, name)
        self._flushed = self.position
        self._completed.append((final, self.position))

    def _finish_file(self, fd: int, path: Path, name: str) -> None:
        """fsync and close ``fd``, rename ``path`` to ``name``, fsync the directory, drop the
        segment's ``.partial`` files in other forms (with :attr:`sealing`: seal it instead)."""
        if self.sealing is not None:
            self._seal(fd, path, name)
            return
        try:
            finish_file(path, self.archive.directory / name, fd=fd, close=True,
                        sync=self.archive.sync)
        except OSError as exc:
            raise os_error(exc, f'could not complete segment "{name}"') from exc
        self._drop_superseded_partials(name[:24])

    def _sealed_name(self, name: str) -> str:
        """The name of the completed segment file ``name`` (``NAME[.zst]``) once sealed: named
        for its recipient set (one file; the identity record lists the set)."""
        assert self.sealing is not None
        return encrypted_file_name(name, self.sealing.recipients.fingerprint)

    def _seal(self, fd: int, path: Path, name: str) -> None:
        """Seal the completed segment written as ``path`` (a ``.partial``, or the temporary
        file of a compressed one): check it, then ``NAME[.zst].FINGERPRINT.age``, named for
        its recipient set (which the identity record lists), durable
        (:func:`~receivewal.archive.sealed.seal_stream`); then drop ``path`` and the segment's
        ``.partial`` files. Until the sealed file is durable, ``path`` keeps the WAL (and none
        of it counts as flushed before this job ends)."""
        assert self.sealing is not None
        target = self.archive.directory / self._sealed_name(name)
        try:
            with os.fdopen(fd, "rb", closefd=True) as fh:
                raw = sealed_input(fh, name, self.segment_size, self.sealing, str(path))
            crash_point(self._crash, "sealing")
            seal_stream(io.BytesIO(raw), target, self.sealing.recipients,
                        mode=self.archive.file_mode, sync=self.archive.sync)
        except OSError as exc:
            raise os_error(exc, f'could not seal segment "{name}" as "{target}"') from exc
        crash_point(self._crash, "sealed")
        self.archive.remove_superseded(path)
        self._drop_superseded_partials(name[:24], removed=True)

    def _drop_superseded_partials(self, wal: str, *, removed: bool = False) -> None:
        """Remove ``.partial`` files of the segment just completed, in any form (another -Z
        method, or the old one a restream replaced): the complete file supersedes them."""
        for suffix in COMPRESSION_SUFFIXES.values():
            stale = self.archive.directory / (wal + suffix + PARTIAL_SUFFIX)
            removed = self.archive.remove_superseded(stale) or removed
        if removed:
            self.archive.fsync_directory()


class CompressedSegmentWriter(SegmentWriter):
    """Writes ``<name>.gz``, ``.lz4`` or ``.zst`` files, each ``.partial`` until complete.

    As pg_receivewal does, a compressed file is not preallocated and cannot be appended to: it
    is always written from its segment's first byte. The new file is written under a temporary
    name and replaces the old ``.partial`` (if any) at the first fsync at which it holds at
    least as much WAL. Before the flush position moves, the compressor's pending output is
    flushed (a sync flush that keeps the stream open) and the file fsynced, so a crash leaves
    a ``.partial`` that decodes up to the flushed position.
    """

    def __init__(self, archive: Archive, segment_size: int, timeline: int, start_lsn: int,
                 compress: CompressSpec, *, stopping: Callable[[], bool] | None = None,
                 sealing: Sealing | None = None) -> None:
        super().__init__(archive, segment_size, timeline, start_lsn, stopping=stopping,
                         sealing=sealing, compress=compress)
        self._compressor: FormWriter | None = None  # the open file's: its form's compression
        self._old: tuple[Path, int] | None = None  # the .partial to replace, and its WAL bytes
        self._written = False

    def flush(self, wait: bool = False) -> int:
        """Flush the compressor's pending output, fsync; return the new flushed position."""
        if self._fd is not None and self._compressor is not None \
                and self._flushed < self.position:
            crash_point(self._crash, "first_flush")
            self._append(self._compressor.flush())
        return super().flush(wait)

    def close(self) -> None:
        """End the compressed stream and close; the file stays (or becomes) ``.partial``.

        A restreamed file still shorter than the old ``.partial`` is dropped: the old one holds
        more WAL, and the next run restreams the segment again.
        """
        if self._fd is not None and self._compressor is not None:
            self._append(self._compressor.finish())
            self._compressor = None
        super().close()
        if self._old is not None and self._path is not None:
            self._path.unlink(missing_ok=True)
            self._old = None
            self.archive.fsync_directory()

    def _start_file(self, path: Path) -> tuple[int, Path]:
        """Start a compressed file at its segment's first byte, under a temporary name."""
        if self.position % self.segment_size != 0:
            raise ArchiveError(
                f'cannot append to compressed file "{path}" at {format_lsn(self.position)}: '
                "a compressed segment is written from its start"
            )
        old = held_wal(path, self.form.method)
        self._old = (path, old)
        compressor = self.form.compression().writer()
        fd, tmp = self._create_temporary(path)
        try:
            write_all(fd, compressor.begin())
        except OSError as exc:
            os.close(fd)
            raise os_error(exc, f'could not start file "{tmp}"') from exc
        self._compressor, self._written = compressor, False
        crash_point(self._crash, "compressed_restart")
        return fd, tmp

    def _synced(self) -> None:
        """Promote the temporary file to ``.partial`` once it holds as much WAL as the old."""
        if self._old is None or self._path is None or self._segno is None:
            return
        partial, old = self._old
        if self.position - self._segno * self.segment_size < old:
            return
        try:
            finish_file(self._path, partial, sync=self.archive.sync)  # fsynced by flush
        except OSError as exc:
            raise os_error(exc, f'could not replace "{partial}"') from exc
        self._path, self._old = partial, None

    def _pwrite(self, fd: int, pieces: list[memoryview], offset: int) -> None:
        assert self._compressor is not None
        for piece in pieces:
            self._append(self._compressor.update(piece))
        if not self._written:
            self._written = True
            crash_point(self._crash, "first_write")

    def _complete(self) -> None:
        assert self._compressor is not None
        self._append(self._compressor.finish())
        self._compressor, self._old = None, None
        super()._complete()

    def _append(self, data: bytes | memoryview) -> None:
        assert self._fd is not None
        try:
            write_all(self._fd, data)
        except OSError as exc:
            raise os_error(exc, f'could not write to "{self._path}" at '
                            f"{format_lsn(self.position)}") from exc


def open_segment_writer(archive: Archive, segment_size: int, timeline: int, start_lsn: int,
                        compress: CompressSpec = NO_COMPRESSION, *, kept: int = 0,
                        stopping: Callable[[], bool] | None = None,
                        sealing: Sealing | None = None) -> SegmentWriter:
    """A writer for plain segments, or for compressed ones when ``compress`` names a method,
    in the stored form of ``compress`` and ``sealing``'s recipients; ``kept``: the LSN up to
    which the last run made this timeline's WAL durable (a plain ``.partial`` keeps it);
    ``stopping`` (whether a stop signal came) bounds its waits for the disk after one;
    ``sealing`` (``--encrypt-to``): each completed segment is sealed."""
    if compress.method:  # a compressed .partial is rewritten from its start: nothing kept
        return CompressedSegmentWriter(archive, segment_size, timeline, start_lsn, compress,
                                       stopping=stopping, sealing=sealing)
    return SegmentWriter(archive, segment_size, timeline, start_lsn, kept=kept,
                         stopping=stopping, sealing=sealing)
