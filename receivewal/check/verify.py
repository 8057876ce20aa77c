"""Verify an archive: scan every segment of one archive in a process pool and report.

The IO edge of the archive checks: list the directory, read and decompress files, run
:class:`~receivewal.wal.reader.SegmentScanner` on each segment (finishing a record that runs
into the next segment from that segment's first pages) and hand the scans to
:func:`~receivewal.check.crosscheck.check_archive`. The ``receivewal verify`` command is in
:mod:`receivewal.commands.verify`; :func:`scan_file` is also analyze's per-segment task.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from receivewal.archive.compression import Opener, compressed_sizes, read_wal_file
from receivewal.archive.identity import ArchiveIdentity
from receivewal.archive.location import Location
from receivewal.archive.sealed import (
    DecryptingOpener,
    NoIdentity,
    Unsealer,
    fingerprint_of,
    recipients_of,
    sealed_cap,
)
from receivewal.archive.segmentbuffer import read_segment
from receivewal.archive.sources import ArchiveSource, decide_segment_size
from receivewal.archive.view import ArchiveView, locate, read_histories
from receivewal.check.crosscheck import (
    ArchiveReport,
    ScanTask,
    check_archive,
    choose_files,
    follower_files,
    plan_scans,
)
from receivewal.errors import ArchiveError
from receivewal.wal import nativescan
from receivewal.wal.lsn import DEFAULT_SEGMENT_SIZE, format_lsn
from receivewal.wal.names import (
    SegmentFile,
    looks_like_segment,
    parse_archive_segment_name,
    parse_history_file_name,
    parse_segment_file_name,
)
from receivewal.wal.reader import (
    RmgrTotals,
    SegmentScan,
    SegmentScanner,
    WalProblem,
)
from receivewal.wal.rmgr import rmgr_name

#: WAL each worker process must have before verify starts another, so that -j never makes a
#: small archive slower: the compiled scanner reads and checks a 16 MiB segment in ~4 ms, and
#: bench/verify_throughput.py found a pool of two slower than one process at 35 segments.
BYTES_PER_WORKER = 1 << 30


@dataclass(frozen=True)
class FileResult:
    """One scanned file: the scan (None when unreadable), sizes and time spent."""

    task: ScanTask
    scan: SegmentScan | None
    file_bytes: int
    zstd_bytes: int | None = None
    lz4_bytes: int | None = None
    seconds: float = 0.0
    problems: tuple[WalProblem, ...] = field(default_factory=tuple)
    sealed_to: str | None = None  # a sealed file's recipients (its recipients file), described


def scan_file(task: ScanTask, base: str, segment_size: int, *, compressibility: bool = False,
              collect_lsns: bool = False, open_binary: Opener | None = None,
              file_bytes: int | None = None) -> FileResult:
    """Read, decompress and scan one segment file; finish its last record from followers."""
    began = time.perf_counter()
    seg = task.segment
    join = _join(base)
    sealed_to = _sealed_to(join(task.file), open_binary) if seg.encrypted else None
    try:
        data = read_segment(join(task.file), seg.compression, segment_size, open_binary)
    except ArchiveError as exc:
        kind = NOT_CHECKED if isinstance(exc, NoIdentity) else "unreadable"
        problem = WalProblem(kind, task.file, seg.start_lsn(segment_size), str(exc))
        return FileResult(task, None, file_bytes or 0, problems=(problem,),
                          sealed_to=sealed_to)
    scanner = SegmentScanner(data, task.file, start_lsn=seg.start_lsn(segment_size),
                             segment_size=segment_size, timeline=seg.timeline, segno=seg.segno,
                             partial=seg.partial, collect_lsns=collect_lsns)
    scanner.scan()
    for name, follower in follower_files(task.followers, segment_size):
        need = scanner.next_bytes_needed()
        if not need:
            break
        try:
            head = read_wal_file(join(name), follower.compression, need, open_binary)
        except ArchiveError:
            break
        scanner.continue_record(head, name, partial=follower.partial)
    scan = scanner.result()
    zstd_bytes = lz4_bytes = None
    if compressibility:
        zstd_bytes, lz4_bytes = compressed_sizes(data)
    if file_bytes is None:
        file_bytes = os.stat(join(task.file)).st_size
    return FileResult(task, scan, file_bytes, zstd_bytes, lz4_bytes,
                      time.perf_counter() - began, sealed_to=sealed_to)


def _sealed_to(path: str, open_binary: Opener | None) -> str:
    """Whom the sealed file at ``path`` is for, as the identity record's set its name names
    says, or in the older form its recipients file."""
    try:
        recipients = recipients_of(path, open_binary)
    except (ArchiveError, OSError) as exc:
        return f"unknown ({exc})"
    if recipients is not None:
        return recipients.describe()
    fingerprint = fingerprint_of(path)
    return f"unknown (recipient set {fingerprint}, not in the identity record)" if fingerprint \
        else "unknown (no recipients file)"


NOT_CHECKED = "not_checked"  # a sealed file read without a key


def verdict_of(report: ArchiveReport, *, failed_backups: int = 0,
               unchecked_backups: int = 0) -> str:
    """``recoverable``, ``NOT recoverable``, or ``unknown``: nothing wrong was found that
    could be read, but files (segments, sealed backups) could not be checked without a
    key."""
    errors = [p for p in report.problems if p.severity == "error" and p.kind != NOT_CHECKED]
    if errors or failed_backups:
        return "NOT recoverable"
    if unchecked_backups or any(p.kind == NOT_CHECKED for p in report.problems):
        return "unknown"
    return "recoverable" if report.recoverable else "NOT recoverable"


def verdict_line(verdict: str) -> str:
    """The report's last line."""
    if verdict == "unknown":
        return ("verdict: unknown: what was read is sound, but sealed files were not checked "
                "(--identity FILE)")
    return f"verdict: {verdict} end to end"


