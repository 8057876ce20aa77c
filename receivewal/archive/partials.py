"""The ``.partial`` files of one segment in several forms: which to trust, and settling them.

A segment can be left as ``.partial`` in more than one form (plain, ``.gz``, ``.lz4``,
``.zst``): a ``-Z`` method changed between runs, or a crash came between a restreamed file's
promotion and the removal of the old one. The one to trust is the one holding the longest
valid WAL, measured by the WAL reader (:class:`~receivewal.wal.reader.SegmentScanner`: page
headers and records checked as recovery reads them), never the newest. Two files that hold
different WAL where both hold some cannot be told apart: that is a :class:`Conflict`.

:func:`rank_partials` serves ``restore --partial`` and ``verify``; :func:`settle_partials`
is the daemon's start-up step that leaves one ``.partial`` per segment, the segments it is
about to restream converted durably to the form it writes, so that a method change never
drops WAL that was durable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from receivewal.archive.compression import (
    CompressSpec,
    CorruptFile,
    decompress_chunks,
    open_local,
)
from receivewal.archive.directory import Archive, os_error
from receivewal.archive.durable import durable_file
from receivewal.archive.files import preallocate
from receivewal.archive.storedform import StoredForm
from receivewal.errors import ArchiveError
from receivewal.wal.lsn import format_lsn
from receivewal.wal.names import AtRest, SegmentFile


@dataclass(frozen=True)
class PartialFile:
    """A ``.partial`` file of a segment and the valid WAL it holds."""

    path: Path
    segment: SegmentFile
    valid: int  # bytes of valid WAL from the segment's first byte
    mtime_ns: int


@dataclass(frozen=True)
class SettledPartial:
    """What start-up did to a ``.partial`` file (``file``): ``action``, in words."""

    file: str
    action: str


@dataclass(frozen=True)
class Conflict:
    """Two ``.partial`` files of one segment that hold different WAL at ``lsn``."""

    first: Path
    second: Path
    lsn: int

    def describe(self) -> str:
        """One line naming both files and where they differ."""
        return (f'"{self.first}" and "{self.second}" hold different WAL at '
                f"{format_lsn(self.lsn)}: neither can be trusted over the other")


def read_partial(path: Path, segment: SegmentFile, segment_size: int) -> bytes:
    """The WAL bytes a ``.partial`` decodes to, up to any damage (at most a segment)."""
    out = bytearray()
    with open_local(str(path)) as fh, contextlib.suppress(CorruptFile):
        for chunk in decompress_chunks(fh, segment.compression, truncated_ok=True,
                                       cap=segment_size):
            out += chunk
    return bytes(out[:segment_size])


def valid_wal(data: bytes, name: str, segment: SegmentFile, segment_size: int) -> int:
    """How many bytes from the segment's start hold WAL the reader accepts."""
    from receivewal.wal.reader import SegmentScanner  # noqa: PLC0415 - only when .partial
    # forms compete: the daemon's start-up imports no WAL reader otherwise

    start = segment.start_lsn(segment_size)
    scanner = SegmentScanner(data, name, start_lsn=start, segment_size=segment_size,
                             timeline=segment.timeline, segno=segment.segno, partial=True)
    return max(0, min(scanner.result().valid_end - start, len(data)))


def partial_end(archive: Archive, segment: SegmentFile, segment_size: int) -> int:
    """The LSN where the valid WAL of the ``.partial`` file ``segment`` ends (read once, at
    start-up, when a fork lies in its segment). Raises ArchiveError."""
    path = archive.directory / segment.file_name(segment_size)
    try:
        data = read_partial(path, segment, segment_size)
    except OSError as exc:
        raise os_error(exc, f'cannot read "{path}"') from exc
    return segment.start_lsn(segment_size) + valid_wal(data, path.name, segment, segment_size)


def rank_partials(forms: Iterable[tuple[Path, SegmentFile]], segment_size: int,
                  ) -> tuple[list[PartialFile], Conflict | None]:
    """The ``.partial`` files of one segment, the longest valid WAL first (the newest first
    among equals), and the first pair that disagrees where both hold WAL.

    Files are read one at a time and compared with the best: at most two segments in memory.
    Raises OSError for a file that cannot be opened.
    """
    measured = []
    for path, segment in forms:
        valid = valid_wal(read_partial(path, segment, segment_size), path.name, segment,
                          segment_size)
        measured.append(PartialFile(path, segment, valid, path.stat().st_mtime_ns))
    ranked = sorted(measured, key=lambda f: (f.valid, f.mtime_ns), reverse=True)
    if len(ranked) < 2 or ranked[1].valid == 0:
        return ranked, None
    best = ranked[0]
    best_data = read_partial(best.path, best.segment, segment_size)
    for other in ranked[1:]:
        if other.valid == 0:
            continue
        data = read_partial(other.path, other.segment, segment_size)
        at = _first_difference(best_data, data, other.valid)
        if at is not None:
            return ranked, Conflict(best.path, other.path,
                                    best.segment.start_lsn(segment_size) + at)
    return ranked, None


