"""Checks across an archive's segments and history files (pure), on top of the segment scans.

Given the archive's file names, its history files' text and one :class:`SegmentScan` per
segment, :func:`check_archive` finds segments of another system identifier, missing segments
on each timeline, islands of older segments that a hole separates from the archive's end,
history files that are missing or disagree with the segments, ``.partial`` files where a
complete segment should be, broken ``xl_prev`` links between segments, and the WAL range a
recovery can reach from a start LSN (a start the archive does not hold is a problem),
reading segments the way PostgreSQL's recovery picks them (for each segment, the newest
timeline of the target's history that had begun by then).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from receivewal.check.gaps import missing_segments, older_island_problems
from receivewal.errors import ArchiveError
from receivewal.wal.crossing import followers_needed
from receivewal.wal.lsn import format_lsn
from receivewal.wal.names import SegmentFile, history_file_name, wal_file_name
from receivewal.wal.pageheader import XLOG_BLCKSZ
from receivewal.wal.reader import SegmentScan, WalProblem
from receivewal.wal.timeline import TimelineSwitch, parse_history


class FollowerRun(NamedTuple):
    """``length`` files that may continue a segment's last record, segment numbers ``segno``
    on, of one timeline and one at-rest format: a task lists its followers as a few runs,
    not as the thousand names a record of 1 GB can run through."""

    timeline: int
    segno: int
    length: int
    compression: str
    partial: bool
    encrypted: bool = False
    fingerprint: str = ""  # sealed files' recipient set, as their names say ("": older form)


@dataclass(frozen=True)
class ScanTask:
    """One segment file to scan and the files that may continue its last record."""

    file: str
    segment: SegmentFile
    followers: tuple[FollowerRun, ...]  # the files of segno+1, +2, ... in runs


def follower_files(runs: Iterable[FollowerRun], segment_size: int
                   ) -> Iterator[tuple[str, SegmentFile]]:
    """The file name and the parsed name of each follower the runs list, in order."""
    for tli, segno, length, compression, partial, encrypted, fingerprint in runs:
        for n in range(segno, segno + length):
            seg = SegmentFile(n, tli, compression, partial, encrypted, fingerprint)
            yield seg.file_name(segment_size), seg


@dataclass(frozen=True)
class Recovery:
    """The WAL range recovery can replay from ``start_lsn`` along ``timeline``'s history."""

    timeline: int
    start_lsn: int
    end_lsn: int
    archive_end_lsn: int
    stop_reason: str  # "" when recovery reaches the end of the archive

    @property
    def complete(self) -> bool:
        """Whether recovery reaches the end of the archive."""
        return not self.stop_reason


@dataclass(frozen=True)
class ArchiveReport:
    """Everything verify found: the scans, the problems, the recoverable range."""

    segment_size: int
    system_identifier: int | None
    scans: tuple[SegmentScan, ...]
    problems: tuple[WalProblem, ...]
    recovery: Recovery | None

    @property
    def unlisted_problems(self) -> int:
        """Problems found in the segments beyond those each scan lists (only counted)."""
        return sum(s.unlisted_problems for s in self.scans)

    @property
    def recoverable(self) -> bool:
        """Recoverable end to end: no error anywhere and recovery reaches the archive's end."""
        return (self.recovery is not None and self.recovery.complete
                and not any(p.severity == "error" for p in self.problems))


def choose_files(segments: Iterable[tuple[str, SegmentFile]], preferred: Collection[str] = ()
                 ) -> tuple[dict[tuple[int, int], tuple[str, SegmentFile]], list[WalProblem]]:
    """One file per (timeline, segno): complete before ``.partial``, then the ``preferred``
    names; duplicates are warnings."""
    chosen: dict[tuple[int, int], tuple[str, SegmentFile]] = {}
    problems = []
    for name, seg in sorted(segments, key=lambda item: (item[1].partial,
                                                        item[0] not in preferred, item[0])):
        key = (seg.timeline, seg.segno)
        if key in chosen:
            problems.append(WalProblem("duplicate_segment", name, 0, f"{chosen[key][0]} holds "
                                       "the same segment and is the one checked", "warning"))
            continue
        chosen[key] = (name, seg)
    return chosen, problems


