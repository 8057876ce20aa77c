"""Catch-up throughput of ``receivewal stream`` against ``pg_receivewal`` on the same WAL.

Run by hand (not in CI):  .venv/bin/python bench/stream_throughput.py [--gb 1] [--runs 3]

It starts a private PostgreSQL, creates one slot per run (all reserving WAL at the same point),
writes at least ``--gb`` GB of WAL, then lets each tool catch up from its own slot into an empty
directory up to the same end LSN, alternating the tools, in ``--no-sync`` and default
durability. For every run it measures wall time and CPU time (user + system of the process) with
wait4(), peak RSS from the process's VmHWM (read every 10 ms while it runs), the load average,
and the start-up: the time until the tool says it started streaming (receivewal's
``streaming_started`` event, pg_receivewal -v's "starting log streaming"). It prints MB/s
over the whole run and in steady state (WAL bytes / (wall - start-up)), CPU seconds per GB,
peak RSS and start-up per tool, and the ratios: of the medians, and the spread (min, median,
max) of the ratios of the runs paired in each round. ``--python-too`` adds receivewal
with its pure-Python receive loop (``RECEIVEWAL_PURE_PYTHON=1``) to every round; the line of
each receivewal says which loop ran (``streaming_started``'s ``receive_path``). Between runs
the output is removed and ``sync`` waited for, so that no run pays for the last one's writeback.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
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
TOOLS = ("receivewal", "pg_receivewal")
PURE_TOOL = "receivewal-py"  # --python-too: receivewal with RECEIVEWAL_PURE_PYTHON=1


def run_one(argv: list[str], env: dict[str, str] | None = None) -> tuple[Sample, str]:
    """(wall s, CPU s, peak RSS KiB, start-up s) of one process run to completion, and the
    receive loop it said it ran ("" for pg_receivewal)."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
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
    peak = PeakRss(proc.pid)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    reader.join()
    peak.stop()
    if os.waitstatus_to_exitcode(status) != 0 or not started:
        raise RuntimeError(f"{argv[0]} failed: {b''.join(lines)[-2000:].decode()}")
    path = next((json.loads(line).get("receive_path", "") for line in lines
                 if STREAMING[0] in line), "")
    return (wall, usage.ru_utime + usage.ru_stime, peak.kib or usage.ru_maxrss, started[0]), path


class PeakRss:
    """The peak RSS of a running process, in KiB: its ``VmHWM``, read every 10 ms until it
    ends. wait4()'s ``ru_maxrss`` is no measure of a small program: it counts the pages of
    the forking Python (this bench, some 40 MB) from before the exec."""

    def __init__(self, pid: int) -> None:
        self.kib = 0
        self._path = f"/proc/{pid}/status"
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._done.is_set():
            try:
                with open(self._path, "rb") as status:
                    found = [line for line in status if line.startswith(b"VmHWM:")]
            except OSError:  # gone
                return
            if found:  # not yet a zombie
                self.kib = max(self.kib, int(found[0].split()[1]))
            self._done.wait(0.01)

    def stop(self) -> None:
        """Stop reading (the process has ended)."""
        self._done.set()
        self._thread.join()


def load_average() -> str:
    """The 1-minute load average now, as the tables print it."""
    return f"{os.getloadavg()[0]:.1f}"


