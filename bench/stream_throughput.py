"""Catch-up throughput of ``receivewal stream`` against ``pg_receivewal`` on the same WAL.

Run by hand (not in CI):  .venv/bin/python bench/stream_throughput.py [--gb 1] [--runs 3]

It starts a private PostgreSQL, creates one slot per run (all reserving WAL at the same point),
writes at least ``--gb`` GB of WAL, then lets each tool catch up from its own slot into an empty
directory up to the same end LSN, alternating the tools, in ``--no-sync`` and default
durability. For every run it measures wall time, CPU time (user + system of the process) and
peak RSS with wait4(), and prints MB/s, CPU seconds per GB and peak RSS per tool, and the ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from support.servers import pg_bin, running_server

RECEIVEWAL = [sys.executable, "-m", "receivewal", "stream", "--log-format", "json"]


def run_one(argv: list[str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, peak RSS KiB) of one process run to completion."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{argv[0]} failed: {err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="GB of WAL to generate")
    parser.add_argument("--runs", type=int, default=3, help="runs per tool and durability")
    args = parser.parse_args()
    modes = [("--no-sync", ["--no-sync"]), ("default", [])]
    tools = ["receivewal", "pg_receivewal"]
    slots = [f"s_{t}_{m[0].strip('-').replace('-', '_')}_{i}" for t in tools
             for m in modes for i in range(args.runs)]
    with running_server(conf={"max_replication_slots": str(len(slots) + 4),
                              "max_wal_senders": "8", "wal_keep_size": "0",
                              "max_wal_size": "'4GB'", "checkpoint_timeout": "'30min'"}) as pg:
        for slot in slots:
            pg.sql(f"SELECT pg_create_physical_replication_slot('{slot}', true)")
        start_lsn = pg.current_lsn()
        print(f"generating {args.gb:g} GB of WAL from {start_lsn} ...", flush=True)
        pg.sql("CREATE TABLE bench (id bigint, pad text)")
        target = int(args.gb * 1e9)
        while True:
            pg.sql("INSERT INTO bench SELECT g, repeat(md5(g::text), 6) "
                   "FROM generate_series(1, 500000) g")
            written = int(pg.sql(f"SELECT pg_current_wal_lsn() - '{start_lsn}'::pg_lsn"))
            if written >= target:
                break
        end_lsn = pg.current_lsn()
        wal_bytes = int(pg.sql(f"SELECT '{end_lsn}'::pg_lsn - "
                               f"(SELECT min(restart_lsn) FROM pg_replication_slots)"))
        print(f"WAL to stream per run: {wal_bytes / 1e6:.0f} MB (up to {end_lsn})\n", flush=True)
        results: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
        scratch = Path(tempfile.mkdtemp(prefix="receivewal-bench-"))
        try:
            for i in range(args.runs):
                for mode, flags in modes:
                    for tool in tools:  # alternate the tools within each round
                        slot = f"s_{tool}_{mode.strip('-').replace('-', '_')}_{i}"
                        target_dir = scratch / slot
                        target_dir.mkdir()
                        common = ["-D", str(target_dir), "-d", pg.dsn, "-S", slot,
                                  "-E", end_lsn, "-n", *flags]
                        argv = [*RECEIVEWAL, *common, "--compression", "none"] \
                            if tool == "receivewal" else [pg_bin("pg_receivewal"), *common]
                        sample = run_one(argv)
                        results.setdefault((tool, mode), []).append(sample)
                        shutil.rmtree(target_dir)
                        print(f"  run {i + 1} {mode:9} {tool:13} {wal_bytes / 1e6 / sample[0]:7.1f}"
                              f" MB/s  cpu {sample[1]:5.2f}s  rss {sample[2] / 1024:5.1f} MB",
                              flush=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    gb = wal_bytes / 1e9
    print(f"\n| durability | tool | MB/s (median of {args.runs}) | CPU s per GB | peak RSS MB |")
    print("|---|---|---:|---:|---:|")
    summary: dict[tuple[str, str], tuple[float, float, float]] = {}
    for mode, _ in modes:
        for tool in tools:
            runs = results[(tool, mode)]
            mbs = statistics.median(wal_bytes / 1e6 / r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs) / gb
            rss = max(r[2] for r in runs) / 1024
            summary[(tool, mode)] = (mbs, cpu, rss)
            print(f"| {mode} | {tool} | {mbs:.1f} | {cpu:.2f} | {rss:.1f} |")
    print()
    for mode, _ in modes:
        ours, theirs = summary[("receivewal", mode)], summary[("pg_receivewal", mode)]
        print(f"{mode}: receivewal/pg_receivewal throughput {ours[0] / theirs[0]:.2f}x, "
              f"CPU per GB {ours[1] / theirs[1]:.2f}x, peak RSS {ours[2]:.1f} MB")


if __name__ == "__main__":
    main()
