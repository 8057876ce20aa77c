"""Verify throughput (MB/s per core) next to ``pg_waldump --stats``, and the Spark job's time.

Usage (from the repository root)::

    .venv/bin/python bench/verify_throughput.py [--segments 8] [--archive DIR] [--no-spark]

Without ``--archive`` it starts a PostgreSQL 15 server (16 MiB segments, in a temporary
directory), writes ``--segments`` segments of WAL (200-byte row inserts, as the test harness's
``generate_wal`` does, then an index build and updates after a checkpoint for full-page
images), and copies the completed segments into an archive. Then it times, on the same files:

* ``pg_waldump --stats`` (one process; CPU time from ``getrusage`` of the child);
* the parser alone in this process (CPU time, files already in memory);
* ``verify_archive`` with one worker, with ``--compressibility``, and with a pool of all cores;
* ``analyze`` on an embedded ``local[*]`` Spark session: start-up, then the job.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from support.servers import PgServer, make_shared_dir, pg_bin

from receivewal.check.verify import rmgr_totals, verify_archive
from receivewal.wal.names import parse_segment_file_name
from receivewal.wal.reader import SegmentScanner

ROOT = Path(__file__).resolve().parent.parent

REPEATS = 3


def build_archive(out: Path, segments: int) -> None:
    """A server's completed segments after ``segments`` rounds of generated WAL."""
    base = make_shared_dir("receivewal-bench-")
    server = PgServer(base, "bench")
    try:
        server.init()
        server.start()
        server.generate_wal(max(1, segments - 2))
        server.sql("CHECKPOINT")
        server.sql("CREATE INDEX filler_id ON filler (id)")
        server.sql("UPDATE filler SET pad = 'u' WHERE id % 3 = 0")
        current = server.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
        server.switch_wal()
        out.mkdir(parents=True, exist_ok=True)
        for path in sorted(server.pg_wal.iterdir()):
            if len(path.name) == 24 and path.name < current:
                shutil.copy(path, out / path.name)
    finally:
        server.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def child_cpu() -> float:
    """CPU seconds used by finished children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_waldump(archive: Path, names: list[str]) -> tuple[float, int]:
    """Best CPU seconds of pg_waldump --stats over the archive, and the records it counted."""
    best_cpu = float("inf")
    records = 0
    for _ in range(REPEATS):
        cpu0 = child_cpu()
        out = subprocess.run([pg_bin("pg_waldump"), "--stats", "-p", str(archive), names[0],
                              names[-1]], capture_output=True, text=True, check=False)
        best_cpu = min(best_cpu, child_cpu() - cpu0)
        total = [line for line in out.stdout.splitlines() if line.startswith("Total")]
        records = int(total[0].split()[1]) if total else -1
    return best_cpu, records


def time_parser(archive: Path, names: list[str]) -> float:
    """Best CPU seconds of the parser alone over segments already in memory."""
    data = {n: (archive / n).read_bytes() for n in names}
    best = float("inf")
    for _ in range(REPEATS):
        began = time.process_time()
        for name, raw in data.items():
            seg = parse_segment_file_name(name, len(raw))
            assert seg is not None
            SegmentScanner(raw, name, start_lsn=seg.start_lsn(len(raw)), segment_size=len(raw),
                           timeline=seg.timeline, segno=seg.segno).scan()
        best = min(best, time.process_time() - began)
    return best


def time_verify(archive: Path, jobs: int, compressibility: bool = False) -> float:
    """Best wall seconds of verify_archive."""
    best = float("inf")
    for _ in range(REPEATS):
        began = time.perf_counter()
        verify_archive(archive, jobs=jobs, compressibility=compressibility)
        best = min(best, time.perf_counter() - began)
    return best


def time_spark(archive: Path) -> tuple[float, float, float]:
    """Session start-up, first and second job wall seconds on local[*]."""
    from receivewal.check.analyze import make_session, run_analyze  # noqa: PLC0415 - optional extra

    with tempfile.TemporaryDirectory() as tmp:
        began = time.perf_counter()
        spark = make_session(scratch=Path(tmp) / "scratch")
        started = time.perf_counter() - began
        jobs = []
        for i in range(2):
            t0 = time.perf_counter()
            run_analyze(spark, [str(archive)], Path(tmp) / f"out{i}")
            jobs.append(time.perf_counter() - t0)
        spark.stop()
    return started, jobs[0], jobs[1]


def main() -> None:
    """Build or take an archive, time everything, print one table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=8)
    parser.add_argument("--archive", type=Path)
    parser.add_argument("--no-spark", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        archive = args.archive or Path(tmp) / "archive"
        if args.archive is None:
            build_archive(archive, args.segments)
        names = sorted(p.name for p in archive.iterdir() if len(p.name) == 24)
        mb = sum((archive / n).stat().st_size for n in names) / 1e6
        report, _ = verify_archive(archive, jobs=1)
        records = sum(c for c, _, _ in rmgr_totals(report.scans).values())
        print(f"archive: {len(names)} segments, {mb:.0f} MB, {records} records "
              f"({mb * 1e6 / max(records, 1):.0f} bytes per record), "
              f"recoverable={report.recoverable}")
        wd_cpu, wd_records = time_waldump(archive, names)
        print(f"pg_waldump --stats counted {wd_records} records")
        parse_cpu = time_parser(archive, names)
        v1 = time_verify(archive, 1)
        v1c = time_verify(archive, 1, compressibility=True)
        vall = time_verify(archive, 0)
        rows = [
            ("pg_waldump --stats (1 process, CPU time)", wd_cpu, mb / wd_cpu),
            ("parser alone, in memory (CPU time)", parse_cpu, mb / parse_cpu),
            ("verify -j 1 (read + parse)", v1, mb / v1),
            ("verify -j 1 --compressibility", v1c, mb / v1c),
            ("verify, pool of all cores (wall)", vall, mb / vall),
        ]
        print(f"{'what':<44} {'seconds':>8} {'MB/s':>8}")
        for what, secs, rate in rows:
            print(f"{what:<44} {secs:>8.3f} {rate:>8.1f}")
        print(f"verify per core / pg_waldump per core: {(mb / v1) / (mb / wd_cpu):.2f} "
              f"(parser alone: {(mb / parse_cpu) / (mb / wd_cpu):.2f})")
        if not args.no_spark:
            started, first, second = time_spark(archive)
            print(f"spark local[*]: session start {started:.1f} s, analyze job {first:.1f} s "
                  f"(first), {second:.1f} s (warm session), "
                  f"{mb / second:.1f} MB/s incl. compressibility and Parquet")


if __name__ == "__main__":
    main()
