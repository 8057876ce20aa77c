"""pg_receivewal against ``receivewal stream`` across a shaped link (10 and 100 Mbit/s).
Run by hand as root, not in CI::

    .venv/bin/python bench/slow_link.py [--rates 10,100] [--rounds 1] [--scale 5]
                                        [--transactions 3000 | --mb 84] [--trace]
                                        [--modes pg_receivewal,...] [--baseline DIR]

It makes two network namespaces of its own joined by a veth pair (bench/shaped_link.py: the
primary's side 10.200.0.1, the receiver's 10.200.0.2, addresses that exist only there) and
shapes both directions with ``tc qdisc ... tbf`` (no netem here: no added delay). A primary
(without pg_streampack) and ``receivewal relay`` run in the primary's namespace, the receivers
in the other, so every byte they get crosses the shaped link. A fixed range of pgbench WAL
(whole segments, held by replication slots: bench/wal_range.py) ``--rounds`` times per link
rate and mode, the modes alternating within each round (the fastest round is shown, and the
spread of the runs):

- ``pg_receivewal``: the C tool, straight to the primary;
- ``receivewal zstd`` / ``lz4`` / ``none``: ``receivewal stream --compression ...`` through the
  relay, which compresses next to the primary;
- with ``--baseline DIR``, each ``receivewal`` mode again through the relay of the source tree
  DIR (e.g. ``git archive main | tar -x -C DIR``), the receiver unchanged: the relay's change.

Every archive is compared byte for byte with the server's pg_wal. Reported per run: link bytes
(both directions, counted on the veth), wall time (process start to exit), the time from
START_REPLICATION to exit (pg_receivewal: its ``-v`` line "starting log streaming"; receivewal:
its ``streaming_started`` event; both stamped when the line reaches this script), the time the
link was busy (from 1 % to 99 % of its bytes, sampled every 2 ms) and the stream's time before
and after it, the relay's CPU seconds, and the speed-up over pg_receivewal next to the byte ratio
(WAL bytes / link bytes), by wall time and by stream time (start-up left out). ``--mb`` grows the
WAL (a slow link's archiver streams for hours; 84 MB cross 100 Mbit/s compressed in half a
second), ``--trace`` prints each receiver's log lines with their times. Namespaces, veth,
processes and temporary directories are removed on exit, also on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

from shaped_link import (
    CLIENT_ADDR,
    SERVER_ADDR,
    Link,
    LinkWatch,
    free_port,
    link_bytes,
    private_link,
    setns,
    shape,
)
from support.memory import cpu_seconds
from support.servers import PgServer, make_shared_dir, pg_bin
from wal_range import DEFAULT_MB, SCALE, TRANSACTIONS, WalRange, check_archive, make_wal, volume

from receivewal.wal.lsn import format_lsn

MB = 1_000_000
MODES = ("pg_receivewal", "receivewal zstd", "receivewal lz4", "receivewal none")
BASELINE = " (baseline)"
#: The line each receiver prints once START_REPLICATION is under way.
START_MARKERS = {"pg_receivewal": "starting log streaming", "receivewal": '"streaming_started"'}
#: receivewal -v says "connecting" once imported and set up, just before libpq connects.
CONNECT_MARKER = '"connecting"'


@dataclass
class Run:
    rate: int
    mode: str
    wal_bytes: int
    link_bytes: int
    wall: float
    streaming: float  # seconds from START_REPLICATION to exit
    connecting: float | None  # receivewal: seconds from exec to its "connecting" event
    link_busy: float  # seconds from 1 % to 99 % of the link bytes
    relay_cpu: float | None  # CPU seconds of the relay during the run (receivewal)
    lead: float  # seconds from START_REPLICATION to 1 % of the link bytes
    tail: float  # seconds from 99 % of the link bytes to exit


# -- the receivers -----------------------------------------------------------------------------


@contextlib.contextmanager
def relay(server: PgServer, compression: str,
          source: Path | None = None) -> Iterator[tuple[int, int]]:
    """``receivewal relay`` on the primary's side of the link (imported from the source tree
    ``source`` if given); yields its port and pid."""
    port = free_port(SERVER_ADDR)
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(source),
                                                          env.get("PYTHONPATH"))))
    proc = subprocess.Popen(
        [sys.executable, "-m", "receivewal", "relay", "--listen", f"{SERVER_ADDR}:{port}",
         "--upstream", f"127.0.0.1:{server.port}", "--compression", compression,
         # the link is a private veth pair between two namespaces of this script's own: plain
         # TCP to the one client address there (a non-loopback listener requires TLS otherwise)
         "--client-tls", "disable", "--allow", f"{CLIENT_ADDR}/32"],
        stderr=subprocess.DEVNULL, env=env, cwd=source)  # -m puts the cwd first on sys.path
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection((SERVER_ADDR, port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        yield port, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def receiver_argv(mode: str, port: int, directory: Path, slot: str, end: int) -> list[str]:
    common = ["-D", str(directory), "-h", SERVER_ADDR, "-p", str(port), "-U", "postgres",
              "-S", slot, "-w", "-n"]
    if mode == "pg_receivewal":
        return [pg_bin("pg_receivewal"), *common, "-E", format_lsn(end), "-v"]
    compression = mode.split()[1]
    return [sys.executable, "-m", "receivewal", "stream", *common, "--endpos", format_lsn(end),
            "--compression", compression, "--log-format", "json", "-v"]


def watch(stream: IO[bytes], markers: dict[str, float], lines: list[str],
          stamps: list[float]) -> None:
    """Read a receiver's stderr; stamp each line, and the first line carrying each marker."""
    for raw in stream:
        now = time.monotonic()
        line = raw.decode(errors="replace")
        lines.append(line)
        stamps.append(now)
        for marker, stamp in list(markers.items()):
            if not stamp and marker in line:
                markers[marker] = now


