"""Verify throughput (MB/s per core) next to ``pg_waldump --stats``, on both scanner paths.

Usage (from the repository root)::

    .venv/bin/python bench/verify_throughput.py [--segments 8] [--pgbench-seconds 20]
        [--archive DIR] [--spark] [--only-command] [--repeats 5] [--segment-mb 16] [--scale 5]
        [--command-segments 2,4,8]

Without ``--archive`` it starts a PostgreSQL 15 server (``--segment-mb`` MiB segments, 16 by
default, in a temporary directory) and builds two archives of completed segments:

* dense: pgbench's TPC-B-like transactions (small records) on ``--scale`` (5 by default),
  ``--segments`` segments of them;
* bulk load: ``--segments`` segments of 200-byte row inserts (as the tests' ``generate_wal``
  does), then an index build and updates after a checkpoint (full-page images).

On each, in one run: ``pg_waldump --stats`` (CPU time of the child, best of 3), then
``verify_archive`` with one worker (CPU time of this process: read + decompress + parse) on
the compiled scanner and on the pure-Python one (``receivewal.wal.nativescan``), and with a pool of
all cores (wall time). The ratios are verify's MB/s per core over pg_waldump's.

The same table has restore's check of a segment before it serves it
(:func:`receivewal.archive.segmentcheck.checked_segment`, the same scanner over one segment in
memory: CPU of this process, best of 3 per segment, on both paths), with its cost per 16 MiB
segment.

Then the whole command, start-up included: ``receivewal verify`` run as a subprocess (``-j 1``,
``-j`` of every core, and the default), against ``pg_waldump --stats`` on the same archive
(``--command-segments 2,4,8``: on its first 2, 4 and 8 segments), in ``--repeats`` alternating
rounds: wall and CPU seconds of each child (wait4), its peak RSS (VmHWM), the medians, the
load average. The ratio is pg_waldump's wall time over verify's, each round's and their
median (>= 1.0 is the target from 4 segments on). ``--only-command`` prints only this table.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stream_throughput import PeakRss
from support.servers import PgServer, make_shared_dir, pg_bin

from receivewal.check.verify import rmgr_totals, verify_archive
from receivewal.wal import nativescan

ROOT = Path(__file__).resolve().parent.parent

REPEATS = 3


def copy_completed(server: PgServer, out: Path) -> None:
    """Copy the server's completed segments (after a switch) into ``out``."""
    current = server.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
    server.switch_wal()
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(server.pg_wal.iterdir()):
        if len(path.name) == 24 and path.name < current:
            shutil.copy(path, out / path.name)


def build_archives(dense: Path, bulk: Path, segments: int, seconds: int, *,
                   segment_mb: int = 16, scale: int = 5) -> None:
    """The pgbench archive and the bulk-load archive, from one server each, with
    ``segment_mb`` MiB segments."""
    initdb_args = (f"--wal-segsize={segment_mb}",)
    base = make_shared_dir("receivewal-bench-")
    try:
        server = PgServer(base, "bulk")
        server.init(initdb_args=initdb_args)
        server.start()
        server.sql("CREATE TABLE filler (id bigint, pad text)")
        for _ in range(max(1, segments - 2)):  # as generate_wal: ~1 segment per round
            server.sql("INSERT INTO filler SELECT g, repeat('x', 200) "
                       f"FROM generate_series(1, {3750 * segment_mb}) g")
            server.sql("SELECT pg_switch_wal()")
        server.sql("CHECKPOINT")
        server.sql("CREATE INDEX filler_id ON filler (id)")
        server.sql("UPDATE filler SET pad = 'u' WHERE id % 3 = 0")
        copy_completed(server, bulk)
        server.stop("immediate")
        server = PgServer(base, "dense")
        server.init({"max_wal_size": "'4GB'", "checkpoint_timeout": "'30min'",
                     "synchronous_commit": "off"}, initdb_args=initdb_args)
        server.start()
        pgbench = [pg_bin("pgbench"), "-h", "127.0.0.1", "-p", str(server.port), "-U",
                   "postgres", "postgres"]
        subprocess.run([pgbench[0], "-i", "-q", "-s", str(scale), *pgbench[1:]], check=True,
                       capture_output=True)
        first = server.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
        while True:  # TPC-B until the load has filled ``segments`` segments
            subprocess.run([pgbench[0], "-T", str(seconds), "-c", "4", "-j", "2",
                            *pgbench[1:]], check=True, capture_output=True)
            now = server.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
            if int(now[8:], 16) - int(first[8:], 16) >= segments:
                break
        copy_completed(server, dense)
        for path in dense.iterdir():  # only the WAL of the TPC-B load, not of pgbench -i
            if path.name < first:
                path.unlink()
        server.stop("immediate")
    finally:
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


