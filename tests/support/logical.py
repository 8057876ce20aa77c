"""Logical replication against real servers, for the tests: a server with wal_level=logical,
slots, a workload that exercises every kind of message, and streaming a slot's output into
a change log consumer over receivewal's own replication connection."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from receivewal.replication.commands import (
    create_logical_slot_command,
    start_logical_replication_command,
)
from receivewal.replication.connection import ReplicationConnection
from receivewal.replication.link import CopyDone
from receivewal.replication.messages import (
    PrimaryKeepalive,
    XLogData,
    build_standby_status_update,
    parse_copy_data,
)
from receivewal.wal.lsn import format_lsn, parse_lsn
from support.servers import PgServer, make_shared_dir, pg_bin, running_server
from support.streams import receivewal

LOGICAL_CONF = {
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
    "max_prepared_transactions": "10",
    "logical_decoding_work_mem": "'64kB'",  # a few thousand rows stream
}
# The settings a logical receiver's connection uses: values in UTF-8, and text output equal to
# what receivewal.logical.binary makes of binary values.
SESSION = ("-c client_encoding=UTF8 -c timezone=UTC -c datestyle=ISO -c extra_float_digits=1 "
           "-c bytea_output=hex")

Consumer = Callable[[int, bytes], None]


def replication_dsn(pg: PgServer, dbname: str) -> str:
    return (f"host=127.0.0.1 port={pg.port} user=postgres dbname={dbname} "
            f"replication=database options='{SESSION}'")


def create_slot(pg: PgServer, dbname: str, slot: str, plugin: str = "pgoutput", *,
                two_phase: bool = False) -> None:
    conn = ReplicationConnection.open(replication_dsn(pg, dbname))
    try:
        conn.query(create_logical_slot_command(slot, plugin, two_phase=two_phase,
                                               server_version=conn.server_version))
    finally:
        conn.close()


def stream_slot(pg: PgServer, dbname: str, slot: str, options: list[tuple[str, str | None]],
                receive: Consumer, *, until: int, start: int = 0,
                flushed: Callable[[], int] | None = None,
                keepalive: Callable[[int], None] | None = None,
                idle: Callable[[], bool] | None = None, timeout: float = 120) -> None:
    """START_REPLICATION on ``slot`` at ``start``; every XLogData's walStart and payload to
    ``receive`` until a keepalive says the server has sent everything up to ``until`` (and
    ``idle()`` says no transaction is open). Status updates ask for those keepalives, and
    report ``flushed()`` (0 when None: the slot is not confirmed)."""
    conn = ReplicationConnection.open(replication_dsn(pg, dbname))
    try:
        conn.start_copy_both(start_logical_replication_command(slot, start, options))
        deadline = time.monotonic() + timeout
        next_status = 0.0
        while time.monotonic() < deadline:
            if time.monotonic() >= next_status:
                done = flushed() if flushed else 0
                conn.send_copy(build_standby_status_update(done, done, done, 0, True))
                next_status = time.monotonic() + 0.1
            data = conn.read_copy(0.1)
            if data is None:
                continue
            assert not isinstance(data, CopyDone), "the server ended the stream"
            message = parse_copy_data(bytes(data))
            if isinstance(message, XLogData):
                receive(message.wal_start, bytes(message.payload))
            elif isinstance(message, PrimaryKeepalive):
                if keepalive is not None:
                    keepalive(message.wal_end)
                if message.wal_end >= until and (idle is None or idle()):
                    return
        raise TimeoutError(f"slot {slot} did not send everything up to {until:X}")
    finally:
        conn.close()
        wait_until_released(pg, dbname, slot)


def wait_until_released(pg: PgServer, dbname: str, slot: str, timeout: float = 30) -> None:
    """Wait for the walsender of a closed connection to let the slot go."""
    deadline = time.monotonic() + timeout
    query = f"SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'"
    while pg.sql(query, dbname) == "t":
        if time.monotonic() > deadline:
            raise TimeoutError(f"slot {slot} is still active")
        time.sleep(0.02)


def pgbench(pg: PgServer, dbname: str, *args: str) -> None:
    subprocess.run([pg_bin("pgbench"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres",
                    "-q" if args and args[0] == "-i" else "-n", *args, dbname],
                   check=True, capture_output=True, text=True)


def current_lsn(pg: PgServer, dbname: str) -> int:
    return parse_lsn(pg.sql("SELECT pg_current_wal_lsn()", dbname))


SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, name text, qty int);
CREATE TABLE docs (id int PRIMARY KEY, body text, note text);
CREATE TABLE full_rows (id int, val text);
ALTER TABLE full_rows REPLICA IDENTITY FULL;
CREATE TABLE scratch (id int GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, v text);
CREATE TABLE typed (id int PRIMARY KEY, i2 int2, i8 int8, f4 float4, f8 float8,
    n numeric(14,4), b bool, vc varchar(20), c char(5), by bytea, u uuid, d date, t time,
    ts timestamp, tz timestamptz, j json, jb jsonb, o oid, nm name);
"""
TABLES = ["items", "docs", "full_rows", "scratch", "typed", "pgbench_accounts",
          "pgbench_branches", "pgbench_tellers", "pgbench_history"]
