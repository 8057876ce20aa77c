"""WAL over time (pure): the timestamps records carry, and WAL bytes per hour from them.

WAL pages have no clock; some records do. PostgreSQL 15 writes a timestamp in

* commit and abort records (``xl_xact_commit.xact_time``, microseconds since 2000-01-01),
  also for prepared transactions;
* checkpoint records (``CheckPoint.time``, seconds since 1970, taken when the checkpoint
  *began*: an online checkpoint's record is written up to checkpoint_timeout later);
* restore points and end-of-recovery records (microseconds since 2000-01-01).

:func:`time_marks` finds them among a segment's records; :func:`thin_marks` keeps the first and
last mark of each second (all that sums per second, minute or hour need); :func:`wal_per_bucket`
spreads WAL byte ranges over hours (or other buckets) by interpolating time between marks along
the LSN. Time is made
non-decreasing along the LSN (a checkpoint's start time never moves the clock back).
"""

from __future__ import annotations

import bisect
import itertools
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from receivewal.wal.reader import SegmentScan
from receivewal.wal.records import main_data_of
from receivewal.wal.rmgr import RM_XACT_ID, RM_XLOG_ID

POSTGRES_EPOCH = 946_684_800  # 2000-01-01 00:00:00 UTC in Unix seconds
HOUR = 3600

_I64 = struct.Struct("<q").unpack_from
_XACT_TIMED = {0x00, 0x20, 0x30, 0x40}  # COMMIT, ABORT, COMMIT_PREPARED, ABORT_PREPARED
_CHECKPOINTS = {0x00, 0x10}  # XLOG_CHECKPOINT_SHUTDOWN, XLOG_CHECKPOINT_ONLINE
_XLOG_USEC = {0x70, 0x90}  # XLOG_RESTORE_POINT (rp_time), XLOG_END_OF_RECOVERY (end_time)
_CHECKPOINT_TIME_OFFSET = 64  # CheckPoint.time after redo, TLIs, xids, oids, multis
_TIMED_RMGRS = frozenset((RM_XLOG_ID, RM_XACT_ID))


def record_time(rmid: int, info: int, main: bytes) -> float | None:
    """Unix seconds of a record that carries a timestamp, else None."""
    if rmid == RM_XACT_ID and info & 0x70 in _XACT_TIMED and len(main) >= 8:
        return POSTGRES_EPOCH + int(_I64(main, 0)[0]) / 1e6
    if rmid == RM_XLOG_ID and info & 0xF0 in _CHECKPOINTS and len(main) >= 72:
        return float(_I64(main, _CHECKPOINT_TIME_OFFSET)[0])
    if rmid == RM_XLOG_ID and info & 0xF0 in _XLOG_USEC and len(main) >= 8:
        return POSTGRES_EPOCH + int(_I64(main, 0)[0]) / 1e6
    return None


def time_marks(data: bytes, start_lsn: int,
               record_lsns: Iterable[int]) -> list[tuple[int, float]]:
    """(LSN, Unix seconds) of the timestamped records among ``record_lsns`` (records that start
    in ``data``, a segment beginning at ``start_lsn``); records cut off by the end are skipped."""
    marks = []
    for lsn, rmid, info, main in main_data_of(data, start_lsn, record_lsns, _TIMED_RMGRS):
        when = record_time(rmid, info, main)
        if when is not None:
            marks.append((lsn, when))
    return marks


