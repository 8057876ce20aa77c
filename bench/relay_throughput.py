"""Throughput of WAL through ``receivewal relay`` (zstd, lz4, pass-through) next to a direct
connection. Run by hand, not in CI::

    .venv/bin/python bench/relay_throughput.py [--scale 20] [--seconds 20] [--rounds 2]
    .venv/bin/python bench/relay_throughput.py --gb 2 --modes "relay zstd,relay lz4" \
        --rounds 3 --baseline /tmp/receivewal-before

A fresh server gets a pgbench run (initialisation plus a timed TPC-B-like load), or with
``--gb`` bulk INSERTs until that much WAL is written (the WAL of bench/stream_throughput.py);
the WAL is then streamed from its start to its end over a raw replication connection
(psycopg's pq layer, decoded with StreampackDecoder as the daemon does), directly and through
the relay. The "+tls" modes put TLS on the client leg (``--tls-cert``/``--tls-key``, a
certificate made for the run; the client connects with sslmode=require). ``--baseline DIR``
adds, for every relay mode, the same run with the relay imported from the source tree DIR
(e.g. ``git archive main | tar -x -C DIR``), alternated with this tree's run by run.

Reported per mode: MB/s of WAL delivered to the receiver, bytes on the wire (the XLogData
frames as received, before TLS), the ratio, CPU seconds per GB of WAL spent by the relay
process and by the receiver's decoder, and the relay's compression speed (WAL MB per CPU
second of the relay). The modes alternate within each of ``--rounds`` rounds; the best run
(by wall time) is shown with the spread of all runs (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from psycopg import pq
from support.certs import CertPair, TestCA
from support.memory import cpu_seconds
from support.servers import PgServer, free_port, pg_bin, running_server

from receivewal.replication.messages import XLOGDATA_TAG, XLogData, parse_copy_data
from receivewal.replication.streampack import StreampackDecoder
from receivewal.wal.lsn import format_lsn, parse_lsn

MB = 1_000_000


@dataclass
class Result:
    mode: str
    seconds: float
    wal_bytes: int
    wire_bytes: int
    relay_cpu: float
    decode_cpu: float


PROFILED = """
import cProfile, os, runpy, sys, time
profiler = cProfile.Profile(time.process_time)  # CPU time: the machine is shared
sys.argv[0] = "receivewal"
profiler.enable()
try:
    runpy.run_module("receivewal", run_name="__main__")
except SystemExit:
    pass
