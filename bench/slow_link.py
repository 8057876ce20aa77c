"""pg_receivewal against ``receivewal stream`` across a shaped link (10 and 100 Mbit/s).
Run by hand as root, not in CI::

    .venv/bin/python bench/slow_link.py [--rates 10,100] [--rounds 1] [--scale 5]
                                        [--transactions 3000] [--modes pg_receivewal,...]
                                        [--baseline DIR]

It makes two network namespaces of its own joined by a veth pair (10.200.0.1 on the primary's
side, 10.200.0.2 on the receiver's side: the addresses exist only on those two veth ends, in
those two namespaces) and shapes both directions with ``tc qdisc ... tbf`` (this kernel has no
netem, so no added delay). A PostgreSQL primary (without pg_streampack) and ``receivewal relay``
run in the primary's namespace; the receivers run in the other one, so every byte they get
crosses the shaped link. A fixed range of pgbench WAL (whole segments, held by replication
slots) ``--rounds`` times per link rate and mode, the modes alternating within each round (the
fastest round is shown):

- ``pg_receivewal``: the C tool, straight to the primary;
- ``receivewal zstd`` / ``lz4`` / ``none``: ``receivewal stream --compression ...`` through the
  relay, which compresses next to the primary;
- with ``--baseline DIR``, each ``receivewal`` mode again through the relay of the source tree
  DIR (e.g. ``git archive main | tar -x -C DIR``), the receiver unchanged: the relay's change.

Every archive is compared byte for byte with the server's pg_wal. Reported per run: link bytes
(both directions, counted on the veth), wall time (process start to exit), the time from
START_REPLICATION to exit (pg_receivewal: its ``-v`` line "starting log streaming"; receivewal:
its ``streaming_started`` event; both stamped when the line reaches this script), the time the
link was busy (from 1 % to 99 % of its bytes, sampled every 2 ms), the relay's CPU seconds, and
the speed-up over pg_receivewal next to the byte ratio (WAL bytes / link bytes). Namespaces, veth,
processes and temporary directories are removed on exit, also on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import filecmp
import math
import os
import shutil
import signal
import socket
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

from support.memory import cpu_seconds
from support.servers import PgServer, make_shared_dir, pg_bin

from receivewal.wal.lsn import format_lsn, parse_lsn
from receivewal.wal.names import wal_file_name

MB = 1_000_000
SEGMENT = 16 << 20
CLONE_NEWNET = 0x40000000
SERVER_ADDR = "10.200.0.1"
CLIENT_ADDR = "10.200.0.2"
MODES = ("pg_receivewal", "receivewal zstd", "receivewal lz4", "receivewal none")
BASELINE = " (baseline)"
#: The line each receiver prints once START_REPLICATION is under way.
START_MARKERS = {"pg_receivewal": "starting log streaming", "receivewal": '"streaming_started"'}
#: receivewal -v says "connecting" once imported and set up, just before libpq connects.
CONNECT_MARKER = '"connecting"'


@dataclass(frozen=True)
class Link:
    """The two namespaces and the veth ends between them."""

    server_ns: str
    client_ns: str
    server_if: str
    client_if: str


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


# -- namespaces and the shaped link ------------------------------------------------------------


def setns(path: str) -> None:
    """Move the calling process (thread) into the network namespace at ``path``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