@dataclass
class Timed:
    """One receiver's run: monotonic stamps of its exec and exit, and its stderr lines."""

    began: float
    ended: float
    started: float  # the line saying START_REPLICATION is under way
    connecting: float | None  # receivewal's "connecting" event
    lines: list[tuple[float, str]]


def time_receiver(argv: list[str], marker: str, enter: Callable[[], None],
                  timeout: float) -> Timed:
    """Run one receiver in the client namespace and stamp its lines."""
    seen: dict[str, float] = {marker: 0.0, CONNECT_MARKER: 0.0}
    lines: list[str] = []
    stamps: list[float] = []
    began = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=enter)  # noqa: PLW1509 (single-threaded here)
    assert proc.stderr is not None
    reader = threading.Thread(target=watch, args=(proc.stderr, seen, lines, stamps))
    reader.start()
    try:
        rc = proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join()
    ended = time.monotonic()
    if rc != 0 or not seen[marker]:
        raise RuntimeError(f"{argv[0]} exited {rc}:\n{''.join(lines[-20:])}")
    return Timed(began, ended, seen[marker], seen[CONNECT_MARKER] or None,
                 list(zip(stamps, lines, strict=True)))


def run_once(server: PgServer, link: Link, wal: WalRange, *, rate: int, mode: str, slot: str,
             workdir: Path, baseline: Path | None, trace: bool = False) -> Run:
    directory = Path(tempfile.mkdtemp(prefix="archive-", dir=workdir))
    tool = mode.split(maxsplit=1)[0]
    with contextlib.ExitStack() as stack:
        port, pid = server.port, 0
        if tool == "receivewal":
            port, pid = stack.enter_context(relay(
                server, mode.split()[1], baseline if mode.endswith(BASELINE) else None))
        argv = receiver_argv(mode.removesuffix(BASELINE), port, directory, slot, wal.end)
        before = link_bytes(link.server_if)
        cpu = cpu_seconds(pid) if pid else 0.0
        with LinkWatch(link.server_if) as watch:
            timed = time_receiver(argv, START_MARKERS[tool],
                                  lambda: setns(f"/run/netns/{link.client_ns}"),
                                  600 + 3 * (wal.end - wal.start) * 8 / (rate * MB))
        relay_cpu = cpu_seconds(pid) - cpu if pid else None
        moved = link_bytes(link.server_if) - before
    check_archive(server, directory, wal)
    shutil.rmtree(directory)
    busy_from, busy_to = watch.busy()
    if trace:
        print_trace(timed, busy_from, busy_to)
    return Run(rate, mode, wal.end - wal.start, moved, timed.ended - timed.began,
               timed.ended - timed.started,
               None if timed.connecting is None else timed.connecting - timed.began,
               busy_to - busy_from, relay_cpu, busy_from - timed.started, timed.ended - busy_to)


