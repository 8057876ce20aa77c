"""``receivewal relay``: real servers behind the relay, streamed by a raw libpq client.

The client is psycopg's ``pq`` layer driven by hand (the replication protocol as pg_receivewal
speaks it), so these tests prove the relay and the decoder without the streaming daemon.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import pq
from psycopg.pq.abc import PGconn
from support.servers import IS_ROOT, PgServer, free_port
from support.streams import (
    assert_identical_to_server,
    complete_segments,
    start_receivewal,
    stop,
    wait_for,
)

from receivewal.addresses import parse_address
from receivewal.errors import ConfigurationError
from receivewal.relay.backend import BackendStream
from receivewal.relay.protocol import build_startup_packet, decide_startup
from receivewal.replication.messages import (
    KEEPALIVE,
    PrimaryKeepalive,
    XLogData,
    build_standby_status_update,
    build_xlogdata,
    parse_copy_data,
    postgres_time,
)
from receivewal.replication.streampack import StreampackDecoder, StreampackEncoder, is_compressed
from receivewal.wal.lsn import format_lsn, parse_lsn
from receivewal.wal.names import wal_file_name

SEG = 16 * 1024 * 1024
TIMEOUT = 120.0


# -- fixtures and the raw replication client --------------------------------------------------


@dataclass
class RelayProcess:
    """A ``receivewal relay`` process; its JSON log events once it has stopped."""

    port: int
    pid: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event]


@contextmanager
def running_relay(upstream_port: int, offered: tuple[str, ...] = ("zstd", "lz4"),
                  min_size: int = 32, extra: tuple[str, ...] = (),
                  listen_host: str = "127.0.0.1") -> Iterator[RelayProcess]:
    """``receivewal relay`` in front of ``upstream_port``; stopped with SIGTERM, which must
    make it exit 0.

    A process of its own, as in production (and because libpq's blocking calls in this process
    would hold the GIL against a relay thread).
    """
    relay = RelayProcess(free_port())
    proc = subprocess.Popen(
        [sys.executable, "-m", "receivewal", "relay", "--listen", f"{listen_host}:{relay.port}",
         "--upstream", f"127.0.0.1:{upstream_port}", "--compression",
         ",".join(offered) or "none", "--min-size", str(min_size), *extra],
        stderr=subprocess.PIPE, text=True)
    relay.pid = proc.pid
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", relay.port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, "the relay exited"
                assert time.monotonic() < deadline, "the relay does not listen"
                time.sleep(0.1)
        yield relay
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        relay.events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, err
    assert relay.named("relay_stopped")


def connect(port: int, requested: str | None = None, replication: str | None = "true",
            extra: str = "") -> PGconn:
    """A libpq connection to 127.0.0.1:port, asking for ``requested`` like the daemon does."""
    conninfo = f"host=127.0.0.1 port={port} user=postgres dbname=postgres {extra}"
    if replication:
        conninfo += f" replication={replication}"
    if requested is not None:
        conninfo += f" options='-c pg_streampack.requested={requested}'"
    conn = pq.PGconn.connect(conninfo.encode())
    if conn.status != pq.ConnStatus.OK:
        message = conn.get_error_message()
        conn.finish()
        raise ConnectionError(message)
    return conn


def command(conn: PGconn, sql: str) -> list[tuple[str, ...]]:
    """Run a command that returns rows; the rows as text."""
    res = conn.exec_(sql.encode())
    if res.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
        raise RuntimeError(conn.get_error_message())
    return [tuple((res.get_value(r, c) or b"").decode() for c in range(res.nfields))
            for r in range(res.ntuples)]


@dataclass
class Receiver:
    """Received WAL per (timeline, segment number), as the daemon would lay it out."""

    conn: PGconn
    decoder: StreampackDecoder
    segments: dict[tuple[int, int], bytearray] = field(default_factory=dict)
    covered: dict[tuple[int, int], int] = field(default_factory=dict)
    wire_frames: int = 0
    compressed_on_wire: int = 0

    def start(self, lsn: int, timeline: int) -> None:
        res = self.conn.exec_(
            f"START_REPLICATION PHYSICAL {format_lsn(lsn)} TIMELINE {timeline}".encode())
        assert res.status == pq.ExecStatus.COPY_BOTH, self.conn.get_error_message()

    def receive(self, timeline: int, stop: int | None) -> str:
        """Receive until WAL up to ``stop`` arrived ("stop") or the timeline ended ("end")."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            nbytes, data = self.conn.get_copy_data(1)
            if nbytes == 0:
                left = deadline - time.monotonic()
                assert left > 0, "timed out waiting for WAL"
                select.select([self.conn.socket], [], [], min(left, 1.0))
                self.conn.consume_input()
                continue
            if nbytes == -1:
                return "end"
            assert nbytes > 0, self.conn.get_error_message()
            frame = bytes(data)
            if frame[:1] == b"w":
                self.wire_frames += 1
                self.compressed_on_wire += is_compressed(frame)
            msg = parse_copy_data(self.decoder.restore(frame))
            if isinstance(msg, XLogData):
                self.write(timeline, msg.wal_start, bytes(msg.payload))
                if stop is not None and msg.end >= stop:
                    return "stop"
            elif isinstance(msg, PrimaryKeepalive) and msg.reply_requested:
                self.conn.put_copy_data(build_standby_status_update(
                    msg.wal_end, msg.wal_end, 0, postgres_time(time.time())))
                self.conn.flush()

    def finish_timeline(self) -> tuple[int, int]:
        """After the server ended the COPY: end ours, read the next timeline and its start."""
        assert self.conn.put_copy_end() == 1
        res = self.conn.get_result()
        assert res is not None
        assert res.status == pq.ExecStatus.TUPLES_OK, self.conn.get_error_message()
        next_tli = int(res.get_value(0, 0) or b"0")
        next_start = parse_lsn((res.get_value(0, 1) or b"").decode())
        res = self.conn.get_result()
        assert res is not None
        assert res.status == pq.ExecStatus.COMMAND_OK
        assert self.conn.get_result() is None
        return next_tli, next_start

    def write(self, timeline: int, lsn: int, payload: bytes) -> None:
        while payload:
            segno, offset = divmod(lsn, SEG)
            size = min(len(payload), SEG - offset)
            key = (timeline, segno)
            segment = self.segments.setdefault(key, bytearray(SEG))
            segment[offset : offset + size] = payload[:size]
            self.covered[key] = self.covered.get(key, 0) + size
            lsn += size
            payload = payload[size:]