def run(*argv: str) -> None:
    """Run a set-up command; on failure, raise with its own error message."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")


def ip(*args: str) -> None:
    run("ip", *args)


@contextlib.contextmanager
def private_link() -> Iterator[Link]:
    """Two fresh namespaces joined by a veth pair; this process runs in the server's one."""
    tag = f"{os.getpid() % 100000}"
    link = Link(f"rwslow-srv-{tag}", f"rwslow-cli-{tag}", f"rws{tag}s", f"rws{tag}c")
    root = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        for ns in (link.server_ns, link.client_ns):
            ip("netns", "add", ns)
        ip("-n", link.server_ns, "link", "add", link.server_if, "type", "veth",
           "peer", "name", link.client_if, "netns", link.client_ns)
        for ns, dev, addr in ((link.server_ns, link.server_if, SERVER_ADDR),
                              (link.client_ns, link.client_if, CLIENT_ADDR)):
            ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        setns(f"/run/netns/{link.server_ns}")
        yield link
    finally:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.setns(root, CLONE_NEWNET)
        os.close(root)
        for ns in (link.server_ns, link.client_ns):  # deleting a namespace deletes its veth
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def shape(link: Link, mbit: int) -> None:
    """Token bucket at ``mbit`` Mbit/s on both veth ends (bucket: 10 ms of traffic, >= 16 kB)."""
    burst = max(mbit * 1_000_000 // 8 // 100, 16_384)
    for ns, dev in ((link.server_ns, link.server_if), (link.client_ns, link.client_if)):
        run("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
            "rate", f"{mbit}mbit", "burst", str(burst), "latency", "50ms")


class LinkWatch:
    """Samples a device's byte count every 2 ms in a thread, to say when the link was busy."""

    def __init__(self, dev: str) -> None:
        self.dev = dev
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)  # same namespace as this thread

    def __enter__(self) -> LinkWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.samples.append((time.monotonic(), link_bytes(self.dev)))

    def busy(self) -> tuple[float, float]:
        """The samples that passed 1 % and 99 % of the bytes moved: the transfer itself,
        without the hand-shakes before and the tail after."""
        first, last = self.samples[0][1], self.samples[-1][1]
        moved = max(last - first, 1)
        begin = next(t for t, n in self.samples if n - first >= moved / 100)
        end = next(t for t, n in self.samples if n - first >= moved * 99 / 100)
        return begin, end