def not_checked_line(problems: Iterable[WalProblem], results: Iterable[FileResult]
                     ) -> str | None:
    """One line for every sealed file that could not be read without a key: how many, to
    whom (the recipient sets), and what reads them."""
    files = {p.file for p in problems if p.kind == NOT_CHECKED}
    if not files:
        return None
    whom = sorted({r.sealed_to for r in results
                   if r.task.file in files and r.sealed_to is not None})
    return (f"not checked: {len(files)} files could not be checked without a key (sealed to "
            f"{'; '.join(whom) or 'unknown recipients'}): give --identity FILE (or "
            "RECEIVEWAL_IDENTITY) holding one of its keys")


def sealed_lines(results: Iterable[FileResult]) -> list[str]:
    """How many segments are sealed, per recipient set (what to keep a key for)."""
    sets: dict[str, int] = {}
    for r in results:
        if r.sealed_to is not None:
            sets[r.sealed_to] = sets.get(r.sealed_to, 0) + 1
    if not sets:
        return []
    return [f"sealed: {sum(sets.values())} segments encrypted at rest"] + \
        [f"  {count} to {whom}" for whom, count in sets.items()]


def _join(base: str) -> Any:
    return lambda name: base.rstrip("/") + "/" + name


def classify(names: Iterable[str], segment_size: int
             ) -> tuple[list[tuple[str, SegmentFile]], list[str]]:
    """Segment files (parsed) and history file names among ``names``."""
    segments, histories = [], []
    for name in names:
        seg = parse_archive_segment_name(name, segment_size)
        if seg is not None:
            segments.append((name, seg))
        elif parse_history_file_name(name) is not None:
            histories.append(name)
    return segments, histories


def misnamed(names: Iterable[str], segment_size: int) -> list[WalProblem]:
    """A problem for each name shaped like a segment's that no segment of ``segment_size``
    can have (timeline 0, or a segment number out of range)."""
    return [WalProblem("bad_file_name", name, 0, "named like a WAL segment, but no segment of "
                       f"{segment_size >> 20} MiB has this name (timeline 0 or segment number "
                       "out of range)")
            for name in names
            if looks_like_segment(name) and parse_segment_file_name(name, segment_size) is None]


def detect_segment_size(base: str, names: Iterable[str], open_binary: Opener | None,
                        identity: ArchiveIdentity | None) -> int:
    """The archive's segment size by the one rule, :func:`~receivewal.archive.sources.
    decide_segment_size` (restore's too): its identity record's (``identity``, as
    :func:`~receivewal.archive.sources.recorded_identity` read it), else the size most
    segment-named files' long headers state (a header whose page address is not where its
    file name puts the segment decides nothing: its scan reports it). When nothing decides and
    a file could not be read or had no valid header, ArchiveError says so; else PostgreSQL's
    default."""
    problems: list[ArchiveError] = []
    size = decide_segment_size(identity, base, names, open_binary, problems)
    if size is not None:
        return size
    if problems:
        raise problems[-1]
    return DEFAULT_SEGMENT_SIZE


