"""Gaps in an archive (pure): the segments missing on each timeline, and islands of older
segments that a hole separates from the run ending at the archive's end.

Part of :func:`receivewal.check.crosscheck.check_archive`'s checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise

from receivewal.archive.layout import older_islands
from receivewal.wal.names import wal_file_name
from receivewal.wal.reader import SegmentScan, WalProblem

_MISSING_LISTED = 10  # missing segments named one by one per gap; the rest are counted


def older_island_problems(own: list[SegmentScan], segment_size: int) -> list[WalProblem]:
    """Each run of segments that a hole separates from the run ending at the archive's end
    (segment numbers over all timelines): recovery from there stops at the hole."""
    if not own:
        return []
    names = {s.segno: s.file for s in reversed(own)}
    tli = {s.segno: s.timeline for s in own}
    problems = []
    for first, last, missing in older_islands(names, max(names)):
        problems.append(WalProblem(
            "older_island", names[first], first * segment_size, f"{names[first]} .. "
            f"{names[last]} lie before a hole ({wal_file_name(tli[last], last + 1, segment_size)}"
            f" .. {wal_file_name(tli[last], missing, segment_size)} missing): recovery from "
            "them stops there; recovery from a base backup taken later starts after the hole "
            "(verify --start LSN)", "warning"))
    return problems


def missing_segments(by_key: Mapping[tuple[int, int], SegmentScan],
                     segment_size: int, start_lsn: int | None = None) -> list[WalProblem]:
    """The segments missing between the first and the last of each timeline: the first few
    of each gap by name, then one problem that counts the rest (a gap may be 2^44 long).
    Those wholly before ``start_lsn`` are warnings: recovery from there does not need them."""
    problems = []
    segnos: dict[int, list[int]] = {}
    for tli, segno in by_key:
        segnos.setdefault(tli, []).append(segno)
    for tli, present in sorted(segnos.items()):
        ordered = sorted(present)
        for low, high in pairwise(ordered):
            gap = range(low + 1, high)
            before = start_lsn is not None and high * segment_size <= start_lsn
            severity, why = ("warning", ", before the start") if before else ("error", "")
            for segno in gap[:_MISSING_LISTED]:
                problems.append(WalProblem(
                    "missing_segment", wal_file_name(tli, segno, segment_size),
                    segno * segment_size, f"segment missing on timeline {tli}{why}", severity))
            if len(gap) > _MISSING_LISTED:
                first = gap[_MISSING_LISTED]
                problems.append(WalProblem(
                    "missing_segment", wal_file_name(tli, first, segment_size),
                    first * segment_size, f"and {len(gap) - _MISSING_LISTED - 1} more "
                    f"segments up to {wal_file_name(tli, high - 1, segment_size)} are missing "
                    f"on timeline {tli}{why}", severity))
    return problems