def wal_file(server: PgServer, timeline: int, segno: int) -> bytes:
    """The server's own segment file (``.partial`` when the server renamed it at promotion)."""
    path = server.pg_wal / wal_file_name(timeline, segno, SEG)
    if not path.exists():
        path = path.with_name(path.name + ".partial")
    return path.read_bytes()


def stream_one_segment(server: PgServer, port: int, requested: str | None,
                       extra: str = "") -> Receiver:
    """Stream from the start of the current segment until it is complete; check the bytes."""
    assert server.sql("SHOW wal_segment_size") == "16MB"
    start = parse_lsn(server.current_lsn()) // SEG * SEG
    server.generate_wal(1)
    conn = connect(port, requested, extra=extra)
    try:
        (system, timeline, _, _), = command(conn, "IDENTIFY_SYSTEM")
        assert system == server.sql("SELECT system_identifier FROM pg_control_system()")
        receiver = Receiver(conn, StreampackDecoder(
            tuple(requested.split(",")) if requested else ()))
        receiver.start(start, int(timeline))
        assert receiver.receive(int(timeline), start + SEG) == "stop"
    finally:
        conn.finish()
    key = (int(timeline), start // SEG)
    assert receiver.covered[key] == SEG
    assert receiver.segments[key] == wal_file(server, *key)
    return receiver


# -- through the relay, against real servers --------------------------------------------------


@pytest.mark.server
@pytest.mark.parametrize(("requested", "offered", "expected"), [
    ("zstd", ("zstd", "lz4"), "zstd"),
    ("lz4", ("zstd", "lz4"), "lz4"),
    ("lz4,zstd", ("zstd", "lz4"), "lz4"),  # the client's order wins
    ("zstd,lz4", ("lz4",), "lz4"),         # the relay's list only filters
    ("zstd", (), None),                    # relay run with --compression none
    (None, ("zstd", "lz4"), None),         # a client that asks for nothing
])
@pytest.mark.shared_server
def test_relay_negotiates_and_the_segment_is_byte_identical(
    pg: PgServer, requested: str | None, offered: tuple[str, ...], expected: str | None
) -> None:
    """A complete segment streamed through the relay equals the server's own file, compressed
    with the first of the client's algorithms that the relay offers, or plain without one."""
    with running_relay(pg.port, offered) as relay:
        receiver = stream_one_segment(pg, relay.port, requested)
    stats = receiver.decoder.stats()
    assert receiver.decoder.algorithm == expected
    (connected,) = [e for e in relay.named("relay_client_connected") if e["replication"]]
    assert connected["compression"] == expected
    (disconnected,) = [e for e in relay.named("relay_client_disconnected")
                       if "streampack" in e] or [{}]
    if expected is None:
        assert receiver.compressed_on_wire == 0
        assert stats.saved_bytes == 0
        assert not disconnected, "no encoder for a plain connection"
    else:
        assert receiver.compressed_on_wire > 0
        assert stats.compressed_frames == receiver.compressed_on_wire
        assert stats.wal_bytes >= SEG
        assert stats.saved_bytes > SEG // 2, "generated WAL compresses well"
        assert stats.ratio > 2
        relay_side = disconnected["streampack"]
        assert relay_side["algorithm"] == expected
        assert relay_side["compressed_frames"] >= stats.compressed_frames, "the relay's count"


@pytest.mark.shared_server
@pytest.mark.server
def test_direct_connection_without_the_module_is_plain(pg: PgServer) -> None:
    """Asking a server without the module (not behind the relay) for zstd: plain, identical."""
    receiver = stream_one_segment(pg, pg.port, "zstd,lz4")
    assert receiver.decoder.algorithm is None
    assert receiver.compressed_on_wire == 0
    assert receiver.decoder.stats().frames == receiver.wire_frames


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["zstd", "lz4"])
def test_relay_keeps_compression_state_across_a_timeline_switch(
    pg: PgServer, algorithm: str
) -> None:
    """On one connection through the relay: the end of timeline 1 on a promoted standby, then
    START_REPLICATION on timeline 2; the encoder and decoder state carry over and every segment
    (old timeline, the switch segment, the new timeline) equals the server's files."""
    standby = pg.make_standby("standby")
    try:
        pg.generate_wal(1)
        # Some WAL after the last switch, so that the new timeline begins mid-segment.
        pg.sql("INSERT INTO filler SELECT g, repeat('y', 100) FROM generate_series(1, 5000) g")
        target = parse_lsn(pg.current_lsn())
        deadline = time.monotonic() + TIMEOUT
        while parse_lsn(standby.current_lsn()) < target:
            assert time.monotonic() < deadline, "standby did not catch up"
            time.sleep(0.1)
        standby.promote()
        standby.generate_wal(1)
        end = parse_lsn(standby.current_lsn()) // SEG * SEG  # every segment before is complete
        with running_relay(standby.port) as relay:
            conn = connect(relay.port, algorithm)
            try:
                (_, timeline, _, _), = command(conn, "IDENTIFY_SYSTEM")
                assert timeline == "2"
                (_, history), = command(conn, "TIMELINE_HISTORY 2")
                parent, switch_text = history.split("\t")[:2]
                assert parent == "1"
                switch = parse_lsn(switch_text)
                assert switch % SEG, "the switch is inside a segment"
                first = switch // SEG - 1
                assert end >= (first + 3) * SEG
                receiver = Receiver(conn, StreampackDecoder((algorithm,)))
                receiver.start(first * SEG, 1)
                assert receiver.receive(1, None) == "end"
                compressed_on_tl1 = receiver.decoder.stats().compressed_frames
                assert receiver.finish_timeline() == (2, switch)
                receiver.start(switch, 2)
                assert receiver.receive(2, end) == "stop"
            finally:
                conn.finish()
    finally:
        standby.stop("immediate")
    stats = receiver.decoder.stats()
    assert receiver.decoder.algorithm == algorithm
    assert 0 < compressed_on_tl1 < stats.compressed_frames, "frames compressed on both timelines"
    assert stats.saved_bytes > SEG
    # The last complete segment of timeline 1.
    assert receiver.covered[(1, first)] == SEG
    assert receiver.segments[(1, first)] == wal_file(standby, 1, first)
    # The switch segment: timeline 1's bytes up to the switch, then timeline 2's.
    offset = switch - (first + 1) * SEG
    switch_segment = (receiver.segments[(1, first + 1)][:offset]
                      + receiver.segments[(2, first + 1)][offset:])
    assert switch_segment == wal_file(standby, 2, first + 1)
    # A segment entirely on timeline 2.
    assert receiver.covered[(2, first + 2)] == SEG
    assert receiver.segments[(2, first + 2)] == wal_file(standby, 2, first + 2)