def print_trace(timed: Timed, busy_from: float, busy_to: float) -> None:
    """The receiver's lines and the link's busy span, in seconds from its exec."""
    marks = [(stamp, line.strip()[:110]) for stamp, line in timed.lines]
    marks += [(busy_from, "-- link: 1 % of the bytes moved"),
              (busy_to, "-- link: 99 % of the bytes moved"), (timed.ended, "-- exit")]
    for stamp, text in sorted(marks):
        print(f"    {stamp - timed.began:7.3f}  {text}")


# -- report ------------------------------------------------------------------------------------


def report(runs: list[Run]) -> None:
    """One line per run; start = exec to START_REPLICATION, of which boot = exec to libpq's
    connect (receivewal only); stream = START_REPLICATION to exit, of which link = the transfer
    (1 % to 99 % of the link bytes), lead = before it and tail = after it; relay = the relay's
    CPU seconds during the run. Speed-up over pg_receivewal at the same rate and its share of
    the byte ratio, twice: by wall time (start-up included) and by stream time (without)."""
    print(f"{'Mbit/s':>6} {'mode':<27} {'link MB':>8} {'ratio':>6} {'wall s':>7} "
          f"{'start s':>7} {'boot s':>6} {'stream s':>8} {'link s':>6} {'lead s':>6} "
          f"{'tail s':>6} {'relay s':>7} {'speed-up':>8} {'of ratio':>8} "
          f"{'stream x':>8} {'of ratio':>8}")
    for rate in sorted({r.rate for r in runs}):
        group = [r for r in runs if r.rate == rate]
        base = next((r for r in group if r.mode == "pg_receivewal"), None)
        for r in group:
            ratio = r.wal_bytes / r.link_bytes
            speedup = base.wall / r.wall if base else math.nan
            streamup = base.streaming / r.streaming if base else math.nan
            boot = "-" if r.connecting is None else f"{r.connecting:.2f}"
            relay_cpu = "-" if r.relay_cpu is None else f"{r.relay_cpu:.2f}"
            print(f"{rate:>6} {r.mode:<27} {r.link_bytes / MB:>8.1f} {ratio:>5.2f}x "
                  f"{r.wall:>7.2f} {r.wall - r.streaming:>7.2f} {boot:>6} {r.streaming:>8.2f} "
                  f"{r.link_busy:>6.2f} {r.lead:>6.2f} {r.tail:>6.2f} {relay_cpu:>7} "
                  f"{speedup:>7.2f}x {speedup / ratio:>8.1%} {streamup:>7.2f}x "
                  f"{streamup / ratio:>8.1%}")


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}..{statistics.median(values):.2f}..{max(values):.2f}"


