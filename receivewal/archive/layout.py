"""Where received WAL goes on disk (pure): splitting at segment boundaries, choosing the start.

Nothing here touches a file; :mod:`receivewal.archive` carries the plans out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from receivewal.errors import ProtocolError
from receivewal.wal.lsn import format_lsn, round_down_to_segment, segment_start
from receivewal.wal.names import SegmentFile, wal_file_name
from receivewal.wal.timeline import TimelineSpan


@dataclass(frozen=True, slots=True)
class SegmentWrite:
    """Write ``length`` bytes taken at ``data_offset`` of a payload to ``segno`` at ``offset``."""

    segno: int
    offset: int
    data_offset: int
    length: int


def plan_writes(start_lsn: int, length: int, segment_size: int) -> list[SegmentWrite]:
    """Split ``length`` bytes of WAL starting at ``start_lsn`` into per-segment writes."""
    plans: list[SegmentWrite] = []
    done = 0
    while done < length:
        lsn = start_lsn + done
        offset = lsn % segment_size
        piece = min(length - done, segment_size - offset)
        plans.append(SegmentWrite(lsn // segment_size, offset, done, piece))
        done += piece
    return plans


def take_range(pieces: list[memoryview], start: int, length: int) -> list[memoryview]:
    """Bytes ``start`` to ``start + length`` of the concatenation of ``pieces``, as views."""
    taken: list[memoryview] = []
    end = start + length
    at = 0
    for piece in pieces:
        size = len(piece)
        if max(start, at) < min(end, at + size):  # they overlap
            taken.append(piece[max(start - at, 0) : min(end - at, size)])
        at += size
    return taken


def check_continuity(expected_lsn: int, received_lsn: int) -> None:
    """Raise ProtocolError when WAL does not continue exactly where the archive stands."""
    if received_lsn != expected_lsn:
        kind = "gap" if received_lsn > expected_lsn else "overlap"
        raise ProtocolError(
            f"WAL {kind}: received data at {format_lsn(received_lsn)} but the archive "
            f"continues at {format_lsn(expected_lsn)}"
        )


def resume_order(segment: SegmentFile) -> tuple[int, int, bool]:
    """Sort key that puts the segment pg_receivewal resumes from last.

    Highest segment number wins; on a tie the higher timeline; on a tie again a complete file
    beats a ``.partial``.
    """
    return segment.segno, segment.timeline, not segment.partial


@dataclass(frozen=True, slots=True)
class StartPoint:
    """Where streaming starts, and why."""

    lsn: int
    timeline: int
    source: str  # "archive", "slot" or "server"


def choose_start(
    newest: SegmentFile | None,
    slot_restart: tuple[int, int] | None,
    server: tuple[int, int],
    segment_size: int,
) -> StartPoint:
    """Decide the start position as pg_receivewal 15 does.

    The newest archived segment (restream it when it is ``.partial``, else start after it),
    else the slot's restart_lsn and timeline, else the server's flush position and timeline;
    always rounded down to the start of a segment. ``slot_restart`` and ``server`` are
    ``(lsn, timeline)`` pairs.
    """
    if newest is not None:
        segno = newest.segno if newest.partial else newest.segno + 1
        return StartPoint(segment_start(segno, segment_size), newest.timeline, "archive")
    if slot_restart is not None:
        lsn, timeline = slot_restart
        return StartPoint(round_down_to_segment(lsn, segment_size), timeline, "slot")
    lsn, timeline = server
    return StartPoint(round_down_to_segment(lsn, segment_size), timeline, "server")


def runs(segnos: Iterable[int]) -> list[tuple[int, int]]:
    """The runs of consecutive segment numbers, as (first, last), oldest first."""
    found: list[tuple[int, int]] = []
    for segno in sorted(set(segnos)):
        if found and found[-1][1] + 1 == segno:
            found[-1] = (found[-1][0], segno)
        else:
            found.append((segno, segno))
    return found


def older_islands(segnos: Iterable[int], resume_segno: int) -> list[tuple[int, int, int]]:
    """The runs before the one holding ``resume_segno`` (where streaming resumes), each
    separated from what follows by a hole: (first, last, last missing) of each older island,
    oldest first."""
    found = runs(segnos)
    start = next((first for first, last in found if first <= resume_segno <= last),
                 resume_segno)
    return [(first, last, found[i + 1][0] - 1) for i, (first, last) in enumerate(found)
            if last < start]


def island_names(files: Iterable[SegmentFile], resume: SegmentFile | None, segment_size: int,
                 ) -> list[tuple[str, str, str, str]]:
    """The older islands before where streaming resumes (``resume``), by WAL file name: the
    first and last segment of each, and the first and last of the hole after it."""
    files = sorted(files, reverse=True)
    if resume is None:
        return []
    by_segno = {f.segno: f for f in files}  # the lowest timeline's
    found = []
    for first, last, missing in older_islands(by_segno, resume.segno):
        tli = by_segno[last].timeline
        found.append((by_segno[first].wal_name(segment_size),
                      by_segno[last].wal_name(segment_size),
                      wal_file_name(tli, last + 1, segment_size),
                      wal_file_name(tli, missing, segment_size)))
    return found


def on_path(segment: SegmentFile, spans: list[TimelineSpan], segment_size: int) -> bool:
    """Whether ``segment`` holds WAL of the history ``spans`` (a server's, see
    :func:`~receivewal.wal.timeline.timeline_spans`): its timeline is on it, and the segment
    holds some of that timeline's part. A segment past the point where its timeline forked
    on that history belongs to another branch; the segment holding the fork is on it twice,
    once per timeline (the newer one's file also holds the older one's WAL up to the fork)."""
    start = segment_start(segment.segno, segment_size)
    return any(span.timeline == segment.timeline and start + segment_size > span.begin
               and (span.end is None or start < span.end) for span in spans)


def before_its_timeline(files: Iterable[SegmentFile], spans: list[TimelineSpan],
                        segment_size: int) -> tuple[SegmentFile, TimelineSpan] | None:
    """A segment of a timeline on the history ``spans`` that lies wholly before that timeline
    began there, with the span: proof that the archive's timeline of that ID is another
    branch than the server's (a timeline's first file is the one holding its fork). None when
    there is none."""
    begins = {span.timeline: span for span in spans}
    for segment in sorted(files):
        span = begins.get(segment.timeline)
        if span is not None and segment_start(segment.segno + 1, segment_size) <= span.begin:
            return segment, span
    return None
