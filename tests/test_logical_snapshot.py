"""``receivewal logical --create-slot --snapshot`` against a real PostgreSQL 15: the published
tables copied in the new slot's exported snapshot, so that the snapshot and the change log
together rebuild every table, with writes running all along (issue 37, section 1). Values the
COPY text format escapes (tabs, newlines, backslashes), NULLs, TOASTed text and bytea; a row
filter and a column list applied as pgoutput applies them; a run SIGKILLed while it copies is
taken again from a new slot; bad input gets one line."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.changelog import read_log
from support.logical import LOGICAL_CONF, current_lsn
from support.replay import compare_tables, replay
from support.servers import PgServer, make_shared_dir, running_server
from support.streams import receivewal, start_receivewal

from receivewal.logical.snapshot import (
    PARTIAL_DIRECTORY,
    decode_copy_row,
    read_manifest,
    table_records,
)
from receivewal.wal.lsn import format_lsn

pytestmark = [pytest.mark.server]

SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, note text, big text, data bytea, at timestamptz,
                    n numeric);
CREATE SCHEMA "Odd s";
CREATE TABLE "Odd s"."t x" (k bigint PRIMARY KEY, "a b" text, v double precision);
CREATE TABLE evens (id int PRIMARY KEY, v text);
CREATE TABLE narrow (id int PRIMARY KEY, shown text, hidden text);
CREATE TABLE unpublished (id int PRIMARY KEY);
CREATE TABLE bulk (id int PRIMARY KEY, pad text);
"""
ROWS = r"""
INSERT INTO items SELECT i, 'note ' || i, CASE WHEN i % 50 = 0 THEN repeat(md5(i::text), 4000)
  END, decode(md5(i::text), 'hex'), '2026-11-29 10:00:00+00'::timestamptz + i * interval '1s',
  i / 7.0 FROM generate_series(1, 2000) i;
INSERT INTO "Odd s"."t x" VALUES (1, E'tab\there', 0.1), (2, E'new\nline\\back\\slash', NULL),
  (3, NULL, 1e300), (4, E'\\N', -0.0), (5, '', 3.5);
INSERT INTO evens SELECT i, 'e' || i FROM generate_series(1, 100) i;
INSERT INTO narrow SELECT i, 's' || i, 'h' || i FROM generate_series(1, 50) i;
INSERT INTO unpublished SELECT generate_series(1, 10);
"""
PUBLICATIONS = """
CREATE PUBLICATION main FOR TABLE items, "Odd s"."t x", narrow (id, shown), bulk;
CREATE PUBLICATION filtered FOR TABLE evens WHERE (id % 2 = 0);
"""
COMPARED = ["items", "Odd s.t x"]


def test_copy_rows_are_decoded_as_the_text_format_escapes_them() -> None:
    """Tabs, newlines and backslashes come escaped; \\N alone is NULL."""
    assert decode_copy_row(b"1\tplain\t\\N\n") == ["1", "plain", None]
    assert decode_copy_row(b"tab\\there\tnew\\nline\\\\x\t\\\\N\t\n") == [
        "tab\there", "new\nline\\x", "\\N", ""]
    assert decode_copy_row(b"\\b\\f\\r\\v\n") == ["\b\f\r\v"]


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    with running_server(LOGICAL_CONF) as server:
        server.sql("CREATE DATABASE app")
        with psycopg.connect(dsn(server, "app"), autocommit=True) as conn:
            conn.execute(SCHEMA)
            conn.execute(ROWS)
            conn.execute(PUBLICATIONS)
        yield server


def dsn(pg: PgServer, dbname: str) -> str:
    return f"host=127.0.0.1 port={pg.port} user=postgres dbname={dbname}"


def logical(pg: PgServer, *args: str) -> subprocess.CompletedProcess[str]:
    return receivewal("logical", "-d", f"host=127.0.0.1 port={pg.port} user=postgres dbname=app",
                      "--log-format", "json", *args)


class Writer:
    """Writes into items and evens on its own connection until stopped."""

    def __init__(self, pg: PgServer) -> None:
        self.dsn = dsn(pg, "app")
        self.stop = threading.Event()
        self.count = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            i = 0
            while not self.stop.is_set():
                i += 1
                conn.execute("UPDATE items SET note = note || '+', n = n + 1 WHERE id = %s",
                             [i % 2000 + 1])
                conn.execute("INSERT INTO items VALUES (%s, 'new', NULL, NULL, now(), 1)",
                             [10000 + i])
                conn.execute("INSERT INTO evens VALUES (%s, 'w')", [1000 + i])
                if i % 10 == 0:
                    conn.execute("DELETE FROM items WHERE id = %s", [10000 + i - 5])
                self.count = i


def rebuilt(pg: PgServer, outdir: Path, target: str) -> None:
    """A copy of app's schema filled from the snapshot, then the change log replayed."""
    pg.sql(f"CREATE DATABASE {target}")
    with psycopg.connect(dsn(pg, target), autocommit=True) as conn:
        conn.execute(SCHEMA)
    manifest = read_manifest(outdir)
    assert manifest is not None
    records: list[dict[str, Any]] = []
    for entry in manifest.tables:
        relation: dict[str, Any] = {}
        for record in table_records(outdir, entry):
            if record["op"] == "relation":
                relation = record
                records.append(record)
            elif record["op"] == "row":
                records.append({"op": "insert", "schema": relation["schema"],
                                "table": relation["table"], "new": record["new"]})
    replay(records, dsn(pg, target))
    replay(read_log(outdir), dsn(pg, target))


def digest(pg: PgServer, dbname: str, query: str) -> tuple[Any, ...]:
    with psycopg.connect(dsn(pg, dbname)) as conn:
        row = conn.execute(f"SELECT count(*), md5(coalesce(string_agg(x::text, ',' ORDER BY "
                           f"x::text), '')) FROM ({query}) x").fetchone()
    assert row is not None
    return tuple(row)