@pytest.mark.shared_server
@pytest.mark.server
def test_relay_refuses_a_request_the_module_would_refuse(pg: PgServer) -> None:
    with running_relay(pg.port) as relay, pytest.raises(
        ConnectionError, match=re.escape('invalid value for parameter "pg_streampack.requested"')
    ):
        connect(relay.port, "lz4,lz4")


@pytest.mark.shared_server
@pytest.mark.server
def test_relay_passes_ordinary_connections_through_without_the_request(pg: PgServer) -> None:
    """psql-style connections work through the relay: other options reach the server, the
    streampack request does not, and an SSL request is answered so the client goes on plain."""
    with running_relay(pg.port) as relay:
        conn = connect(relay.port, None, replication=None, extra=(
            "sslmode=prefer options='-c application_name=via\\\\ relay "
            "-c pg_streampack.requested=zstd'"))
        try:
            assert command(conn, "SELECT 6 * 7") == [("42",)]
            assert command(conn, "SHOW application_name") == [("via relay",)]
            assert command(conn, "SELECT current_setting('pg_streampack.requested', true)") \
                == [("",)]
            assert conn.ssl_in_use is False
        finally:
            conn.finish()
    (connected,) = [e for e in relay.named("relay_client_connected") if e["requested"]]
    assert connected["replication"] is False
    assert connected["compression"] is None