def thin_marks(marks: Sequence[tuple[int, float]],
               resolution: int = 1) -> list[tuple[int, float]]:
    """The first and last mark (by LSN) of each ``resolution`` seconds: all that
    :func:`wal_per_bucket` needs for buckets that are multiples of it."""
    kept: dict[int, list[tuple[int, float]]] = {}
    for mark in sorted(marks):
        group = kept.setdefault(int(mark[1] // resolution), [])
        if len(group) < 2:
            group.append(mark)
        else:
            group[1] = mark
    return sorted(m for group in kept.values() for m in group)


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """LSN ranges joined where they overlap (a timeline's .partial and the next timeline's
    segment hold the same WAL up to the switch point)."""
    merged: list[list[int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def wal_per_bucket(ranges: Iterable[tuple[int, int]], marks: Iterable[tuple[int, float]],
                   bucket: int = HOUR) -> dict[int, int]:
    """WAL bytes per time bucket (Unix seconds of its start; hours by default) over the LSN
    ``ranges``.

    Time at an LSN is interpolated between the nearest marks (constant before the first and
    after the last); a stretch of WAL between two marks is shared among the buckets it spans
    in proportion to time. Buckets between the first and the last with no WAL are listed with
    0. Each bucket is rounded to whole bytes.
    """
    points = _clock(marks)
    if not points:
        return {}
    lsns = [lsn for lsn, _ in points]
    out: dict[int, float] = {}
    for start, end in merge_ranges(ranges):
        inside = lsns[bisect.bisect_right(lsns, start):bisect.bisect_left(lsns, end)]
        cuts = [start, *inside, end]
        for a, b in itertools.pairwise(cuts):
            _spread(out, b - a, _time_at(points, a), _time_at(points, b), bucket)
    first, last = int(points[0][1] // bucket), int(points[-1][1] // bucket)
    buckets = {b * bucket: 0.0 for b in range(first, last + 1)}
    for when, n in out.items():
        buckets[when] = buckets.get(when, 0.0) + n
    return {when: round(n) for when, n in sorted(buckets.items())}


def time_span(marks: Iterable[tuple[int, float]]) -> tuple[float, float] | None:
    """Time of the first and the last timestamped record (on the non-decreasing clock)."""
    points = _clock(marks)
    return (points[0][1], points[-1][1]) if points else None


def _clock(marks: Iterable[tuple[int, float]]) -> list[tuple[int, float]]:
    points: list[tuple[int, float]] = []
    for lsn, when in sorted(marks):
        if points and lsn == points[-1][0]:
            continue
        points.append((lsn, max(when, points[-1][1]) if points else when))
    return points


def _time_at(points: Sequence[tuple[int, float]], lsn: int) -> float:
    i = bisect.bisect_left(points, (lsn, float("-inf")))
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (l0, t0), (l1, t1) = points[i - 1], points[i]
    return t0 + (t1 - t0) * (lsn - l0) / (l1 - l0)


def _spread(out: dict[int, float], nbytes: int, t0: float, t1: float, bucket: int) -> None:
    """Add ``nbytes`` written between ``t0`` and ``t1`` to the buckets they cover."""
    b0, b1 = int(t0 // bucket), int(t1 // bucket)
    if b0 == b1:
        out[b0 * bucket] = out.get(b0 * bucket, 0.0) + nbytes
        return
    for b in range(b0, b1 + 1):
        share = (min(t1, (b + 1) * bucket) - max(t0, b * bucket)) / (t1 - t0)
        out[b * bucket] = out.get(b * bucket, 0.0) + nbytes * share


@dataclass(frozen=True)
class WalClock:
    """One archive's WAL over time: bytes per hour (Unix seconds of the hour's start), the
    first and last timestamped record, the WAL bytes the archive covers (its LSN ranges),
    and its marks (for finer buckets)."""

    hourly: dict[int, int]
    span: tuple[float, float] | None
    wal_bytes: int
    ranges: tuple[tuple[int, int], ...]
    marks: tuple[tuple[int, float], ...]


def wal_clock(scans: Iterable[SegmentScan], segment_size: int,
              marks: Iterable[tuple[int, float]]) -> WalClock:
    """An archive's WAL over time from its scans and its executors' time marks."""
    ranges = merge_ranges((s.start_lsn, s.end_lsn if s.partial else s.start_lsn + segment_size)
                          for s in scans)
    ordered = tuple(sorted(marks))
    return WalClock(wal_per_bucket(ranges, ordered), time_span(ordered),
                    sum(e - s for s, e in ranges), tuple(ranges), ordered)
