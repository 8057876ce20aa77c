"""Throughput of ``receivewal logical`` against ``pg_recvlogical`` on the same slot output, and
the memory of a streamed transaction.

Run by hand (not in CI):
    .venv/bin/python bench/logical_throughput.py [--rows 1000000] [--runs 2]
    .venv/bin/python bench/logical_throughput.py --streamed-mb 2048

The first form starts a private PostgreSQL 15 (wal_level=logical), creates one pgoutput slot per
run and tool (all at the same point), inserts ``--rows`` rows into a published table in
transactions of 10,000 rows, then lets each tool catch up from its own slot up to the same end
LSN, alternating the tools: ``pg_recvlogical --start -f FILE -o proto_version=1`` (the plugin's
raw output into one file, fsynced every 10 s, its default) and ``receivewal logical
--proto-version 1`` (the change log: decoded, JSON Lines, fsynced at each status update and at
the end). For every run it measures wall time and CPU time with wait4(), peak RSS (VmHWM), and
the start-up (until each says it is streaming), and prints it with the load average. Then changes
per second and plugin output MB/s (the bytes pg_recvlogical wrote, the same for both) over the
run after start-up, CPU seconds, CPU per change after start-up (less the CPU of a run of each
tool on a slot that sees one change), peak RSS, each round's ratio and their median, and the
ratio of the medians.

``--streamed-mb N`` instead writes one transaction of about N MB of rows with
``logical_decoding_work_mem`` at 64kB, so that the server streams it while in progress
(protocol 3, ``--streaming on``): receivewal spools it on disk until its commit and writes it to
the change log; the line printed is its peak RSS and how long it took.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from stream_throughput import compile_package, run_one
from support.logical import LOGICAL_CONF
from support.servers import PgServer, pg_bin, running_server

BATCH = 10_000  # rows per transaction
TOOLS = ("receivewal", "pg_recvlogical")
Sample = tuple[float, float, int, float]  # wall s, CPU s, peak RSS KiB, start-up s


def receivewal_argv(pg: PgServer, out: Path, slot: str, end: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "receivewal", "logical", "-D", str(out), "-d",
            f"host=127.0.0.1 port={pg.port} user=postgres dbname=bench", "-S", slot, "-P", "pub",
            "-E", end, "--log-format", "json", *extra]


def recvlogical_argv(pg: PgServer, out: Path, slot: str, end: str) -> list[str]:
    return [pg_bin("pg_recvlogical"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres",
            "-d", "bench", "-S", slot, "--start", "-E", end, "-f", str(out / "changes.bin"),
            "-o", "proto_version=1", "-o", "publication_names=pub", "--no-loop", "-v"]


def create_slot(pg: PgServer, slot: str) -> None:
    pg.sql(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')", "bench")


def prepare(pg: PgServer) -> None:
    pg.sql("CREATE DATABASE bench")
    pg.sql("CREATE TABLE t (id int PRIMARY KEY, v text, n int)", "bench")
    pg.sql("CREATE PUBLICATION pub FOR TABLE t", "bench")


def load_average() -> float:
    """The 1-minute load average now."""
    return os.getloadavg()[0]


def run_tool(pg: PgServer, tool: str, out: Path, slot: str, end: str) -> tuple[Sample, int]:
    """One tool's run from ``slot`` to ``end`` into ``out``; its sample and the plugin output
    bytes (pg_recvlogical's file; 0 for receivewal)."""
    out.mkdir()
    argv = receivewal_argv(pg, out, slot, end, "--proto-version", "1") \
        if tool == "receivewal" else recvlogical_argv(pg, out, slot, end)
    sample, _ = run_one(argv, env=dict(os.environ))
    size = (out / "changes.bin").stat().st_size if tool == "pg_recvlogical" else 0
    shutil.rmtree(out)
    os.sync()
    return sample, size


def throughput(rows: int, runs: int) -> None:
    """Alternating rounds of both tools on the same slot output; each run's line, then the
    medians, the per-round ratios and the CPU per change after start-up."""
    with running_server(LOGICAL_CONF | {"logical_decoding_work_mem": "'64MB'"}) as pg:
        prepare(pg)
        for run in range(runs):
            for tool in TOOLS:
                create_slot(pg, f"s_{tool}_{run}".replace("-", "_"))
        for first in range(1, rows + 1, BATCH):
            last = min(rows, first + BATCH - 1)
            pg.sql(f"INSERT INTO t SELECT g, md5(g::text), g FROM generate_series({first},"
                   f" {last}) g", "bench")
        for tool in TOOLS:  # start-up runs: these slots see one change
            create_slot(pg, f"s_{tool}_idle".replace("-", "_"))
        pg.sql(f"INSERT INTO t VALUES ({rows + 1}, md5('x'), 0)", "bench")
        changes = rows + 1
        end = pg.sql("SELECT pg_current_wal_lsn()", "bench")
        results: dict[str, list[Sample]] = {tool: [] for tool in TOOLS}
        idle: dict[str, Sample] = {}
        loads: list[float] = [load_average()]
        output_bytes = 0
        base = Path(tempfile.mkdtemp(prefix="logical-bench-"))
        try:
            for tool in TOOLS:
                idle[tool], _ = run_tool(pg, tool, base / f"{tool}-idle",
                                         f"s_{tool}_idle".replace("-", "_"), end)
            for run in range(runs):
                order = TOOLS if run % 2 == 0 else TOOLS[::-1]
                for tool in order:
                    sample, size = run_tool(pg, tool, base / f"{tool}-{run}",
                                            f"s_{tool}_{run}".replace("-", "_"), end)
                    results[tool].append(sample)
                    output_bytes = size or output_bytes
                    loads.append(load_average())
                    steady = max(sample[0] - sample[3], 1e-6)
                    print(f"  round {run + 1} {tool:15} {changes / steady:9.0f} changes/s  "
                          f"wall {sample[0]:6.2f}s  start-up {sample[3]:5.2f}s  CPU "
                          f"{sample[1]:5.2f}s  RSS {sample[2] / 1024:5.1f} MB  load "
                          f"{loads[-1]:.1f}", flush=True)
        finally:
            shutil.rmtree(base, ignore_errors=True)
    print_throughput(results, idle, changes, output_bytes, loads)


def print_throughput(results: dict[str, list[Sample]], idle: dict[str, Sample], changes: int,
                     output_bytes: int, loads: list[float]) -> None:
    """The medians per tool, the ratio of each round's pair and their median, and the CPU
    per change after start-up (each run's CPU less its tool's start-up run's)."""
    runs = len(results["receivewal"])
    print(f"{changes} changes ({changes // BATCH} transactions), plugin output "
          f"{output_bytes / 1e6:.1f} MB, {runs} rounds, load {min(loads):.1f}-{max(loads):.1f};"
          f" medians:")
    print(f"{'tool':16} {'wall s':>8} {'start s':>8} {'changes/s':>11} {'MB/s':>7} "
          f"{'CPU s':>7} {'µs/chg':>7} {'RSS MB':>7}")
    rates = {}
    for tool in TOOLS:
        wall = statistics.median(s[0] for s in results[tool])
        startup = statistics.median(s[3] for s in results[tool])
        cpu = statistics.median(s[1] for s in results[tool])
        per_change = (cpu - idle[tool][1]) / changes * 1e6
        rss = max(s[2] for s in results[tool]) / 1024
        steady = max(wall - startup, 1e-6)
        rates[tool] = changes / steady
        print(f"{tool:16} {wall:8.2f} {startup:8.2f} {changes / steady:11.0f} "
              f"{output_bytes / 1e6 / steady:7.1f} {cpu:7.2f} {per_change:7.2f} {rss:7.1f}")
    print(f"start-up runs (one change): CPU receivewal {idle['receivewal'][1]:.3f} s, "
          f"pg_recvlogical {idle['pg_recvlogical'][1]:.3f} s (subtracted for µs/chg); peak "
          f"RSS is the largest of the rounds")
    pairs = sorted((t[0] - t[3]) / (o[0] - o[3])
                   for o, t in zip(results["receivewal"], results["pg_recvlogical"],
                                   strict=True))
    print(f"per round: {' '.join(f'{p:.2f}x' for p in pairs)}; median of the rounds "
          f"{statistics.median(pairs):.2f}x")
    print(f"receivewal / pg_recvlogical, changes/s after start-up: "
          f"{rates['receivewal'] / rates['pg_recvlogical']:.2f}x")


def streamed(megabytes: int) -> None:
    rows = megabytes * 1_000_000 // 1100  # a row of about 1.1 kB of text
    with running_server(LOGICAL_CONF) as pg:
        prepare(pg)
        create_slot(pg, "big")
        pg.sql(f"INSERT INTO t SELECT g, repeat(md5(g::text), 32), g FROM generate_series(1,"
               f" {rows}) g", "bench")
        end = pg.sql("SELECT pg_current_wal_lsn()", "bench")
        base = Path(tempfile.mkdtemp(prefix="logical-bench-"))
        try:
            sample, _ = run_one(receivewal_argv(pg, base, "big", end, "--proto-version", "3",
                                                "--streaming", "on"), env=dict(os.environ))
            log_bytes = sum(path.stat().st_size for path in base.glob("*.jsonl*"))
        finally:
            shutil.rmtree(base, ignore_errors=True)
    print(f"one streamed transaction of {rows} rows ({megabytes} MB of rows), change log "
          f"{log_bytes / 1e6:.0f} MB: receivewal peak RSS {sample[2] / 1024:.1f} MB, wall "
          f"{sample[0]:.1f} s, CPU {sample[1]:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows inserted")
    parser.add_argument("--runs", type=int, default=2, help="runs per tool")
    parser.add_argument("--streamed-mb", type=int, default=0,
                        help="instead: one streamed transaction of about this many MB")
    args = parser.parse_args()
    compile_package()
    if args.streamed_mb:
        streamed(args.streamed_mb)
    else:
        throughput(args.rows, args.runs)


if __name__ == "__main__":
    main()