def test_relay_reports_an_unreachable_upstream() -> None:
    """Nothing listens upstream: the client gets a FATAL error naming the cause, not a hang."""
    with running_relay(free_port()) as relay, pytest.raises(
        ConnectionError, match="relay could not connect to the upstream server"
    ):
        connect(relay.port, "zstd")


@pytest.mark.shared_server
@pytest.mark.server
def test_relay_forwards_a_cancel_request(pg: PgServer) -> None:
    """A query cancel sent through the relay reaches the upstream (the key data is its own)."""
    with running_relay(pg.port) as relay:
        conn = connect(relay.port, None, replication=None)
        try:
            conn.send_query(b"SELECT pg_sleep(60)")
            wait_for(lambda: "pg_sleep" in pg.sql(
                "SELECT string_agg(query, ' ') FROM pg_stat_activity WHERE state = 'active'"),
                what="the query to run")
            conn.get_cancel().cancel()
            began = time.monotonic()
            res = conn.get_result()
            assert res is not None
            assert res.status == pq.ExecStatus.FATAL_ERROR
            assert "canceling statement due to user request" in conn.get_error_message()
            assert time.monotonic() - began < 30
        finally:
            conn.finish()


def test_relay_declines_encryption_requests_and_goes_on_in_plaintext() -> None:
    """GSSENCRequest and SSLRequest are answered N (a loopback relay without a certificate does
    no TLS toward clients); the startup packet
    that follows is handled (here: the upstream is down, so a FATAL ErrorResponse comes back)."""
    with running_relay(free_port()) as relay, socket.create_connection(
        ("127.0.0.1", relay.port), timeout=10
    ) as sock:
        sock.sendall(struct.pack(">II", 8, 80877104))
        assert sock.recv(1) == b"N"
        sock.sendall(struct.pack(">II", 8, 80877103))
        assert sock.recv(1) == b"N"
        sock.sendall(build_startup_packet({"user": "postgres", "replication": "true"}))
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
        assert reply[:1] == b"E"
        assert b"SFATAL" in reply
        assert b"could not connect to the upstream server" in reply