BIG = 1200  # rows: enough to pass logical_decoding_work_mem (64kB) and stream


def prepare_database(pg: PgServer, dbname: str) -> None:
    """A database with the schema and pgbench's tables (pgbench -i: the same rows every
    time, so a replay target starts equal)."""
    pg.sql(f"CREATE DATABASE {dbname}")
    pg.sql(SCHEMA, dbname)
    pgbench(pg, dbname, "-i", "-s", "1")


def run_workload(pg: PgServer, dbname: str, *, messages: bool = True,
                 truncate: bool = True, full_identity: bool = True, origin: bool = True,
                 ) -> None:
    """Every kind of change: pgbench with two clients, a streamed transaction with a
    subtransaction rolled back after it streamed and savepoints released, a streamed one
    aborted, two-phase transactions committed and rolled back (one streamed), TRUNCATE,
    a TOASTed column left unchanged by an update, a REPLICA IDENTITY FULL table, every
    common type, a transaction from another node (a replication origin), and logical
    messages."""
    pgbench(pg, dbname, "-c", "2", "-j", "2", "-t", "40")

    def sql(text: str) -> None:
        pg.sql(text, dbname)

    sql(f"BEGIN; INSERT INTO items SELECT g, 'item ' || g, g FROM generate_series(1, {BIG}) g;"
        f" SAVEPOINT s1; INSERT INTO items SELECT g, 'rolled back', 0"
        f"   FROM generate_series({BIG + 1}, {3 * BIG}) g;"
        " ROLLBACK TO SAVEPOINT s1; SAVEPOINT s2;"
        f" INSERT INTO items SELECT g, 'kept', 1 FROM generate_series({3 * BIG + 1},"
        f"   {3 * BIG + 300}) g;"
        " SAVEPOINT s3; UPDATE items SET qty = qty + 100 WHERE id <= 200; RELEASE s3;"
        " RELEASE s2; DELETE FROM items WHERE id % 10 = 0; COMMIT")
    sql(f"BEGIN; INSERT INTO items SELECT g, 'aborted', 0 FROM generate_series(10001,"
        f" {10000 + BIG}) g; ROLLBACK")
    sql("BEGIN; INSERT INTO items VALUES (20001, '2pc kept', 1); PREPARE TRANSACTION 'gc'")
    sql("COMMIT PREPARED 'gc'")
    sql("BEGIN; INSERT INTO items VALUES (20002, '2pc dropped', 1); PREPARE TRANSACTION 'gr'")
    sql("ROLLBACK PREPARED 'gr'")
    sql(f"BEGIN; INSERT INTO items SELECT g, 'streamed 2pc', 2 FROM generate_series(30001,"
        f" {30000 + BIG}) g; PREPARE TRANSACTION 'gs'")
    sql("COMMIT PREPARED 'gs'")
    sql("INSERT INTO docs VALUES (1, (SELECT string_agg(md5(g::text), '') FROM"
        " generate_series(1, 400) g), 'first'), (2, 'short', 'x')")
    sql("UPDATE docs SET note = 'second' WHERE id = 1")  # body: unchanged TOAST
    if full_identity:
        sql("INSERT INTO full_rows VALUES (1, 'a'), (2, 'b'), (2, 'b')")
        sql("UPDATE full_rows SET val = 'c' WHERE id = 1")
        sql("DELETE FROM full_rows WHERE ctid = (SELECT min(ctid) FROM full_rows WHERE id = 2)")
    if origin:  # a replication origin is the server's: once per server
        sql("SELECT pg_replication_origin_create('upstream')")
        sql("BEGIN; SELECT pg_replication_origin_session_setup('upstream');"
            " SELECT pg_replication_origin_xact_setup('0/ABCDEF', now());"
            " INSERT INTO items VALUES (50001, 'from upstream', 1); COMMIT")
    sql("INSERT INTO typed VALUES (1, -32768, 9223372036854775807, 1.5, 0.1, 1234567890.1234,"
        " true, 'caf\u00e9', 'ab', '\\x00ff', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',"
        " '0044-03-15 BC', '24:00:00', '2026-11-26 10:00:00.5', '2026-11-26 10:00:00+05',"
        " '{\"b\": [1, 2.50]}', '{\"b\": [1, 2.50]}', 4000000000, 'n'),"
        " (2, NULL, NULL, 'NaN', '-Infinity', 'NaN', NULL, NULL, NULL, NULL, NULL,"
        " 'infinity', NULL, '-infinity', NULL, NULL, NULL, NULL, NULL)")
    sql("UPDATE typed SET f4 = 121338016, f8 = 1e15 WHERE id = 1")
    if truncate:
        sql("INSERT INTO scratch (v) SELECT 'gone' FROM generate_series(1, 5)")
        sql("TRUNCATE scratch RESTART IDENTITY")
        sql("INSERT INTO scratch (v) VALUES ('after the truncate')")
    if messages:
        sql("SELECT pg_logical_emit_message(false, 'app', 'not transactional')")
        sql("BEGIN; INSERT INTO items VALUES (40001, 'with a message', 1);"
            " SELECT pg_logical_emit_message(true, 'app', 'transactional'); COMMIT")