def plan_scans(chosen: Mapping[tuple[int, int], tuple[str, SegmentFile]], *,
               segment_size: int) -> list[ScanTask]:
    """A scan task per chosen file, with the files that follow it without a gap (same
    timeline first), as many as the longest record can run into."""
    limit = followers_needed(segment_size)
    ahead = _runs_ahead(chosen, limit)
    tasks = []
    for (tli, segno), (name, seg) in sorted(chosen.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        followers = []
        n, left = segno + 1, limit
        while left and (tli, n) in ahead:
            first, last = ahead[(tli, n)]
            count = min(last - n + 1, left)
            followers.append(FollowerRun(first.timeline, n, count, first.compression,
                                         first.partial, first.encrypted, first.fingerprint))
            n, left = n + count, left - count
        tasks.append(ScanTask(name, seg, tuple(followers)))
    return tasks


def _runs_ahead(chosen: Mapping[tuple[int, int], tuple[str, SegmentFile]], limit: int
                ) -> dict[tuple[int, int], tuple[SegmentFile, int]]:
    """For a segment of timeline ``t``, the file that continues it at segment number ``n``
    (t's own, else that of the first later timeline that has one), and the last segment
    number of the run from ``n`` on whose files share that file's timeline and format; for
    the ``n`` that follow t's own segments by at most ``limit``."""
    timelines = sorted({tli for tli, _ in chosen})
    segnos = sorted({segno for _, segno in chosen})
    ahead: dict[tuple[int, int], tuple[SegmentFile, int]] = {}
    for t in timelines:
        own = [segno for tli, segno in chosen if tli == t]
        candidates = [c for c in timelines if c >= t]
        low = bisect.bisect_right(segnos, min(own))
        high = bisect.bisect_right(segnos, max(own) + limit)
        for n in reversed(segnos[low:high]):
            pick = next((chosen[(c, n)][1] for c in candidates if (c, n) in chosen), None)
            if pick is None:
                continue
            nxt = ahead.get((t, n + 1))
            same = nxt is not None and _run_key(nxt[0]) == _run_key(pick)
            ahead[(t, n)] = (pick, nxt[1] if nxt is not None and same else n)
    return ahead


def _run_key(seg: SegmentFile) -> tuple[int, str, bool, bool, str]:
    """What the files of one run share: timeline and stored form."""
    return seg.timeline, seg.compression, seg.partial, seg.encrypted, seg.fingerprint


def _begin_of(tli: int, history: list[TimelineSwitch], target: int) -> int:
    """Where timeline ``tli`` begins in the history of ``target``."""
    for i, entry in enumerate(history):
        if entry.timeline == tli:
            return 0 if i == 0 else history[i - 1].switchpoint
    return history[-1].switchpoint if history and tli == target else 0


def check_archive(segment_size: int, scans: Iterable[SegmentScan],
                  histories: Mapping[int, str], *, start_lsn: int | None = None,
                  system_identifier: int | None = None,
                  extra_problems: Iterable[WalProblem] = ()) -> ArchiveReport:
    """Cross-check the scans and history files of one archive."""
    scans = sorted(scans, key=lambda s: (s.segno, s.timeline))
    problems: list[WalProblem] = list(extra_problems)
    for scan in scans:
        problems.extend(scan.problems)

    sysids = Counter(s.system_identifier for s in scans if s.system_identifier is not None)
    if system_identifier is None and sysids:
        system_identifier = sysids.most_common(1)[0][0]
    own = []
    for scan in scans:
        if scan.system_identifier not in (None, system_identifier):
            problems.append(WalProblem("foreign_segment", scan.file, scan.start_lsn,
                                       f"system identifier {scan.system_identifier}, the "
                                       f"archive's is {system_identifier}"))
        else:
            own.append(scan)
    by_key = {(s.timeline, s.segno): s for s in own}

    parsed: dict[int, list[TimelineSwitch]] = {}
    for tli, text in sorted(histories.items()):
        try:
            parsed[tli] = parse_history(text, tli)
        except ArchiveError as exc:
            problems.append(WalProblem("history_mismatch", history_file_name(tli), 0, str(exc)))
    timelines = sorted({s.timeline for s in own} | set(parsed))
    target = timelines[-1] if timelines else 1
    problems += _check_histories(own, parsed, timelines, segment_size)
    problems += _check_partials(own, parsed, segment_size)
    problems += missing_segments(by_key, segment_size, start_lsn)
    problems += older_island_problems(own, segment_size)

    recovery = None
    if own:
        recovery, path_problems = _recover(by_key, parsed.get(target, []), target,
                                           segment_size, start_lsn)
        problems += path_problems
    problems += _unexplained_verdict(recovery, problems, own, segment_size)
    unique = list({(p.kind, p.file, p.lsn): p for p in reversed(problems)}.values())[::-1]
    unique.sort(key=lambda p: (p.severity != "error", p.lsn, p.file))
    return ArchiveReport(segment_size, system_identifier, tuple(scans), tuple(unique), recovery)


def _unexplained_verdict(recovery: Recovery | None, problems: list[WalProblem],
                         own: list[SegmentScan], segment_size: int) -> list[WalProblem]:
    """A problem that names why recovery stops when no error found so far says it: a NOT
    recoverable verdict always names at least one problem."""
    if any(p.severity == "error" for p in problems):
        return []
    if recovery is None:
        return [WalProblem("no_segments", "", 0, "the archive holds no segment file")]
    if recovery.complete:
        return []
    end = recovery.end_lsn
    file = next((s.file for s in own if s.start_lsn <= end < s.start_lsn + segment_size), "")
    return [WalProblem("recovery_stops", file, end, recovery.stop_reason)]


def _check_histories(own: list[SegmentScan], parsed: Mapping[int, list[TimelineSwitch]],
                     timelines: list[int], segment_size: int) -> list[WalProblem]:
    problems = []
    first_of: dict[int, SegmentScan] = {}
    for scan in own:
        first_of.setdefault(scan.timeline, scan)
    for tli in timelines:
        if tli == 1:
            continue
        first = first_of.get(tli)
        if tli not in parsed:
            problems.append(WalProblem(
                "missing_history", history_file_name(tli), first.start_lsn if first else 0,
                f"timeline {tli} has segments but no history file" if first
                else f"timeline {tli} is named but its history file is unreadable"))
            continue
        history = parsed[tli]
        if not history:
            problems.append(WalProblem("history_mismatch", history_file_name(tli), 0,
                                       f"history file of timeline {tli} lists no parent"))
            continue
        parent = history[-1].timeline
        if parent in parsed and parsed[parent] != history[:-1]:
            problems.append(WalProblem(
                "history_mismatch", history_file_name(tli), history[-1].switchpoint,
                f"its ancestry disagrees with {history_file_name(parent)}"))
        begin = history[-1].switchpoint
        allowed = {e.timeline for e in history} | {tli}
        for s in own:
            if s.timeline != tli:
                continue
            if s.start_lsn + segment_size <= begin:
                problems.append(WalProblem(
                    "history_mismatch", s.file, s.start_lsn, f"segment of timeline {tli} "
                    f"before the timeline began at {format_lsn(begin)}"))
            for lsn, page_tli in s.page_tlis:
                if page_tli not in allowed:
                    problems.append(WalProblem(
                        "history_mismatch", s.file, lsn, f"page of timeline {page_tli}, "
                        f"which is not in the history of timeline {tli}"))
                elif page_tli == tli and lsn < begin - begin % XLOG_BLCKSZ:
                    problems.append(WalProblem(
                        "history_mismatch", s.file, lsn, f"page of timeline {tli} before "
                        f"the switch point {format_lsn(begin)} in its history file"))
    return problems


def _check_partials(own: list[SegmentScan], parsed: Mapping[int, list[TimelineSwitch]],
                    segment_size: int) -> list[WalProblem]:
    ends: dict[int, int] = {}
    for history in parsed.values():
        for entry in history:
            ends[entry.timeline] = entry.switchpoint
    last_complete: dict[int, int] = {}
    for s in own:
        if not s.partial:
            last_complete[s.timeline] = max(last_complete.get(s.timeline, -1), s.segno)
    problems = []
    for s in own:
        if not s.partial:
            continue
        later = last_complete.get(s.timeline, -1) > s.segno
        end = ends.get(s.timeline)
        if later or (end is not None and end >= s.start_lsn + segment_size):
            problems.append(WalProblem(
                "partial_segment", s.file, s.start_lsn, "a .partial file where a complete "
                "segment should be: the timeline continues after it"))
    return problems


def _recover(by_key: Mapping[tuple[int, int], SegmentScan], history: list[TimelineSwitch],
             target: int, segment_size: int, start_lsn: int | None
             ) -> tuple[Recovery, list[WalProblem]]:
    """Walk the segments recovery would read, from ``start_lsn`` to the archive's end."""
    tles = [(target, _begin_of(target, history, target) // segment_size)]
    tles += [(e.timeline, _begin_of(e.timeline, history, target) // segment_size)
             for e in reversed(history)]

    def tli_for(segno: int) -> int:
        for tli, begin in tles:
            if segno >= begin:
                return tli
        return tles[-1][0]

    on_path = sorted(segno for tli, segno in by_key if tli == tli_for(segno))
    problems: list[WalProblem] = []
    if not on_path:
        return Recovery(target, start_lsn or 0, start_lsn or 0, 0,
                        f"no segment of timeline {target}'s history"), problems
    first, last = on_path[0], on_path[-1]
    archive_end = by_key[(tli_for(last), last)].valid_end
    start = start_lsn if start_lsn is not None else first * segment_size
    if start >= archive_end:  # nothing to replay from there: nothing was verified
        reason = (f"the start {format_lsn(start)} is not in the archive, whose WAL ends at "
                  f"{format_lsn(archive_end)}")
        problems.append(WalProblem("start_not_in_archive", by_key[(tli_for(last), last)].file,
                                   start, reason))
        return Recovery(target, start, start, archive_end, reason), problems
    reach, reason, prev_last = start, "", None
    for segno in range(start // segment_size, last + 1):
        tli = tli_for(segno)
        scan = by_key.get((tli, segno))
        name = wal_file_name(tli, segno, segment_size)
        if scan is None:
            reason = f"segment {name} is missing"
            problems.append(WalProblem("missing_segment", name, segno * segment_size,
                                       f"recovery on timeline {target} needs it"))
            break
        if (prev_last is not None and scan.first_record_lsn is not None
                and scan.first_record_prev != prev_last):
            reason = f"{scan.file} does not continue the previous segment"
            problems.append(WalProblem(
                "bad_record", scan.file, scan.first_record_lsn, "first record's prev-link "
                f"{format_lsn(scan.first_record_prev or 0)} does not point to the last "
                f"record of the previous segment, {format_lsn(prev_last)}"))
            reach = scan.first_record_lsn
            break
        if scan.last_record_lsn is not None:
            prev_last = scan.last_record_lsn
        reach = scan.valid_end
        if scan.valid_end < (segno + 1) * segment_size:
            broken = any(p.severity == "error" for p in scan.problems)
            if not broken and scan.incomplete_tail:
                reason = _unfinished_record(by_key, tli_for, segno=segno, last=last,
                                            lsn=reach, segment_size=segment_size)
            elif segno != last or broken:
                reason = f"WAL in {scan.file} is unreadable from {format_lsn(reach)}"
                damaged = sorted({p.file for p in scan.problems if p.severity == "error"}
                                 - {scan.file})
                if damaged:  # a record there continues into a damaged file
                    reason += f" (the damage is in {', '.join(damaged)})"
            break
    return Recovery(target, start, max(reach, start), archive_end, reason), problems


def _unfinished_record(by_key: Mapping[tuple[int, int], SegmentScan],
                       tli_for: Callable[[int], int], *, segno: int, last: int, lsn: int,
                       segment_size: int) -> str:
    """Why recovery stops at the unfinished record at ``lsn`` in segment ``segno``: the first
    segment after it that is missing or damaged; "" when all that follows is there and sound,
    so that the archive's WAL ends inside the record (a record still being streamed)."""
    for n in range(segno + 1, last + 1):
        tli = tli_for(n)
        follower = by_key.get((tli, n))
        if follower is None:
            return (f"the record at {format_lsn(lsn)} continues into "
                    f"{wal_file_name(tli, n, segment_size)}, which is missing")
        if any(p.severity == "error" for p in follower.problems):
            return (f"the record at {format_lsn(lsn)} continues into {follower.file}, "
                    "which is damaged")
    return ""
