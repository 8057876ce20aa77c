"""Catch-up throughput of ``receivewal stream`` against ``pg_receivewal`` on the same WAL.

Run by hand (not in CI):  .venv/bin/python bench/stream_throughput.py [--gb 1] [--runs 3]

It starts a private PostgreSQL, creates one slot per run (all reserving WAL at the same point),
writes at least ``--gb`` GB of WAL, then lets each tool catch up from its own slot into an empty
directory up to the same end LSN, alternating the tools, in ``--no-sync`` and default
durability. For every run it measures wall time, CPU time (user + system of the process) and
peak RSS with wait4(), and the start-up: the time until the tool says it started streaming
(receivewal's ``streaming_started`` event, pg_receivewal -v's "starting log streaming"). It
prints MB/s over the whole run and in steady state (WAL bytes / (wall - start-up)), CPU seconds
per GB, peak RSS and start-up per tool, and the ratios.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from support.servers import pg_bin, running_server

RECEIVEWAL = [sys.executable, "-m", "receivewal", "stream", "--log-format", "json"]
STREAMING = (b"streaming_started", b"starting log streaming")  # receivewal, pg_receivewal -v

Sample = tuple[float, float, int, float]  # wall s, CPU s, peak RSS KiB, start-up s


def run_one(argv: list[str]) -> Sample:
    """(wall s, CPU s, peak RSS KiB, start-up s) of one process run to completion."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    started: list[float] = []
    lines: list[bytes] = []

    def watch() -> None:  # timestamp the line that says streaming started
        assert proc.stderr is not None
        for line in proc.stderr:
            if not started and any(mark in line for mark in STREAMING):
                started.append(time.monotonic() - start)
            lines.append(line)

    reader = threading.Thread(target=watch)
    reader.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    reader.join()
    if os.waitstatus_to_exitcode(status) != 0 or not started:
        raise RuntimeError(f"{argv[0]} failed: {b''.join(lines)[-2000:].decode()}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, started[0]


def compile_package() -> None:
    """Write the package's bytecode before timing, as an installed package has it: where
    PYTHONDONTWRITEBYTECODE is set (the development VM) each start would otherwise compile
    every module of a checkout again, some 50 ms of CPU that no installed daemon pays."""
    import receivewal  # noqa: PLC0415 - only to find the package's directory

    compileall.compile_dir(str(Path(receivewal.__file__).parent), quiet=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0, help="GB of WAL to generate")
    parser.add_argument("--runs", type=int, default=3, help="runs per tool and durability")
    args = parser.parse_args()
    compile_package()
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
        results: dict[tuple[str, str], list[Sample]] = {}
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
                            if tool == "receivewal" else [pg_bin("pg_receivewal"), "-v", *common]
                        sample = run_one(argv)
                        results.setdefault((tool, mode), []).append(sample)
                        shutil.rmtree(target_dir)
                        print(f"  run {i + 1} {mode:9} {tool:13} {wal_bytes / 1e6 / sample[0]:7.1f}"
                              f" MB/s  cpu {sample[1]:5.2f}s  rss {sample[2] / 1024:5.1f} MB"
                              f"  start-up {sample[3]:.3f}s", flush=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    print_summary(results, wal_bytes, args.runs)


def print_summary(results: dict[tuple[str, str], list[Sample]], wal_bytes: int,
                  runs: int) -> None:
    """The table (markdown) and the ratios of receivewal to pg_receivewal."""
    modes, tools = ("--no-sync", "default"), ("receivewal", "pg_receivewal")
    gb = wal_bytes / 1e9
    print(f"\nmedians of {runs} runs of {wal_bytes / 1e6:.0f} MB (peak RSS: the largest)")
    print("| durability | tool | MB/s | steady MB/s | CPU s per GB | peak RSS MB | start-up s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    summary: dict[tuple[str, str], tuple[float, float, float, float, float]] = {}
    for mode in modes:
        for tool in tools:
            samples = results[(tool, mode)]
            mbs = statistics.median(wal_bytes / 1e6 / r[0] for r in samples)
            steady = statistics.median(wal_bytes / 1e6 / (r[0] - r[3]) for r in samples)
            cpu = statistics.median(r[1] for r in samples) / gb
            rss = max(r[2] for r in samples) / 1024
            startup = statistics.median(r[3] for r in samples)
            summary[(tool, mode)] = (mbs, steady, cpu, rss, startup)
            print(f"| {mode} | {tool} | {mbs:.1f} | {steady:.1f} | {cpu:.2f} | {rss:.1f} | "
                  f"{startup:.3f} |")
    print()
    for mode in modes:
        ours, theirs = summary[("receivewal", mode)], summary[("pg_receivewal", mode)]
        print(f"{mode}: receivewal/pg_receivewal throughput {ours[0] / theirs[0]:.2f}x "
              f"(steady state {ours[1] / theirs[1]:.2f}x), CPU per GB {ours[2] / theirs[2]:.2f}x, "
              f"peak RSS {ours[3]:.1f} MB, start-up {ours[4]:.3f} s vs {theirs[4]:.3f} s")


if __name__ == "__main__":
    main()