def dsn(pg: PgServer, dbname: str) -> str:
    """A plain client's connection string to ``dbname``."""
    return f"host=127.0.0.1 port={pg.port} user=postgres dbname={dbname}"


@dataclass
class ChangeLogSource:
    """What ``receivewal apply`` reads: a server whose database ``app`` had rows before its
    slot, and the change log in ``outdir`` (its snapshot, then the workload)."""

    pg: PgServer
    outdir: Path

    def target(self, name: str) -> str:
        """A new database with app's schema and no rows."""
        self.pg.sql(f"CREATE DATABASE {name}")
        schema = subprocess.run([pg_bin("pg_dump"), "--schema-only", dsn(self.pg, "app")],
                                check=True, capture_output=True, text=True).stdout
        subprocess.run([pg_bin("psql"), "-q", "-v", "ON_ERROR_STOP=1", dsn(self.pg, name)],
                       input=schema, check=True, capture_output=True, text=True)
        return dsn(self.pg, name)

    def apply(self, target: str, *args: str) -> subprocess.CompletedProcess[str]:
        return receivewal("apply", "-D", str(self.outdir), "--to", target, *args)


@contextlib.contextmanager
def change_log_source(slot: str, prefix: str,
                      then: Callable[[PgServer], None] | None = None,
                      ) -> Iterator[ChangeLogSource]:
    """A server with wal_level=logical; in its database ``app``, 300 rows of items, then the
    publication ``pub`` and the slot ``slot`` with its snapshot, then the workload (and
    ``then``'s changes); the change log of all of it, zstd at rest in 64 kB files, in a new
    directory named with ``prefix``."""
    with running_server(LOGICAL_CONF) as pg:
        prepare_database(pg, "app")
        pg.sql("INSERT INTO items SELECT g, 'before the slot', g FROM "
               "generate_series(100001, 100300) g", "app")
        pg.sql("CREATE PUBLICATION pub FOR ALL TABLES", "app")
        outdir = make_shared_dir(prefix)
        common = ["-d", dsn(pg, "app"), "-D", str(outdir), "-S", slot, "-P", "pub",
                  "--two-phase", "--log-format", "json"]
        created = receivewal("logical", *common, "--create-slot", "--snapshot", "-Z", "zstd")
        assert created.returncode == 0, created.stderr[-3000:]
        run_workload(pg, "app")
        if then is not None:
            then(pg)
        end = current_lsn(pg, "app")
        streamed = receivewal("logical", *common, "--endpos", format_lsn(end), "--no-loop",
                              "--file-size", "64kB")
        assert streamed.returncode == 0, streamed.stderr[-3000:]
        yield ChangeLogSource(pg, outdir)