def on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through every clean-up below


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="10,100", help="link rates in Mbit/s")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes")
    parser.add_argument("--rounds", type=int, default=1, help="runs per rate and mode (best "
                        "wall time is shown)")
    parser.add_argument("--scale", type=int, default=None,
                        help=f"pgbench -i scale factor (default {SCALE})")
    parser.add_argument("--transactions", type=int, default=None,
                        help=f"pgbench -t per client, 2 clients (default {TRANSACTIONS})")
    parser.add_argument("--mb", type=float, default=None,
                        help=f"about this many MB of WAL: --scale and --transactions grow "
                        f"together from their defaults (which make {DEFAULT_MB} MB)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a source tree whose relay runs too, alternated with this one's")
    parser.add_argument("--trace", action="store_true",
                        help="print each receiver's log lines with their times, and the "
                        "link's busy span")
    args = parser.parse_args()
    if args.mb is not None and (args.scale or args.transactions):
        sys.exit("slow_link.py: --mb sets --scale and --transactions; give one or the other")
    scale, transactions = volume(args.mb, args.scale, args.transactions)
    if os.geteuid() != 0:
        sys.exit("slow_link.py: must run as root (network namespaces, tc)")
    if not (shutil.which("ip") and shutil.which("tc")):
        sys.exit("slow_link.py: needs ip and tc (apt-get install iproute2)")
    rates = [int(x) for x in args.rates.split(",")]
    modes = [m.strip() for m in args.modes.split(",")]
    if unknown := set(modes) - set(MODES):
        sys.exit(f"slow_link.py: unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    if args.baseline is not None:
        modes = [m for mode in modes
                 for m in ([mode] if mode == "pg_receivewal" else [mode, mode + BASELINE])]
    signal.signal(signal.SIGTERM, on_sigterm)
    runs: list[Run] = []
    spreads: list[str] = []
    with private_link() as link, contextlib.ExitStack() as stack:
        base = make_shared_dir("receivewal-slowlink-")
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        server = PgServer(base)  # constructed in the server namespace: its port is free there
        server.init({"listen_addresses": f"'127.0.0.1,{SERVER_ADDR}'",
                     "max_wal_size": f"'{max(2048, 3 * round(args.mb or 0))}MB'",
                     "checkpoint_timeout": "'30min'",
                     "max_replication_slots": str(len(rates) * len(modes) * args.rounds + 2)})
        with (server.datadir / "pg_hba.conf").open("a") as hba:
            hba.write(f"host replication all {CLIENT_ADDR}/32 trust\n")
        stack.callback(server.stop, "immediate")
        server.start_or_fail()
        wal = make_wal(server, len(rates) * len(modes) * args.rounds, scale, transactions)
        print(f"{(wal.end - wal.start) / MB:.1f} MB of pgbench WAL (-i -s {scale}, "
              f"2 x {transactions} transactions): {format_lsn(wal.start)} .. "
              f"{format_lsn(wal.end)}; cores: {os.cpu_count()}", flush=True)
        slots = iter(wal.slots)
        for rate in rates:
            shape(link, rate)
            tries: dict[str, list[Run]] = {mode: [] for mode in modes}
            for _ in range(args.rounds):
                for mode in modes:  # alternate the modes within each round
                    done = run_once(server, link, wal, rate=rate, mode=mode, slot=next(slots),
                                    workdir=base, baseline=args.baseline,
                                    trace=args.trace)
                    tries[mode].append(done)
                    print(f"  {rate} Mbit/s {mode}: {done.wall:.2f} s (start "
                          f"{done.wall - done.streaming:.2f} s, stream {done.streaming:.2f} s, "
                          f"relay cpu {done.relay_cpu or 0:.2f} s), archive identical",
                          flush=True)
            runs.extend(min(group, key=lambda r: r.wall) for group in tries.values())
            spreads.extend(f"{rate:>6} {mode:<27} wall {spread([r.wall for r in group])}, "
                           f"start {spread([r.wall - r.streaming for r in group])}, stream "
                           f"{spread([r.streaming for r in group])}"
                           for mode, group in tries.items() if len(group) > 1)
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    report(runs)
    if spreads:
        print("spread of the runs, min..median..max s:", *spreads, sep="\n")


if __name__ == "__main__":
    main()