def time_verify(archive: Path, jobs: int, native: bool, wall: bool = False) -> float:
    """Best seconds of verify_archive on one scanner path: CPU time of this process with one
    worker (unless ``wall``), wall time with a pool."""
    saved = nativescan.native
    nativescan.native = nativescan.load_native() if native else None
    clock = time.process_time if jobs == 1 and not wall else time.perf_counter
    best = float("inf")
    try:
        for _ in range(REPEATS):
            began = clock()
            verify_archive(archive, jobs=jobs)
            best = min(best, clock() - began)
    finally:
        nativescan.native = saved
    return best


def time_spark(archive: Path) -> tuple[float, float, float]:
    """Session start-up, first and second job wall seconds on local[*]."""
    from receivewal.check.analyze import run_analyze  # noqa: PLC0415 - optional extra
    from receivewal.check.sparksession import make_session  # noqa: PLC0415

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


def time_command(argv: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and peak RSS (KiB, VmHWM) of running ``argv`` to its end."""
    began = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = PeakRss(proc.pid)
    _, _, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - began
    peak.stop()
    return wall, usage.ru_utime + usage.ru_stime, peak.kib or usage.ru_maxrss


def first_segments(archive: Path, count: int, into: Path) -> Path:
    """A directory of the first ``count`` segments of ``archive`` (hard links where it can:
    verify opens no symbolic link)."""
    into.mkdir()
    for name in sorted(p.name for p in archive.iterdir() if len(p.name) == 24)[:count]:
        try:
            os.link(archive / name, into / name)
        except OSError:  # another file system
            shutil.copy(archive / name, into / name)
    return into


def bench_command(label: str, archive: Path, repeats: int) -> None:
    """The whole ``receivewal verify`` command against ``pg_waldump --stats``, in alternating
    rounds: each run's wall, CPU and peak RSS, the medians, each round's ratio and their
    median, the load average."""
    names = sorted(p.name for p in archive.iterdir() if len(p.name) == 24)
    mb = sum((archive / n).stat().st_size for n in names) / 1e6
    verify = [sys.executable, "-m", "receivewal", "verify"]
    runs = [("pg_waldump --stats", [pg_bin("pg_waldump"), "--stats", "-p", str(archive),
                                    names[0], names[-1]]),
            ("receivewal verify -j 1", [*verify, "-j", "1", str(archive)]),
            (f"receivewal verify -j {os.cpu_count()}",
             [*verify, "-j", str(os.cpu_count()), str(archive)]),
            ("receivewal verify (default -j)", [*verify, str(archive)])]
    timed: dict[str, list[tuple[float, float, int]]] = {what: [] for what, _ in runs}
    loads = [os.getloadavg()[0]]
    for round_ in range(repeats):
        for what, argv in runs if round_ % 2 == 0 else runs[::-1]:
            timed[what].append(time_command(argv))
        loads.append(os.getloadavg()[0])
    waldump = timed[runs[0][0]]
    print(f"\n{label}, whole command, start-up included ({len(names)} segments, {mb:.0f} MB; "
          f"median of {repeats} alternating rounds, load {min(loads):.1f}-{max(loads):.1f}):")
    print(f"  {'what':<36} {'wall s':>8} {'CPU s':>8} {'RSS MB':>7} {'MB/s':>8} "
          f"{'x pg_waldump':>13}  per round")
    for what, _ in runs:
        wall = statistics.median(t[0] for t in timed[what])
        cpu = statistics.median(t[1] for t in timed[what])
        rss = max(t[2] for t in timed[what]) / 1024
        ratios = sorted(w[0] / t[0] for w, t in zip(waldump, timed[what], strict=True))
        print(f"  {what:<36} {wall:>8.3f} {cpu:>8.3f} {rss:>7.1f} {mb / wall:>8.1f} "
              f"{statistics.median(ratios):>13.2f}  {' '.join(f'{r:.2f}' for r in ratios)}")


def time_restore_check(archive: Path, names: list[str], native: bool) -> float:
    """CPU seconds of restore's checked_segment over every segment of ``archive`` (each read
    into memory first, each the best of REPEATS), on the C or the pure-Python scanner."""
    from receivewal.archive.segmentcheck import checked_segment  # noqa: PLC0415

    saved = nativescan.native
    nativescan.native = nativescan.load_native() if native else None
    try:
        total = 0.0
        for name in names:
            data = (archive / name).read_bytes()
            best = float("inf")
            for _ in range(REPEATS):
                began = time.process_time()
                checked_segment(data, name, None, segment_size=len(data))  # a whole one
                best = min(best, time.process_time() - began)
            total += best
    finally:
        nativescan.native = saved
    return total


def bench_archive(label: str, archive: Path) -> None:
    """Time pg_waldump --stats and verify (both paths) on one archive; print the rows."""
    names = sorted(p.name for p in archive.iterdir() if len(p.name) == 24)
    mb = sum((archive / n).stat().st_size for n in names) / 1e6
    report, _ = verify_archive(archive, jobs=1)
    records = sum(c for c, _, _ in rmgr_totals(report.scans).values())
    wd_cpu, wd_records = time_waldump(archive, names)
    print(f"\n{label}: {len(names)} segments, {mb:.0f} MB, {records} records "
          f"({mb * 1e6 / max(records, 1):.0f} bytes per record; pg_waldump counted "
          f"{wd_records}), recoverable={report.recoverable}")
    rows = [("pg_waldump --stats (CPU)", wd_cpu)]
    if nativescan.load_native() is not None:
        rows.append(("verify -j 1, C scanner (CPU)", time_verify(archive, 1, native=True)))
    rows.append(("verify -j 1, pure Python (CPU)", time_verify(archive, 1, native=False)))
    checks = []
    if nativescan.load_native() is not None:
        checks.append(("restore's check, C scanner (CPU)",
                       time_restore_check(archive, names, native=True)))
    checks.append(("restore's check, pure Python (CPU)",
                   time_restore_check(archive, names, native=False)))
    rows += checks
    if nativescan.load_native() is not None:
        rows.append(("verify -j 1, C scanner (wall)",
                     time_verify(archive, 1, native=True, wall=True)))
        rows.append((f"verify -j {os.cpu_count()}, C scanner (wall)",
                     time_verify(archive, 0, native=True)))
    print(f"  {'what':<36} {'seconds':>8} {'MB/s':>8} {'x pg_waldump':>13}")
    for what, secs in rows:
        print(f"  {what:<36} {secs:>8.3f} {mb / secs:>8.1f} {wd_cpu / secs:>13.2f}")
    for what, secs in checks:
        print(f"  {what}: {secs / len(names) * 1000:.1f} ms per segment")


def main() -> None:
    """Build or take the archives, time everything, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=8, help="segments per archive")
    parser.add_argument("--pgbench-seconds", type=int, default=5,
                        help="pgbench -T of each round, until --segments are full")
    parser.add_argument("--archive", type=Path, help="time this archive instead")
    parser.add_argument("--spark", action="store_true", help="also time analyze on Spark")
    parser.add_argument("--only-command", action="store_true",
                        help="only time the whole command against pg_waldump --stats")
    parser.add_argument("--repeats", type=int, default=5,
                        help="alternating rounds of the whole commands")
    parser.add_argument("--command-segments", default="",
                        help="time the whole commands on the first N segments of each archive,"
                        " for each N of this comma-separated list (default: all)")
    parser.add_argument("--segment-mb", type=int, default=16,
                        help="WAL segment size in MiB of the archives built (initdb --wal-segsize)")
    parser.add_argument("--scale", type=int, default=5, help="pgbench -i scale of the dense one")
    args = parser.parse_args()
    print(f"scanner: {nativescan.scanner_path()}; {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        if args.archive is not None:
            archives = [("archive", args.archive)]
        else:
            archives = [("dense (pgbench)", Path(tmp) / "dense"),
                        ("bulk load", Path(tmp) / "bulk")]
            build_archives(archives[0][1], archives[1][1], args.segments, args.pgbench_seconds,
                           segment_mb=args.segment_mb, scale=args.scale)
        for label, archive in archives:
            if not args.only_command:
                bench_archive(label, archive)
            for count in [int(n) for n in args.command_segments.split(",") if n]:
                bench_command(label, first_segments(archive, count,
                                                    Path(tmp) / f"{label.split()[0]}-{count}"),
                              args.repeats)
            if not args.command_segments:
                bench_command(label, archive, args.repeats)
        if args.spark:
            started, first, second = time_spark(archives[-1][1])
            print(f"spark local[*]: session start {started:.1f} s, analyze job {first:.1f} s "
                  f"(first), {second:.1f} s (warm session)")


if __name__ == "__main__":
    main()