def system_identifier_of(identity: ArchiveIdentity | None) -> int | None:
    """The system identifier an identity record names (None: no record)."""
    return None if identity is None else int(identity.system_identifier)


def verify_archive(archive: Path | str, *, jobs: int | None = None,
                   start_lsn: int | None = None, segment_size: int | None = None,
                   compressibility: bool = False, collect_lsns: bool = False,
                   identity_file: str | None = None,
                   ) -> tuple[ArchiveReport, list[FileResult]]:
    """Scan and cross-check one archive: a directory, or ``s3://BUCKET/PREFIX`` (listed once,
    each object then streamed through the same reader and scanner as a local file). Its
    identity record, when it has one, says whose segments it holds: any other system's are
    foreign to it. Sealed segments (``.age``) are decrypted with ``identity_file``
    (``--identity``; KeyFileError at once when it cannot be used); without one each is a
    ``not_checked`` problem naming who can read it (the verdict is then not "recoverable")."""
    view = ArchiveView(str(archive), locate(str(archive)))
    source = view.source()
    names = source.names
    identity = view.identity()
    if segment_size is None:
        segment_size = detect_segment_size(source.base, names, source.open_binary, identity)
    segments, history_names = classify(names, segment_size)
    opener = unsealing_opener(source.open_binary, identity_file, segment_size,
                              any(seg.encrypted for _, seg in segments))
    # several .partial forms of one segment: only a local archive has them (uploads are of
    # completed files)
    preferred, problems = longest_partials(Path(source.base), segments, segment_size) \
        if source.is_local else ([], [])
    chosen, duplicates = choose_files(segments, preferred)
    problems += duplicates
    problems += misnamed(names, segment_size)
    tasks = plan_scans(chosen, segment_size=segment_size)
    results = run_scans(tasks, source, segment_size, jobs=jobs,
                        compressibility=compressibility, collect_lsns=collect_lsns,
                        open_binary=opener)
    histories = histories_of(view.location, history_names, problems)
    for r in results:
        problems.extend(r.problems)
    report = check_archive(segment_size, [r.scan for r in results if r.scan is not None],
                           histories, start_lsn=start_lsn, extra_problems=problems,
                           system_identifier=system_identifier_of(identity))
    return report, results


def unsealing_opener(open_binary: Opener | None, identity_file: str | None, segment_size: int,
                     sealed: bool) -> Opener | None:
    """``open_binary``, or when the archive holds ``sealed`` segments, an opener that decrypts
    them with ``identity_file`` (loaded here once, so that a bad one is an error at once)."""
    if not sealed:
        return open_binary
    if identity_file:
        Unsealer(identity_file).keys()
    return DecryptingOpener(open_binary, identity_file, sealed_cap(segment_size))


def longest_partials(directory: Path, segments: list[tuple[str, SegmentFile]],
                     segment_size: int) -> tuple[list[str], list[WalProblem]]:
    """Of each segment held only as ``.partial`` in several forms, the one with the longest
    valid WAL (checked first); a problem for forms that hold different WAL."""
    complete = {(s.timeline, s.segno) for _, s in segments if not s.partial}
    groups: dict[tuple[int, int], list[tuple[Path, SegmentFile]]] = {}
    for name, seg in segments:
        if seg.partial and (seg.timeline, seg.segno) not in complete:
            groups.setdefault((seg.timeline, seg.segno), []).append((directory / name, seg))
    preferred, problems = [], []
    for forms in groups.values():
        if len(forms) < 2:
            continue
        from receivewal.archive.partials import rank_partials  # noqa: PLC0415 - only where two
        # .partial forms compete: it brings the archive writer's modules (~10 ms of start-up)

        try:
            ranked, conflict = rank_partials(forms, segment_size)
        except (OSError, ArchiveError):
            continue  # the scan of each file reports it
        preferred.append(ranked[0].path.name)
        if conflict is not None:
            problems.append(WalProblem("partial_conflict", conflict.first.name, conflict.lsn,
                                       f"{conflict.second.name} holds different WAL here: "
                                       "neither can be trusted over the other"))
    return preferred, problems