def enable_tls_only(server: PgServer) -> Path:
    """Give ``server`` a self-signed certificate for 127.0.0.1 and refuse connections without
    TLS; return the certificate (to verify against)."""
    cert, key = server.datadir / "server.crt", server.datadir / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    key.chmod(0o600)
    if IS_ROOT:
        owner = pwd.getpwnam("postgres")
        for path in (cert, key):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    server.configure({"ssl": "on", "ssl_cert_file": "'server.crt'",
                      "ssl_key_file": "'server.key'"})
    hba = server.datadir / "pg_hba.conf"
    hba.write_text("hostnossl all all 127.0.0.1/32 reject\n"
                   "hostnossl replication all 127.0.0.1/32 reject\n" + hba.read_text())
    server.restart()
    return cert


@pytest.mark.server
def test_relay_reaches_a_tls_only_upstream(pg: PgServer) -> None:
    """An upstream that refuses plaintext: the relay speaks TLS to it (require, and verify-full
    against its certificate), compresses as usual, and the segment is byte-identical; with
    --upstream-sslmode disable the upstream's refusal reaches the client."""
    cert = enable_tls_only(pg)
    with running_relay(pg.port, extra=("--upstream-sslmode", "require")) as relay:
        receiver = stream_one_segment(pg, relay.port, "lz4")
    assert receiver.decoder.algorithm == "lz4"
    (connected,) = [e for e in relay.named("relay_client_connected") if e["replication"]]
    assert connected["upstream_tls"] is True
    with running_relay(pg.port, extra=("--upstream-sslmode", "verify-full",
                                       "--upstream-sslrootcert", str(cert))) as relay:
        receiver = stream_one_segment(pg, relay.port, "zstd")
    assert receiver.decoder.algorithm == "zstd"
    with running_relay(pg.port, extra=("--upstream-sslmode", "disable")) as relay, \
            pytest.raises(ConnectionError, match="no encryption"):
        connect(relay.port, "zstd")


@pytest.mark.server
def test_relay_refuses_an_upstream_certificate_it_cannot_verify(pg: PgServer,
                                                                tmp_path: Path) -> None:
    enable_tls_only(pg)
    other = tmp_path / "other.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=other", "-keyout", str(tmp_path / "other.key"),
                    "-out", str(other)], check=True, capture_output=True)
    with running_relay(pg.port, extra=("--upstream-sslmode", "verify-ca",
                                       "--upstream-sslrootcert", str(other))) as relay, \
            pytest.raises(ConnectionError, match="certificate verify failed"):
        connect(relay.port, "zstd")


# -- the relay's pure parts, no server --------------------------------------------------------


def test_relay_command_refuses_bad_options() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "receivewal", "relay", "--listen", "127.0.0.1:0",
         "--upstream", "nowhere", "--compression", "gzip"],
        capture_output=True, text=True, check=False)
    assert out.returncode != 0
    assert "invalid upstream address 'nowhere'" in out.stderr


@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:5432", ("127.0.0.1", 5432)),
    ("db.example:6543", ("db.example", 6543)),
    ("[::1]:5432", ("::1", 5432)),
])
def test_parse_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("5432", "expected HOST:PORT"), ("host:", "port must be a number"),
    ("host:port", "port must be a number"), ("host:70000", "port must be a number"),
])
def test_parse_address_refuses(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_address(text)


def startup_body(**parameters: str) -> bytes:
    return build_startup_packet(parameters)[8:]


def test_startup_decision_strips_the_request_and_keeps_the_rest() -> None:
    decision = decide_startup(startup_body(
        user="u", replication="true",
        options="-c a=1 -c pg_streampack.requested=lz4,zstd"), ("zstd", "lz4"))
    assert decision.algorithm == "lz4"
    assert decision.requested == ("lz4", "zstd")
    assert decision.replication
    length, version = struct.unpack_from(">II", decision.packet)
    assert (length, version) == (len(decision.packet), 196608)
    assert decision.packet[8:] == startup_body(user="u", replication="true", options="-c a=1")


def test_startup_decision_for_plain_and_ordinary_connections() -> None:
    only_request = decide_startup(startup_body(
        user="u", replication="on", options="-c pg_streampack.requested=zstd"), ())
    assert only_request.algorithm is None
    assert only_request.packet[8:] == startup_body(user="u", replication="on")
    ordinary = decide_startup(startup_body(
        user="u", options="-c pg_streampack.requested=zstd"), ("zstd",))
    assert not ordinary.replication
    assert ordinary.algorithm is None, "ordinary connections are never compressed"
    with pytest.raises(ConfigurationError, match=re.escape('"pg_streampack.requested": "gzip"')):
        decide_startup(startup_body(user="u", options="-c pg_streampack.requested=gzip"),
                       ("zstd",))


def backend_message(kind: bytes | bytearray, body: bytes) -> bytes:
    return bytes(kind) + struct.pack(">I", 4 + len(body)) + body


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["zstd", "lz4"]), st.lists(st.integers(0, 20_000), max_size=8),
       st.lists(st.integers(1, 5000), min_size=1, max_size=60))
