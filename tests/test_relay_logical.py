"""``receivewal relay`` in front of a server without pg_streampack, for logical replication
(``replication=database``): a pgoutput stream read through the relay with zstd and with lz4,
restored by receivewal's streampack decoder, is the stream a direct connection reads from the
same slot position, message for message, in fewer bytes; the commands a logical client sends
before START_REPLICATION (IDENTIFY_SYSTEM, CREATE_REPLICATION_SLOT ... LOGICAL, plain SQL) pass
through. Everything is read over receivewal's own ReplicationConnection."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from support.logical import (
    LOGICAL_CONF,
    SESSION,
    current_lsn,
    pgbench,
    prepare_database,
    wait_until_released,
)
from support.servers import PgServer, running_server
from test_relay import RelayProcess, running_relay

from receivewal.relay.protocol import build_startup_packet, decide_startup
from receivewal.replication.commands import (
    create_logical_slot_command,
    start_logical_replication_command,
)
from receivewal.replication.connection import ReplicationConnection
from receivewal.replication.link import CopyDone, ResultStatus
from receivewal.replication.messages import (
    PrimaryKeepalive,
    XLogData,
    build_standby_status_update,
    parse_copy_data,
)
from receivewal.replication.streampack import StreampackDecoder, is_compressed

pytestmark = [pytest.mark.server, pytest.mark.slow]
SLOT = "relayed"
OPTIONS: list[tuple[str, str | None]] = [("proto_version", "1"), ("publication_names", "pub")]


@dataclass
class Received:
    """What one START_REPLICATION read: (walStart, payload) of every XLogData, restored."""

    messages: list[tuple[int, bytes]] = field(default_factory=list)
    wire_bytes: int = 0  # XLogData CopyData payloads as they came over the wire
    compressed: int = 0  # of which flagged as compressed


@dataclass
class Primary:
    pg: PgServer
    relay: RelayProcess
    end: int  # the WAL position after the workload


def dsn(port: int, requested: str | None = None) -> str:
    options = SESSION + (f" -c pg_streampack.requested={requested}" if requested else "")
    return (f"host=127.0.0.1 port={port} user=postgres dbname=app replication=database "
            f"options='{options}'")


@pytest.fixture(scope="module")
def primary() -> Iterator[Primary]:
    """A server with wal_level=logical, database ``app``, a slot created through the relay,
    then a workload; the relay (zstd and lz4 offered) in front of it for the whole module."""
    with running_server(LOGICAL_CONF) as pg, running_relay(pg.port) as relay:
        prepare_database(pg, "app")
        pg.sql("CREATE PUBLICATION pub FOR ALL TABLES", "app")
        conn = ReplicationConnection.open(dsn(relay.port, "zstd"))
        try:
            conn.query(create_logical_slot_command(SLOT, "pgoutput", two_phase=False,
                                                   server_version=conn.server_version))
        finally:
            conn.close()
        pgbench(pg, "app", "-c", "2", "-j", "2", "-t", "150")
        pg.sql("INSERT INTO items SELECT g, repeat('item ' || g, 5), g "
               "FROM generate_series(1, 3000) g", "app")
        pg.sql("UPDATE items SET qty = qty + 1 WHERE id % 3 = 0", "app")
        pg.sql("DELETE FROM items WHERE id % 7 = 0", "app")
        yield Primary(pg, relay, current_lsn(pg, "app"))


def read_slot(port: int, requested: str | None, until: int, timeout: float = 120) -> Received:
    """START_REPLICATION on the slot from its confirmed position (never confirmed here: every
    read starts at the same place) until the server has sent everything up to ``until``."""
    got = Received()
    decoder = StreampackDecoder(tuple(requested.split(",")) if requested else ())
    conn = ReplicationConnection.open(dsn(port, requested))
    try:
        conn.start_copy_both(start_logical_replication_command(SLOT, 0, OPTIONS))
        deadline = time.monotonic() + timeout
        next_status = 0.0
        while time.monotonic() < deadline:
            if time.monotonic() >= next_status:
                conn.send_copy(build_standby_status_update(0, 0, 0, 0, True))
                next_status = time.monotonic() + 0.1
            data = conn.read_copy(0.1)
            if data is None:
                continue
            assert not isinstance(data, CopyDone), "the server ended the stream"
            frame = bytes(data)
            message = parse_copy_data(frame, decoder.decode)
            if isinstance(message, XLogData):
                got.wire_bytes += len(frame)
                got.compressed += is_compressed(frame)
                got.messages.append((message.wal_start, bytes(message.payload)))
            elif isinstance(message, PrimaryKeepalive) and message.wal_end >= until:
                return got
        raise TimeoutError(f"slot {SLOT} did not send everything up to {until:X}")
    finally:
        conn.close()


def test_identify_system_and_sql_pass_through_on_a_database_connection(
    primary: Primary,
) -> None:
    conn = ReplicationConnection.open(dsn(primary.relay.port, "lz4"))
    try:
        (system, timeline, _, dbname), = conn.query("IDENTIFY_SYSTEM")
        assert system == primary.pg.sql("SELECT system_identifier FROM pg_control_system()")
        assert (timeline, dbname) == ("1", "app")
        assert conn.query("SELECT count(*), sum(abalance) FROM pgbench_accounts") == [
            tuple(primary.pg.sql("SELECT count(*) || ',' || sum(abalance) "
                                 "FROM pgbench_accounts", "app").split(","))]
        assert conn.query("SELECT plugin, database FROM pg_replication_slots "
                          f"WHERE slot_name = '{SLOT}'") == [("pgoutput", "app")]
    finally:
        conn.close()


def copy_rows(port: int, requested: str | None) -> list[bytes]:
    """COPY ... TO STDOUT on a replication=database connection (as a subscriber's table
    synchronisation does): every CopyData, rows starting with the XLogData tag 'w'."""
    conn = ReplicationConnection.open(dsn(port, requested))
    try:
        assert conn.start_copy_out("COPY (SELECT 'w' || repeat(md5(g::text), 8) FROM "
                                   "generate_series(1, 2000) g) TO STDOUT") == []
        rows = []
        while not isinstance(data := conn.read_copy(10), CopyDone):
            assert data is not None, "the COPY stalled"
            rows.append(bytes(data))
        result = conn.next_result()
        assert result is not None
        assert result.status is ResultStatus.COMMAND_OK
    finally:
        conn.close()
    return rows


def test_copy_out_on_a_database_connection_passes_through_unchanged(primary: Primary) -> None:
    direct = copy_rows(primary.pg.port, None)
    assert len(direct) == 2000
    assert all(row[:1] == b"w" for row in direct)
    assert copy_rows(primary.relay.port, "zstd") == direct


@pytest.mark.parametrize("algorithm", ["zstd", "lz4"])
def test_relayed_logical_stream_equals_the_direct_one_in_fewer_bytes(
    primary: Primary, algorithm: str,
) -> None:
    direct = read_slot(primary.pg.port, None, primary.end)
    wait_until_released(primary.pg, "app", SLOT)
    relayed = read_slot(primary.relay.port, algorithm, primary.end)
    wait_until_released(primary.pg, "app", SLOT)
    kinds = {payload[:1] for _, payload in direct.messages}
    assert {b"B", b"R", b"I", b"U", b"D", b"C"} <= kinds  # the workload's every kind
    assert len(direct.messages) > 5000
    assert direct.compressed == 0
    assert relayed.messages == direct.messages
    assert relayed.compressed > len(relayed.messages) // 2
    assert relayed.wire_bytes < direct.wire_bytes * 0.7, (relayed.wire_bytes,
                                                          direct.wire_bytes)


@pytest.mark.parametrize("value", ["database", "DATABASE", "true", "on", "1"])
def test_a_logical_connection_is_a_replication_connection(value: str) -> None:
    """replication=database (logical) negotiates as physical replication does; only the
    values the server reads as false make an ordinary connection."""
    decision = decide_startup(build_startup_packet(
        {"user": "u", "dbname": "app", "replication": value,
         "options": "-c pg_streampack.requested=lz4"})[8:], ("zstd", "lz4"))
    assert decision.replication
    assert decision.algorithm == "lz4"
    assert decision.packet[8:] == build_startup_packet(
        {"user": "u", "dbname": "app", "replication": value})[8:]