def _first_difference(a: bytes, b: bytes, length: int) -> int | None:
    """The offset of the first byte below ``length`` where ``a`` and ``b`` differ."""
    block = 1 << 16
    for off in range(0, length, block):
        end = min(off + block, length)
        if a[off:end] != b[off:end]:
            return next(i for i in range(off, end) if a[i] != b[i])
    return None


def partial_groups(files: Iterable[SegmentFile]) -> dict[tuple[int, int], list[SegmentFile]]:
    """The ``.partial`` files by (timeline, segment number)."""
    groups: dict[tuple[int, int], list[SegmentFile]] = {}
    for f in files:
        if f.partial:
            groups.setdefault((f.timeline, f.segno), []).append(f)
    return groups


def settle_partials(archive: Archive, segment_size: int, files: Sequence[SegmentFile],
                    compress: CompressSpec, restream_from: SegmentFile | None,
                    ) -> list[SettledPartial]:
    """Leave one ``.partial`` per segment: the one with the longest valid WAL. Segments from
    ``restream_from`` on (which the writer is about to restream, in the form ``compress``
    says) are converted durably to that form first. Returns what was done, file by file.

    Raises ArchiveError when two files of a segment disagree (an operator must decide).
    """
    done = _drop_sealed_leftovers(archive, segment_size, files)
    gone = {settled.file for settled in done}
    form = AtRest(compress.method or "")
    first = None if restream_from is None else \
        restream_from.segno + (0 if restream_from.partial else 1)
    for (timeline, segno), group in sorted(partial_groups(files).items()):
        restreamed = restream_from is not None and first is not None \
            and timeline == restream_from.timeline and segno >= first
        present = [f for f in group if f.file_name(segment_size) not in gone]
        if not present or (len(present) < 2
                           and (not restreamed or present[0].compression == form)):
            continue
        forms = [(archive.directory / f.file_name(segment_size), f) for f in present]
        try:
            ranked, conflict = rank_partials(forms, segment_size)
        except OSError as exc:
            raise os_error(exc, f"cannot read the .partial files of segment {segno}") from exc
        if conflict is not None:
            raise ArchiveError(conflict.describe())
        keep = ranked[0]
        if restreamed and keep.segment.compression != form:
            keep = _convert(archive, keep, form, compress, segment_size)
            done.append(SettledPartial(keep.path.name, f"converted from {ranked[0].path.name}, "
                                                       f"{keep.valid} bytes of WAL"))
        for other in ranked:
            if other.path != keep.path:
                archive.remove_superseded(other.path)
                done.append(SettledPartial(other.path.name,
                                           f"removed, {keep.path.name} holds its WAL"))
        archive.fsync_directory()
    return done


def _drop_sealed_leftovers(archive: Archive, segment_size: int,
                           files: Sequence[SegmentFile]) -> list[SettledPartial]:
    """Remove the ``.partial`` files of segments sealed already (a crash came after the sealed
    file was durable, before they were removed): the sealed file holds their WAL, and they
    would keep its plaintext on the disk."""
    sealed = {(f.timeline, f.segno): f for f in files if f.encrypted}
    done = []
    for f in files:
        if f.partial and (f.timeline, f.segno) in sealed:
            path = archive.directory / f.file_name(segment_size)
            if archive.remove_superseded(path):
                done.append(SettledPartial(path.name, "removed, "
                                           f"{sealed[f.timeline, f.segno].file_name(segment_size)}"
                                           " holds its WAL (sealed)"))
    if done:
        archive.fsync_directory()
    return done


def _convert(archive: Archive, source: PartialFile, form: AtRest, compress: CompressSpec,
             segment_size: int) -> PartialFile:
    """Write ``source``'s valid WAL as a ``.partial`` of ``form`` (a plain one preallocated
    to the segment size), through a temporary file, fsynced and renamed into place."""
    segment = SegmentFile(source.segment.segno, source.segment.timeline, form, partial=True)
    target = archive.directory / segment.file_name(segment_size)
    wal = read_partial(source.path, source.segment, segment_size)[:source.valid]
    try:
        with durable_file(target, archive.file_mode, sync=archive.sync) as out:
            if form == AtRest.PLAIN:
                preallocate(out.fileno(), segment_size)
                out.write(wal)
            else:
                out.write(StoredForm(compress).stored_bytes(wal))
    except OSError as exc:
        raise os_error(exc, f'could not convert "{source.path}" to "{target}"') from exc
    return PartialFile(target, segment, source.valid, target.stat().st_mtime_ns)