def link_bytes(dev: str) -> int:
    """rx + tx bytes of a device of this process's namespace (its /proc/net/dev)."""
    for line in Path("/proc/self/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == dev:
            fields = counters.split()
            return int(fields[0]) + int(fields[8])
    raise LookupError(f"no device {dev}")


# -- the primary and its WAL -------------------------------------------------------------------


@dataclass(frozen=True)
class WalRange:
    start: int
    end: int
    slots: tuple[str, ...]


def make_wal(server: PgServer, runs: int, scale: int, transactions: int) -> WalRange:
    """Reserve one slot per run (and one that holds the range), write pgbench WAL, and switch
    segments: the range is whole segments [start, end) of timeline 1."""
    slots = tuple(f"bench_{i}" for i in range(runs + 1))
    for slot in slots:
        server.sql(f"SELECT pg_create_physical_replication_slot('{slot}', true)")
    restart = server.sql("SELECT min(restart_lsn), max(restart_lsn) FROM pg_replication_slots")
    first, last = (parse_lsn(x) for x in restart.split("|"))
    start = first // SEGMENT * SEGMENT
    assert last // SEGMENT * SEGMENT == start, "slots reserved WAL in different segments"
    pgbench = [pg_bin("pgbench"), "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres"]
    subprocess.run([*pgbench, "-i", "-q", "-s", str(scale), "postgres"],
                   check=True, capture_output=True)
    subprocess.run([*pgbench, "-c", "2", "-t", str(transactions), "postgres"],
                   check=True, capture_output=True)
    switch_end = parse_lsn(server.switch_wal())
    end = (switch_end - 1) // SEGMENT * SEGMENT + SEGMENT
    # pg_receivewal -E stops only on a message that goes past the end position: give it one
    server.sql("CREATE TABLE after_range AS SELECT generate_series(1, 1000) AS x")
    assert parse_lsn(server.sql("SELECT pg_current_wal_flush_lsn()")) > end
    return WalRange(start, end, slots[:-1])


def check_archive(server: PgServer, directory: Path, wal: WalRange) -> None:
    """The archive holds the range's segments, each equal to the server's file. pg_receivewal
    writes whole messages, so a ``.partial`` of the segment at the range's end may follow."""
    names = {wal_file_name(1, segno, SEGMENT)
             for segno in range(wal.start // SEGMENT, wal.end // SEGMENT)}
    beyond = {wal_file_name(1, wal.end // SEGMENT, SEGMENT) + ".partial"}
    found = {p.name for p in directory.iterdir() if p.name.startswith("00000001")}
    if not names <= found or found - names - beyond:
        raise AssertionError(f"{directory}: segments {sorted(found ^ names)} differ from "
                             f"the range {format_lsn(wal.start)}..{format_lsn(wal.end)}")
    for name in sorted(names):
        if not filecmp.cmp(directory / name, server.pg_wal / name, shallow=False):
            raise AssertionError(f"{directory / name} differs from the server's pg_wal")


# -- the receivers -----------------------------------------------------------------------------


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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


def time_receiver(argv: list[str], marker: str, enter: Callable[[], None]) -> Timed:
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
        rc = proc.wait(600)
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
                                  lambda: setns(f"/run/netns/{link.client_ns}"))
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
    connect (receivewal only); link = the transfer (1 % to 99 % of the link bytes); relay =
    the relay's CPU seconds during the run; speed-up over pg_receivewal's wall time at the
    same rate."""
    print(f"{'Mbit/s':>6} {'mode':<27} {'link MB':>8} {'ratio':>6} {'wall s':>7} "
          f"{'start s':>7} {'boot s':>6} {'stream s':>8} {'link s':>6} {'relay s':>7} "
          f"{'speed-up':>8} {'of ratio':>8}")
    for rate in sorted({r.rate for r in runs}):
        group = [r for r in runs if r.rate == rate]
        base = next((r for r in group if r.mode == "pg_receivewal"), None)
        for r in group:
            ratio = r.wal_bytes / r.link_bytes
            speedup = base.wall / r.wall if base else math.nan
            boot = "-" if r.connecting is None else f"{r.connecting:.2f}"
            relay_cpu = "-" if r.relay_cpu is None else f"{r.relay_cpu:.2f}"
            print(f"{rate:>6} {r.mode:<27} {r.link_bytes / MB:>8.1f} {ratio:>5.2f}x "
                  f"{r.wall:>7.2f} {r.wall - r.streaming:>7.2f} {boot:>6} {r.streaming:>8.2f} "
                  f"{r.link_busy:>6.2f} {relay_cpu:>7} {speedup:>7.2f}x {speedup / ratio:>8.1%}")


def on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through every clean-up below


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="10,100", help="link rates in Mbit/s")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes")
    parser.add_argument("--rounds", type=int, default=1, help="runs per rate and mode (best "
                        "wall time is shown)")
    parser.add_argument("--scale", type=int, default=5, help="pgbench -i scale factor")
    parser.add_argument("--transactions", type=int, default=3000,
                        help="pgbench -t per client (2 clients)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a source tree whose relay runs too, alternated with this one's")
    parser.add_argument("--trace", action="store_true",
                        help="print each receiver's log lines with their times, and the "
                        "link's busy span")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("slow_link.py: must run as root (network namespaces, tc)")
    if not (shutil.which("ip") and shutil.which("tc")):
        sys.exit("slow_link.py: needs ip and tc (apt-get install iproute2)")
    rates = [int(x) for x in args.rates.split(",")]
    modes = [m.strip() for m in args.modes.split(",")]
    unknown = set(modes) - set(MODES)
    if unknown:
        sys.exit(f"slow_link.py: unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    if args.baseline is not None:
        modes = [m for mode in modes
                 for m in ([mode] if mode == "pg_receivewal" else [mode, mode + BASELINE])]
    signal.signal(signal.SIGTERM, on_sigterm)
    runs: list[Run] = []
    with private_link() as link, contextlib.ExitStack() as stack:
        base = make_shared_dir("receivewal-slowlink-")
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        server = PgServer(base)  # constructed in the server namespace: its port is free there
        server.init({"listen_addresses": f"'127.0.0.1,{SERVER_ADDR}'",
                     "max_wal_size": "'2GB'", "checkpoint_timeout": "'30min'",
                     "max_replication_slots": str(len(rates) * len(modes) * args.rounds + 2)})
        with (server.datadir / "pg_hba.conf").open("a") as hba:
            hba.write(f"host replication all {CLIENT_ADDR}/32 trust\n")
        stack.callback(server.stop, "immediate")
        server.start_or_fail()
        wal = make_wal(server, len(rates) * len(modes) * args.rounds, args.scale,
                       args.transactions)
        print(f"{(wal.end - wal.start) / MB:.1f} MB of pgbench WAL (-i -s {args.scale}, "
              f"2 x {args.transactions} transactions): {format_lsn(wal.start)} .. "
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
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    report(runs)


if __name__ == "__main__":
    main()