def test_backend_stream_compresses_only_xlogdata_in_copy_both(
    algorithm: str, sizes: list[int], cuts: list[int]
) -> None:
    """However the upstream's bytes are cut into reads, the client gets every message in order:
    XLogData inside COPY BOTH compressed (and restorable), everything else byte for byte."""
    frames = [build_xlogdata(i * 100_000, i * 100_000 + n, 7, bytes([i % 256]) * n)
              for i, n in enumerate(sizes)]
    before = backend_message(b"d", frames[0]) if frames else b""  # a COPY OUT before: untouched
    stream_bytes = (backend_message(b"Z", b"I") + before + backend_message(b"W", b"\x00\x00\x00")
                    + b"".join(backend_message(b"d", f) for f in frames)
                    + backend_message(b"d", KEEPALIVE.pack(b"k", 1, 2, 1))
                    + backend_message(b"c", b"") + backend_message(b"C", b"START_STREAMING\x00")
                    + before)
    stream = BackendStream(StreampackEncoder(algorithm))
    out = bytearray()
    pos = 0
    for cut in cuts * (len(stream_bytes) // sum(cuts) + 1):
        out += stream.feed(stream_bytes[pos : pos + cut])
        pos += cut
        if pos >= len(stream_bytes):
            break
    decoder = StreampackDecoder((algorithm,))
    restored = bytearray()
    compressed = 0
    pos = 0
    while pos < len(out):
        kind, length = out[pos : pos + 1], int.from_bytes(out[pos + 1 : pos + 5], "big")
        body = bytes(out[pos + 5 : pos + 1 + length])
        compressed += is_compressed(body)
        restored += backend_message(kind, bytes(decoder.restore(body)) if kind == b"d" else body)
        pos += 1 + length
    assert compressed == sum(1 for n in sizes if n >= 32), "only frames inside COPY BOTH"
    assert restored == stream_bytes
    assert not stream.copy_both


# -- the streaming daemon through the relay ---------------------------------------------------


@pytest.mark.server
@pytest.mark.parametrize(("compression", "expected"), [
    ("zstd,lz4", "zstd"), ("lz4", "lz4"), ("none", None),
])
@pytest.mark.shared_server
def test_receivewal_stream_through_the_relay_archives_identical_segments(
    pg: PgServer, archive_dir: Path, compression: str, expected: str | None
) -> None:
    """``receivewal stream`` behind ``receivewal relay``: it negotiates what it asked for, logs
    which stream it got and what compression saved, and its archive equals pg_wal."""
    log_path = archive_dir.parent / "receivewal.log"
    with running_relay(pg.port) as relay:
        proc = start_receivewal("stream", "-D", str(archive_dir), "-d",
                                f"host=127.0.0.1 port={relay.port} user=postgres",
                                "--compression", compression, "--no-sync",
                                stderr_path=log_path)
        try:
            wait_for(lambda: "streaming_started" in log_path.read_text(), what="streaming")
            pg.generate_wal(2)
            wait_for(lambda: len(complete_segments(archive_dir)) >= 2, what="two segments")
        finally:
            assert stop(proc) == 0
    names = assert_identical_to_server(archive_dir, pg)
    assert len(names) >= 2
    events = [json.loads(line) for line in log_path.read_text().splitlines()
              if line.startswith("{")]
    (reported,) = {e["algorithm"] for e in events if e["event"] == "stream_compression"}
    assert reported == (expected or "none")
    (connected,) = [e for e in relay.named("relay_client_connected") if e["replication"]]
    assert connected["compression"] == expected
    if expected is not None:
        (summary,) = [e for e in events if e["event"] == "compression_summary"]
        assert summary["algorithm"] == expected
        assert summary["saved_bytes"] > 2 * SEG // 2