profiler.disable()
profiler.dump_stats(os.environ["RELAY_BENCH_PROFILE"])
"""


def start_relay(upstream: int, compression: str, tls: CertPair | None,
                source: Path | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """A relay on a free port; with ``source``, imported from that source tree."""
    port = free_port()
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(source),
                                                          env.get("PYTHONPATH"))))
    tls_options = (["--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--client-tls",
                    "require"] if tls else [])
    profile = os.environ.get("RELAY_BENCH_PROFILE")  # a path: cProfile this tree's relay
    command = ["-m", "receivewal"]
    if profile and source is None:
        command = ["-c", PROFILED]
        env["RELAY_BENCH_PROFILE"] = f"{profile}.{port}"
    proc = subprocess.Popen(
        [sys.executable, *command, "relay", "--listen", f"127.0.0.1:{port}",
         "--upstream", f"127.0.0.1:{upstream}", "--compression", compression, *tls_options],
        stderr=subprocess.DEVNULL, env=env, cwd=source)  # -m puts the cwd first on sys.path
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
        else:
            return proc, port


def stream(port: int, requested: str, start: int, end: int,
           sslmode: str = "disable") -> tuple[float, int, int, float]:
    """Stream [start, end) once; (seconds, WAL bytes, wire bytes, decoder CPU seconds)."""
    conninfo = f"host=127.0.0.1 port={port} user=postgres replication=true sslmode={sslmode}"
    if requested:
        conninfo += f" options='-c pg_streampack.requested={requested}'"
    conn = pq.PGconn.connect(conninfo.encode())
    assert conn.status == pq.ConnStatus.OK, conn.get_error_message()
    decoder = StreampackDecoder(tuple(requested.split(",")) if requested else ())
    wire = 0
    decode = 0.0
    began = time.perf_counter()
    res = conn.exec_(f"START_REPLICATION PHYSICAL {format_lsn(start)} TIMELINE 1".encode())
    assert res.status == pq.ExecStatus.COPY_BOTH, conn.get_error_message()
    position = start
    while position < end:
        nbytes, data = conn.get_copy_data(0)
        assert nbytes > 0, conn.get_error_message()
        if data[0] != XLOGDATA_TAG:
            continue
        wire += nbytes
        t0 = time.process_time()
        msg = parse_copy_data(data, decoder.decode)  # as the daemon does, without a copy
        decode += time.process_time() - t0
        assert isinstance(msg, XLogData)
        position = msg.end
    elapsed = time.perf_counter() - began
    conn.finish()
    return elapsed, decoder.stats().wal_bytes, wire, decode


MODES = ("direct", "relay plain", "relay zstd", "relay lz4", "relay plain+tls",
         "relay zstd+tls", "relay lz4+tls")


BASELINE = " (baseline)"


def run_mode(server: PgServer, mode: str, span: tuple[int, int], tls: CertPair,
             baseline: Path | None) -> Result:
    start, end = span
    if mode == "direct":
        seconds, wal, wire, decode = stream(server.port, "", start, end)
        return Result(mode, seconds, wal, wire, 0.0, decode)
    name, _, with_tls = mode.removesuffix(BASELINE).partition("+")
    compression = {"relay plain": "none", "relay zstd": "zstd", "relay lz4": "lz4"}[name]
    proc, port = start_relay(server.port, compression, tls if with_tls else None,
                             baseline if mode.endswith(BASELINE) else None)
    try:
        before = cpu_seconds(proc.pid)
        seconds, wal, wire, decode = stream(port, "" if compression == "none" else compression,
                                            start, end, "require" if with_tls else "disable")
        relay_cpu = cpu_seconds(proc.pid) - before
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    return Result(mode, seconds, wal, wire, relay_cpu, decode)


def make_wal(server: PgServer, scale: int, seconds: int, gb: float | None) -> tuple[int, int]:
    """Write the WAL to stream: pgbench, or ``gb`` GB of bulk INSERTs; its [start, end)."""
    start = parse_lsn(server.current_lsn()) // (16 << 20) * (16 << 20)
    if gb is not None:
        server.sql("CREATE TABLE bench (id bigint, pad text)")
        while parse_lsn(server.current_lsn()) - start < gb * 1e9:
            server.sql("INSERT INTO bench SELECT g, repeat(md5(g::text), 6) "
                       "FROM generate_series(1, 500000) g")
        end = parse_lsn(server.sql("SELECT pg_current_wal_flush_lsn()"))
        print(f"bulk INSERTs: {(end - start) / MB:.0f} MB of WAL ({format_lsn(start)} .. "
              f"{format_lsn(end)}), cores: {os.cpu_count()}")
        return start, end
    pgbench = [pg_bin("pgbench"), "-h", "127.0.0.1", "-p", str(server.port), "-U",
               "postgres", "postgres"]
    subprocess.run([*pgbench[:1], "-i", "-q", "-s", str(scale), *pgbench[1:]],
                   check=True, capture_output=True)
    subprocess.run([*pgbench[:1], "-c", "2", "-T", str(seconds), *pgbench[1:]],
                   check=True, capture_output=True)
    end = parse_lsn(server.sql("SELECT pg_current_wal_flush_lsn()"))
    print(f"pgbench -i -s {scale} + {seconds} s of TPC-B: "
          f"{(end - start) / MB:.0f} MB of WAL ({format_lsn(start)} .. {format_lsn(end)}), "
          f"cores: {os.cpu_count()}")
    return start, end


def print_table(results: dict[str, list[Result]]) -> None:
    """The best run of each mode (by wall time), and the spread of its runs."""
    print(f"{'mode':<26} {'WAL MB/s':>9} {'Mbit/s wire':>11} {'wire MB':>8} {'ratio':>6} "
          f"{'relay cpu s/GB':>14} {'relay MB/cpu-s':>14} {'decode cpu s/GB':>15}  "
          f"spread: WAL MB/s, relay cpu s/GB")
    for runs in results.values():
        best = min(runs, key=lambda r: r.seconds)
        gb = best.wal_bytes / 1e9
        speeds = sorted(r.wal_bytes / MB / r.seconds for r in runs)
        cpus = sorted(r.relay_cpu / (r.wal_bytes / 1e9) for r in runs)
        compress = f"{best.wal_bytes / MB / best.relay_cpu:>14.0f}" if best.relay_cpu else \
            f"{'-':>14}"
        print(f"{best.mode:<26} {best.wal_bytes / MB / best.seconds:>9.1f} "
              f"{best.wire_bytes * 8 / MB / best.seconds:>11.1f} "
              f"{best.wire_bytes / MB:>8.1f} {best.wal_bytes / best.wire_bytes:>6.2f} "
              f"{best.relay_cpu / gb:>14.2f} {compress} {best.decode_cpu / gb:>15.2f}  "
              f"{speeds[0]:.0f}..{statistics.median(speeds):.0f}..{speeds[-1]:.0f}, "
              f"{cpus[0]:.2f}..{statistics.median(cpus):.2f}..{cpus[-1]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=20, help="pgbench -i scale factor")
    parser.add_argument("--seconds", type=int, default=20, help="pgbench -T duration")
    parser.add_argument("--gb", type=float, default=None,
                        help="GB of bulk-INSERT WAL instead of pgbench")
    parser.add_argument("--rounds", type=int, default=2, help="runs per mode (best is shown)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a source tree whose relay runs too, alternated with this one")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",")]
    if unknown := set(modes) - set(MODES):
        sys.exit(f"relay_throughput.py: unknown modes {sorted(unknown)}; known: {MODES}")
    if args.baseline is not None:
        modes = [m for mode in modes
                 for m in ((mode, mode + BASELINE) if mode != "direct" else (mode,))]
    conf = {"max_wal_size": "'4GB'", "checkpoint_timeout": "'30min'"}
    with running_server(conf) as server, \
            tempfile.TemporaryDirectory(prefix="relay-bench-") as certs:
        tls = TestCA.create(Path(certs)).issue("relay", "127.0.0.1", ip="127.0.0.1")
        server.sql("SELECT pg_create_physical_replication_slot('bench_hold', true)")
        start, end = make_wal(server, args.scale, args.seconds, args.gb)
        results: dict[str, list[Result]] = {mode: [] for mode in modes}
        for i in range(args.rounds):
            for mode in modes:  # alternate the modes within each round
                result = run_mode(server, mode, (start, end), tls, args.baseline)
                results[mode].append(result)
                print(f"  round {i + 1} {mode:<26} {result.wal_bytes / MB / result.seconds:7.1f}"
                      f" MB/s  relay cpu {result.relay_cpu:6.2f} s", flush=True)
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print_table(results)


if __name__ == "__main__":
    main()