def test_the_snapshot_and_the_log_rebuild_the_tables_with_writes_running(
        pg: PgServer) -> None:
    """While another session writes, the slot is created with its snapshot and every
    published table copied; then the change log is streamed to a point. Snapshot rows,
    then the log, applied to an empty copy of the schema give the primary's tables at that
    point: nothing twice, nothing missing; the row filter and the column list as the
    publication has them; the unpublished table left out."""
    outdir = make_shared_dir("receivewal-snap-")
    with Writer(pg) as writer:
        time.sleep(0.3)
        done = logical(pg, "-D", str(outdir), "-S", "snap", "-P", "main,filtered",
                       "--create-slot", "--snapshot", "-Z", "zstd")
        assert done.returncode == 0, done.stderr[-3000:]
        time.sleep(0.3)
    assert writer.count > 0
    end = current_lsn(pg, "app")
    streamed = logical(pg, "-D", str(outdir), "-S", "snap", "-P", "main,filtered",
                       "--endpos", format_lsn(end), "--no-loop")
    assert streamed.returncode == 0, streamed.stderr[-3000:]
    manifest = read_manifest(outdir)
    assert manifest is not None
    assert [(t.schema, t.table) for t in manifest.tables] == [
        ("Odd s", "t x"), ("public", "bulk"), ("public", "evens"), ("public", "items"),
        ("public", "narrow")]
    assert all(t.file.endswith(".jsonl.zst") for t in manifest.tables)
    assert '"snapshot_taken"' in done.stderr
    rebuilt(pg, outdir, "rebuilt")
    assert compare_tables(dsn(pg, "app"), dsn(pg, "rebuilt"), COMPARED) == {}
    assert digest(pg, "app", "SELECT * FROM evens WHERE id % 2 = 0") == \
        digest(pg, "rebuilt", "SELECT * FROM evens")
    assert digest(pg, "app", "SELECT id, shown FROM narrow") == \
        digest(pg, "rebuilt", "SELECT id, shown FROM narrow")
    assert digest(pg, "rebuilt", "SELECT hidden FROM narrow WHERE hidden IS NOT NULL")[0] == 0
    narrow = next(t for t in manifest.tables if t.table == "narrow")
    relation = next(r for r in table_records(outdir, narrow) if r["op"] == "relation")
    assert [c["name"] for c in relation["columns"]] == ["id", "shown"]
    assert relation["columns"][0] == {"name": "id", "type": "int4", "key": True}


def test_a_run_killed_while_it_copies_is_taken_again_from_a_new_slot(pg: PgServer) -> None:
    """SIGKILL once the slot exists and the copy of a large table runs: the next run with
    the same slot drops it (its snapshot is gone), takes everything anew and completes."""
    with psycopg.connect(dsn(pg, "app"), autocommit=True) as conn:
        conn.execute("INSERT INTO bulk SELECT i, repeat('x', 200) FROM generate_series(1, 400000) i"
                     " ON CONFLICT DO NOTHING")
    outdir = make_shared_dir("receivewal-snapkill-")
    args = ["logical", "-d", f"host=127.0.0.1 port={pg.port} user=postgres dbname=app",
            "-D", str(outdir), "-S", "snapkill", "-P", "main", "--create-slot", "--snapshot"]
    process = start_receivewal(*args)
    deadline = time.monotonic() + 60
    while "snapkill" not in pg.sql("SELECT slot_name FROM pg_replication_slots"):
        assert process.poll() is None, "the run ended before its slot was seen"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    process.kill()
    process.wait()
    assert (outdir / PARTIAL_DIRECTORY).is_dir()
    assert read_manifest(outdir) is None
    again = logical(pg, "-D", str(outdir), "-S", "snapkill", "-P", "main", "--create-slot",
                    "--snapshot")
    assert again.returncode == 0, again.stderr[-3000:]
    assert '"dropping_replication_slot"' in again.stderr
    manifest = read_manifest(outdir)
    assert manifest is not None
    bulk = next(t for t in manifest.tables if t.table == "bulk")
    assert bulk.rows == 400000
    assert not (outdir / PARTIAL_DIRECTORY).exists()
    pg.sql("SELECT pg_drop_replication_slot('snapkill')")


@pytest.mark.parametrize(("args", "message"), [
    (["--snapshot"], "give --create-slot"),
    (["--create-slot", "--snapshot", "--if-not-exists"], "cannot go with --if-not-exists"),
    (["--create-slot", "--snapshot", "--plugin", "pglogical_output"], "not supported"),
])
def test_a_snapshot_that_cannot_run_is_refused_in_one_line(pg: PgServer, args: list[str],
                                                           message: str) -> None:
    outdir = make_shared_dir("receivewal-snapbad-")
    done = logical(pg, "-D", str(outdir), "-S", "never", "-P", "main", *args)
    assert done.returncode != 0
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_a_snapshot_into_a_directory_that_has_one_is_refused_and_creates_no_slot(
        pg: PgServer) -> None:
    outdir = make_shared_dir("receivewal-snaptwice-")
    first = logical(pg, "-D", str(outdir), "-S", "twice", "-P", "filtered", "--create-slot",
                    "--snapshot")
    assert first.returncode == 0, first.stderr[-3000:]
    second = logical(pg, "-D", str(outdir), "-S", "twice2", "-P", "filtered", "--create-slot",
                     "--snapshot")
    assert second.returncode == 1
    assert "holds a snapshot already" in second.stderr
    assert "twice2" not in pg.sql("SELECT slot_name FROM pg_replication_slots")
    pg.sql("SELECT pg_drop_replication_slot('twice')")