def slot_name(tool: str, mode: str, run: int) -> str:
    """The slot of one run (a slot name is lower-case letters, digits and underscores)."""
    return f"s_{tool}_{mode}_{run}".replace("-", "_").replace("__", "_")


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
    parser.add_argument("--python-too", action="store_true",
                        help="also run receivewal with its pure-Python receive loop")
    parser.add_argument("--pool", nargs="+", metavar="LOG", type=Path,
                        help="run nothing: summarise the runs printed in these saved outputs")
    args = parser.parse_args()
    if args.pool:
        pool_outputs(args.pool)
        return
    compile_package()
    modes = [("--no-sync", ["--no-sync"]), ("default", [])]
    tools = [*TOOLS, PURE_TOOL] if args.python_too else list(TOOLS)
    slots = [slot_name(t, m[0], i) for t in tools for m in modes for i in range(args.runs)]
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
        print(f"WAL to stream per run: {wal_bytes / 1e6:.0f} MB (up to {end_lsn}); load "
              f"{load_average()}\n", flush=True)
        results: dict[tuple[str, str], list[Sample]] = {}
        scratch = Path(tempfile.mkdtemp(prefix="receivewal-bench-"))
        try:
            for i in range(args.runs):
                for mode, flags in modes:
                    for tool in tools:  # alternate the tools within each round
                        slot = slot_name(tool, mode, i)
                        target_dir = scratch / slot
                        target_dir.mkdir()
                        common = ["-D", str(target_dir), "-d", pg.dsn, "-S", slot,
                                  "-E", end_lsn, "-n", *flags]
                        argv = [pg_bin("pg_receivewal"), "-v", *common] \
                            if tool == "pg_receivewal" \
                            else [*RECEIVEWAL, *common, "--compression", "none"]
                        env = {**os.environ, "RECEIVEWAL_PURE_PYTHON":
                               "1" if tool == PURE_TOOL else "0"}
                        sample, path = run_one(argv, env)
                        results.setdefault((tool, mode), []).append(sample)
                        shutil.rmtree(target_dir)
                        os.sync()  # the next run does not pay for this one's writeback
                        print(f"  run {i + 1} {mode:9} {tool:13} {wal_bytes / 1e6 / sample[0]:7.1f}"
                              f" MB/s  cpu {sample[1]:5.2f}s  rss {sample[2] / 1024:5.1f} MB"
                              f"  start-up {sample[3]:.3f}s  {path}  load {load_average()}",
                              flush=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    print_summary(results, wal_bytes, args.runs, tuple(tools))


RUN_LINE = re.compile(r"run \d+ (\S+)\s+(\S+)\s+([\d.]+) MB/s\s+cpu\s+([\d.]+)s\s+"
                      r"rss\s+([\d.]+) MB\s+start-up ([\d.]+)s")


def pool_outputs(paths: list[Path]) -> None:
    """One summary of the runs several invocations printed (same WAL size), pooled in order."""
    results: dict[tuple[str, str], list[Sample]] = {}
    sizes = set()
    for path in paths:
        text = path.read_text()
        found = re.search(r"WAL to stream per run: (\d+) MB", text)
        assert found is not None, f"{path}: not an output of this benchmark"
        wal_mb = int(found.group(1))
        sizes.add(wal_mb)
        for mode, tool, mbs, cpu, rss, startup in RUN_LINE.findall(text):
            results.setdefault((tool, mode), []).append(
                (wal_mb / float(mbs), float(cpu), int(float(rss) * 1024), float(startup)))
    tools = tuple(t for t in (*TOOLS, PURE_TOOL) if (t, "default") in results)
    print(f"pooled from {len(paths)} outputs ({', '.join(str(p) for p in paths)})")
    print_summary(results, max(sizes) * 1_000_000, len(results[("receivewal", "default")]),
                  tools)


def print_summary(results: dict[tuple[str, str], list[Sample]], wal_bytes: int,
                  runs: int, tools: tuple[str, ...] = TOOLS) -> None:
    """The table (markdown), the ratios of receivewal to pg_receivewal, and their spread."""
    modes = ("--no-sync", "default")
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
        for tool in (t for t in tools if t != "pg_receivewal"):
            ours, theirs = summary[(tool, mode)], summary[("pg_receivewal", mode)]
            print(f"{mode}: {tool}/pg_receivewal throughput {ours[0] / theirs[0]:.2f}x "
                  f"(steady state {ours[1] / theirs[1]:.2f}x), CPU per GB "
                  f"{ours[2] / theirs[2]:.2f}x, peak RSS {ours[3]:.1f} MB, start-up "
                  f"{ours[4]:.3f} s vs {theirs[4]:.3f} s")
            print_spread(results[(tool, mode)], results[("pg_receivewal", mode)])


def print_spread(ours: list[Sample], theirs: list[Sample]) -> None:
    """min / median / max of the ratios of the runs paired round by round."""
    speed = sorted(t[0] / o[0] for o, t in zip(ours, theirs, strict=True))
    cpu = sorted(o[1] / t[1] for o, t in zip(ours, theirs, strict=True))
    print(f"    per round ({len(speed)}): throughput {speed[0]:.2f}x / "
          f"{statistics.median(speed):.2f}x / {speed[-1]:.2f}x, CPU per GB {cpu[0]:.2f}x / "
          f"{statistics.median(cpu):.2f}x / {cpu[-1]:.2f}x (min / median / max)")


if __name__ == "__main__":
    main()