def run_scans(tasks: list[ScanTask], source: ArchiveSource, segment_size: int, *,
              jobs: int | None, compressibility: bool, collect_lsns: bool = False,
              open_binary: Opener | None = None) -> list[FileResult]:
    """Scan every task; in a process pool of at most ``jobs`` (default: the CPUs) workers,
    one per :data:`BYTES_PER_WORKER` of segments, and in this process when that is one."""
    jobs = worker_count(jobs or os.cpu_count() or 1, len(tasks), segment_size)
    sizes = dict(source.files)
    options: dict[str, Any] = {"compressibility": compressibility,
                               "collect_lsns": collect_lsns,
                               "open_binary": open_binary or source.open_binary}
    if jobs == 1:
        return [scan_file(t, source.base, segment_size, file_bytes=sizes.get(t.file), **options)
                for t in tasks]
    from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415 - 10 ms, when used

    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(scan_file, t, source.base, segment_size,
                               file_bytes=sizes.get(t.file), **options) for t in tasks]
        return [f.result() for f in futures]


def worker_count(jobs: int, segments: int, segment_size: int) -> int:
    """Workers for ``segments`` scans: at most ``jobs``, one per BYTES_PER_WORKER of WAL."""
    return max(1, min(jobs, segments, segments * segment_size // BYTES_PER_WORKER))


# -- output ------------------------------------------------------------------------------------
def _sum_stats(per_scan: Iterable[Mapping[int, RmgrTotals]]
               ) -> dict[int, tuple[int, int, int]]:
    """Add up (records, record bytes, FPI bytes) per key over many scans' stat maps."""
    totals: dict[int, list[int]] = {}
    for stats in per_scan:
        for key, t in stats.items():
            acc = totals.setdefault(key, [0, 0, 0])
            acc[0] += t.records
            acc[1] += t.record_bytes
            acc[2] += t.fpi_bytes
    return {key: (a[0], a[1], a[2]) for key, a in sorted(totals.items())}


def rmgr_totals(scans: Iterable[SegmentScan]) -> dict[str, tuple[int, int, int]]:
    """Records, record bytes and FPI bytes per resource manager name, over ``scans``."""
    return {rmgr_name(rmid): t for rmid, t in _sum_stats(s.rmgr for s in scans).items()}


def record_type_totals(scans: Iterable[SegmentScan]
                       ) -> dict[tuple[str, int], tuple[int, int, int]]:
    """Like :func:`rmgr_totals` per (resource manager, record type), as --stats=record."""
    return {(rmgr_name(key >> 4), key & 0xF): t
            for key, t in _sum_stats(s.record_types for s in scans).items()}


def report_json(report: ArchiveReport, results: list[FileResult]) -> dict[str, Any]:
    """The report as JSON-ready data (LSNs printed as PostgreSQL prints them)."""
    rec = report.recovery
    by_file = {r.task.file: r for r in results}
    return {
        "recoverable": report.recoverable,
        "verdict": verdict_of(report),
        "not_checked": sum(p.kind == NOT_CHECKED for p in report.problems),
        "scanner": nativescan.scanner_path(),
        "segment_size": report.segment_size,
        "system_identifier": report.system_identifier,
        "recovery": None if rec is None else {
            "timeline": rec.timeline, "start_lsn": format_lsn(rec.start_lsn),
            "end_lsn": format_lsn(rec.end_lsn), "archive_end_lsn": format_lsn(rec.archive_end_lsn),
            "complete": rec.complete, "stop_reason": rec.stop_reason},
        "segments": [{
            "file": s.file, "timeline": s.timeline, "segno": s.segno,
            "start_lsn": format_lsn(s.start_lsn), "partial": s.partial,
            "records": s.records, "record_bytes": s.record_bytes, "fpi_bytes": s.fpi_bytes,
            "valid_end": format_lsn(s.valid_end), "switched": s.switched,
            "file_bytes": by_file[s.file].file_bytes if s.file in by_file else None,
            "zstd_bytes": by_file[s.file].zstd_bytes if s.file in by_file else None,
            "lz4_bytes": by_file[s.file].lz4_bytes if s.file in by_file else None,
            "sealed_to": by_file[s.file].sealed_to if s.file in by_file else None,
        } for s in report.scans],
        "sealed": {r.task.file: r.sealed_to for r in results if r.sealed_to is not None},
        "rmgr": {name: {"records": c, "record_bytes": r, "fpi_bytes": f}
                 for name, (c, r, f) in rmgr_totals(report.scans).items()},
        "problems": [{"kind": p.kind, "file": p.file, "lsn": format_lsn(p.lsn),
                      "detail": p.detail, "severity": p.severity} for p in report.problems],
        "problems_not_listed": report.unlisted_problems,
    }


def report_lines(report: ArchiveReport, directory: str, results: list[FileResult]) -> list[str]:
    """The report for people."""
    scans = report.scans
    timelines = sorted({s.timeline for s in scans})
    total = sum(s.data_bytes for s in scans)
    lines = [f"archive {directory}: {len(scans)} segments of {report.segment_size >> 20} MiB "
             f"on timeline(s) {', '.join(map(str, timelines)) or '-'}, system identifier "
             f"{report.system_identifier}",
             f"scanner: {nativescan.scanner_path()}"]
    for tli in timelines:
        own = [s for s in scans if s.timeline == tli]
        lines.append(f"  timeline {tli}: {own[0].file} .. {own[-1].file} ({len(own)} files)")
    totals = rmgr_totals(scans)
    records = sum(c for c, _, _ in totals.values())
    lines.append(f"records: {records} in {total / 1e6:.1f} MB of WAL")
    lines.append(f"  {'rmgr':<18} {'records':>10} {'record bytes':>14} {'FPI bytes':>14}")
    lines += [f"  {name:<18} {c:>10} {r:>14} {f:>14}" for name, (c, r, f) in totals.items()]
    zst = [r.zstd_bytes for r in results if r.zstd_bytes is not None]
    lz = [r.lz4_bytes for r in results if r.lz4_bytes is not None]
    if zst and lz:
        raw = sum(r.scan.data_bytes for r in results if r.scan and r.zstd_bytes is not None)
        lines.append(f"compressibility: zstd-1 {sum(zst) / raw:.1%}, lz4 {sum(lz) / raw:.1%} "
                     "of the raw size")
    lines += sealed_lines(results)
    rec = report.recovery
    if rec is None and any(r.sealed_to is not None for r in results):
        lines.append("recovery: not known, no segment could be read (sealed: --identity)")
    elif rec is None:
        lines.append("recovery: impossible, the archive holds no segment file")
    else:
        end = "the end of the archive" if rec.complete else rec.stop_reason
        lines.append(f"recovery on timeline {rec.timeline} from {format_lsn(rec.start_lsn)} "
                     f"reaches {format_lsn(rec.end_lsn)} ({end})")
    listed = [p for p in report.problems if p.kind != NOT_CHECKED]
    errors = [p for p in listed if p.severity == "error"]
    unlisted = report.unlisted_problems
    lines.append(f"problems: {len(errors)} error(s), "
                 f"{len(listed) - len(errors)} warning(s)"
                 + (f", {unlisted} more not listed" if unlisted else ""))
    lines += ["  " + p.describe() for p in listed]
    if unlisted:
        lines.append(f"  ... and {unlisted} more problems")
    unread = not_checked_line(report.problems, results)
    if unread is not None:
        lines.append(unread)
    lines.append(verdict_line(verdict_of(report)))
    return lines


def histories_of(location: Location, names: Iterable[str], problems: list[WalProblem],
                 ) -> Mapping[int, str]:
    """The text of each history file among ``names`` at ``location`` (read by
    :func:`~receivewal.archive.view.read_histories`); one that cannot be read (not a regular
    file, too large) is left out, with a problem naming it added to ``problems``."""
    failed: list[tuple[str, Exception]] = []
    found = read_histories(location, names, failed)
    for name, exc in failed:
        detail = f'cannot read "{location.where(name)}": {exc.strerror or exc}' \
            if isinstance(exc, OSError) else str(exc)
        problems.append(WalProblem("unreadable", name, 0, detail))
    return {timeline: data.decode(errors="replace") for timeline, data in found.items()}
