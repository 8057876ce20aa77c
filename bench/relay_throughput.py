"""Throughput of WAL through ``receivewal relay`` (zstd, lz4, pass-through) next to a direct
connection. Run by hand, not in CI::

    .venv/bin/python bench/relay_throughput.py [--scale 20] [--seconds 20] [--rounds 2]

A fresh server gets a pgbench run (initialisation plus a timed TPC-B-like load); the WAL it
wrote is then streamed from its start to its end over a raw replication connection (psycopg's
pq layer, decoded with StreampackDecoder as the daemon does), directly and through the relay.
The "+tls" modes put TLS on the client leg (``--tls-cert``/``--tls-key``, a certificate made for
the run; the client connects with sslmode=require). Reported per mode: MB/s of WAL delivered to
the receiver, bytes on the wire (the XLogData frames as received, before TLS), the ratio, and
CPU seconds per GB of WAL spent by the relay process and by the receiver's decoder. The best
of ``--rounds`` runs is shown (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from psycopg import pq
from support.certs import CertPair, TestCA
from support.servers import PgServer, free_port, pg_bin, running_server

from receivewal.replication.messages import XLogData, parse_copy_data
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


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_relay(upstream: int, compression: str, tls: CertPair | None,
                ) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    tls_options = (["--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--client-tls",
                    "require"] if tls else [])
    proc = subprocess.Popen(
        [sys.executable, "-m", "receivewal", "relay", "--listen", f"127.0.0.1:{port}",
         "--upstream", f"127.0.0.1:{upstream}", "--compression", compression, *tls_options],
        stderr=subprocess.DEVNULL)
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
        frame = bytes(data)
        if frame[:1] != b"w":
            continue
        wire += len(frame)
        t0 = time.process_time()
        msg = parse_copy_data(decoder.restore(frame))
        decode += time.process_time() - t0
        assert isinstance(msg, XLogData)
        position = msg.end
    elapsed = time.perf_counter() - began
    conn.finish()
    return elapsed, decoder.stats().wal_bytes, wire, decode


MODES = ("direct", "relay plain", "relay zstd", "relay lz4", "relay plain+tls",
         "relay zstd+tls", "relay lz4+tls")


def run_mode(server: PgServer, mode: str, start: int, end: int, tls: CertPair) -> Result:
    if mode == "direct":
        seconds, wal, wire, decode = stream(server.port, "", start, end)
        return Result(mode, seconds, wal, wire, 0.0, decode)
    name, _, with_tls = mode.partition("+")
    compression = {"relay plain": "none", "relay zstd": "zstd", "relay lz4": "lz4"}[name]
    proc, port = start_relay(server.port, compression, tls if with_tls else None)
    try:
        before = cpu_seconds(proc.pid)
        seconds, wal, wire, decode = stream(port, "" if compression == "none" else compression,
                                            start, end, "require" if with_tls else "disable")
        relay_cpu = cpu_seconds(proc.pid) - before
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    return Result(mode, seconds, wal, wire, relay_cpu, decode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=20, help="pgbench -i scale factor")
    parser.add_argument("--seconds", type=int, default=20, help="pgbench -T duration")
    parser.add_argument("--rounds", type=int, default=2, help="runs per mode (best is shown)")
    args = parser.parse_args()
    with running_server({"max_wal_size": "'2GB'", "checkpoint_timeout": "'30min'"}) as server, \
            tempfile.TemporaryDirectory(prefix="relay-bench-") as certs:
        tls = TestCA.create(Path(certs)).issue("relay", "127.0.0.1", ip="127.0.0.1")
        start = parse_lsn(server.current_lsn()) // (16 << 20) * (16 << 20)
        pgbench = [pg_bin("pgbench"), "-h", "127.0.0.1", "-p", str(server.port), "-U",
                   "postgres", "postgres"]
        subprocess.run([*pgbench[:1], "-i", "-q", "-s", str(args.scale), *pgbench[1:]],
                       check=True, capture_output=True)
        subprocess.run([*pgbench[:1], "-c", "2", "-T", str(args.seconds), *pgbench[1:]],
                       check=True, capture_output=True)
        end = parse_lsn(server.sql("SELECT pg_current_wal_flush_lsn()"))
        print(f"pgbench -i -s {args.scale} + {args.seconds} s of TPC-B: "
              f"{(end - start) / MB:.0f} MB of WAL ({format_lsn(start)} .. {format_lsn(end)}), "
              f"cores: {os.cpu_count()}")
        print(f"{'mode':<15} {'WAL MB/s':>9} {'Mbit/s wire':>11} {'wire MB':>8} {'ratio':>6} "
              f"{'relay cpu s/GB':>14} {'decode cpu s/GB':>15}")
        for mode in MODES:
            best = min((run_mode(server, mode, start, end, tls) for _ in range(args.rounds)),
                       key=lambda r: r.seconds)
            gb = best.wal_bytes / 1e9
            print(f"{best.mode:<15} {best.wal_bytes / MB / best.seconds:>9.1f} "
                  f"{best.wire_bytes * 8 / MB / best.seconds:>11.1f} "
                  f"{best.wire_bytes / MB:>8.1f} {best.wal_bytes / best.wire_bytes:>6.2f} "
                  f"{best.relay_cpu / gb:>14.2f} {best.decode_cpu / gb:>15.2f}")


if __name__ == "__main__":
    main()
