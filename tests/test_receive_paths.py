"""The two receive loops against a real server: the compiled one (receivewal.replication._recv)
hands over the same WAL as the pure-Python one, in runs, and lets everything else through.

The archives both loops write are compared with the server's own files in tests/test_stream.py
and tests/test_timelines.py (parametrised over the loop with the ``receive_path`` fixture).
"""

from __future__ import annotations

import time
from types import ModuleType

import pytest
from support.servers import PgServer
from support.stopflag import Stop
from support.tcpproxy import TcpProxy

from receivewal.replication.connection import ReplicationConnection, build_conninfo
from receivewal.replication.link import COPY_DONE, WalRun
from receivewal.replication.messages import (
    PrimaryKeepalive,
    build_standby_status_update,
    parse_copy_data,
    postgres_time,
)
from receivewal.replication.nativerecv import MAPS, loaded_libpq
from receivewal.wal.lsn import format_lsn, parse_lsn
from receivewal.wal.names import wal_file_name
from receivewal.wal.nativescan import load_native

pytestmark = pytest.mark.server

SEG = 16 << 20
MAX_SEND = 16 * 8192  # the most WAL a walsender puts in one message (8 kB blocks)



@pytest.fixture(scope="module")
def native() -> ModuleType:
    """The compiled loop bound to psycopg's libpq (skipped only where it is not built)."""
    module = load_native("receivewal.replication._recv")
    if module is None:
        pytest.skip("the C extension receivewal.replication._recv is not built here")
    libpq = loaded_libpq(MAPS.read_text())
    assert libpq is not None, "psycopg's libpq is not mapped once"
    module.bind(libpq)
    return module


def connect(pg: PgServer, native: ModuleType | None, options: str | None = None
            ) -> ReplicationConnection:
    conn = ReplicationConnection.open(build_conninfo(pg.dsn, options=options), stop=Stop(),
                                      timeout=60)
    conn.native = native
    return conn


def collect(conn: ReplicationConnection, start: int, until: int) -> tuple[bytes, set[str]]:
    """The WAL read from ``start`` until a message reaches ``until``, and how it came: "run"
    (the compiled loop), "w" (an XLogData message as bytes), "k" (a keepalive)."""
    wal, kinds = bytearray(), set()
    while start + len(wal) < until:
        got = conn.read_batch(30.0, until)
        assert got is not None
        assert got is not COPY_DONE
        if isinstance(got, WalRun):
            assert got.wal_start == start + len(wal)
            kinds.add("run")
            wal += b"".join(got.payload)
            continue
        message = parse_copy_data(got)
        if isinstance(message, PrimaryKeepalive):
            kinds.add("k")
            continue
        assert message.wal_start == start + len(wal)
        kinds.add("w")
        wal += message.payload
    return bytes(wal), kinds


@pytest.mark.shared_server
@pytest.mark.parametrize("path", ["c", "python"])
def test_both_loops_hand_over_the_servers_wal_up_to_the_message_reaching_until(
        pg: PgServer, native: ModuleType, path: str) -> None:
    """From a slot's segment to an LSN in the next one: the server's bytes, on the compiled
    loop as runs only, and neither loop reads past the message that reaches ``until``."""
    pg.sql("SELECT pg_create_physical_replication_slot('p', true)")
    restart = parse_lsn(pg.sql("SELECT restart_lsn FROM pg_replication_slots"))
    start = restart - restart % SEG
    pg.generate_wal(2)
    until = start + SEG + 12345
    conn = connect(pg, native if path == "c" else None)
    try:
        assert conn.receive_path == path
        conn.start_copy_both(f"START_REPLICATION SLOT p PHYSICAL {format_lsn(start)} TIMELINE 1")
        wal, kinds = collect(conn, start, until)
    finally:
        conn.close()
    server = b"".join((pg.pg_wal / wal_file_name(1, start // SEG + i, SEG)).read_bytes()
                      for i in range(2))
    assert wal == server[: len(wal)]
    assert until <= start + len(wal) < until + MAX_SEND
    assert kinds - {"k"} == ({"run"} if path == "c" else {"w"})


@pytest.mark.shared_server
def test_keepalive_asking_for_a_reply_and_copy_done_come_through_the_compiled_loop(
        pg: PgServer, native: ModuleType) -> None:
    """An idle stream: the server's keepalive asking for a reply comes as its CopyData bytes;
    after our reply WAL still comes as a run, and our CopyDone is answered with COPY_DONE."""
    conn = connect(pg, native, options="-c wal_sender_timeout=2s")
    try:
        _, timeline, xlogpos, _ = conn.query("IDENTIFY_SYSTEM")[0]
        conn.start_copy_both(f"START_REPLICATION PHYSICAL {xlogpos} TIMELINE {timeline}")
        for _ in range(20):  # the server asks after 1 s of silence (half its timeout)
            got = conn.read_batch(5.0)
            assert not isinstance(got, WalRun)
            assert got is not COPY_DONE
            if got is not None:
                message = parse_copy_data(got)
                assert isinstance(message, PrimaryKeepalive)
                if message.reply_requested:
                    break
        else:
            pytest.fail("no keepalive asked for a reply")
        lsn = parse_lsn(xlogpos or "")
        conn.send_copy(build_standby_status_update(lsn, 0, 0, postgres_time(time.time())))
        pg.switch_wal()
        while not isinstance(got := conn.read_batch(30.0), WalRun):
            assert got is not COPY_DONE
        assert got.wal_start == lsn
        conn.end_copy()
        while (got := conn.read_batch(30.0)) is not COPY_DONE:
            assert got is not None
    finally:
        conn.close()


@pytest.mark.shared_server
def test_the_compiled_loop_waits_out_a_message_that_arrives_in_pieces(
        pg: PgServer, native: ModuleType) -> None:
    """Over a slow link the socket turns readable while a 128 kB message is still arriving:
    the compiled loop's read waits for the whole message until its timeout, as the pure loop's
    does, instead of answering "nothing arrived" at the first partial read."""
    pg.sql("SELECT pg_create_physical_replication_slot('slow', true)")
    restart = parse_lsn(pg.sql("SELECT restart_lsn FROM pg_replication_slots"))
    start = restart - restart % SEG
    pg.generate_wal(1)
    proxy = TcpProxy(pg.port, bytes_per_second=512 * 1024)
    try:
        conn = ReplicationConnection.open(
            build_conninfo(pg.dsn.replace(f"port={pg.port}", f"port={proxy.port}")),
            stop=Stop(), timeout=60)
        conn.native = native
        try:
            conn.start_copy_both(
                f"START_REPLICATION SLOT slow PHYSICAL {format_lsn(start)} TIMELINE 1")
            reads = [conn.read_batch(30.0) for _ in range(8)]
            assert None not in reads, f"a read answered None before its timeout: {reads}"
            assert any(isinstance(got, WalRun) for got in reads)
        finally:
            conn.close()
    finally:
        proxy.close()
