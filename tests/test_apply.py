"""``receivewal apply`` into PostgreSQL against a real PostgreSQL 15 (issue 37, section 2): a
database with rows before the slot, its snapshot, then the workload of the change log tests
(pgbench, a streamed big transaction, two-phase commits committed and rolled back, TRUNCATE,
an unchanged TOAST column, a REPLICA IDENTITY FULL table without a key, every common type),
applied into an empty copy of the schema with SIGKILLs of apply in between: every table equal
to the primary's, and a second run changes nothing. A conflict stops with one line naming the
table (or the LSN) and applies nothing of its unit."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from support.logical import TABLES, change_log_source, dsn
from support.logical import ChangeLogSource as Source
from support.replay import compare_tables
from support.streams import receivewal, start_receivewal

pytestmark = [pytest.mark.server]


@pytest.fixture(scope="module")
def source() -> Iterator[Source]:
    with change_log_source("applied", "receivewal-apply-") as made:
        yield made


def test_apply_killed_again_and_again_ends_with_the_primarys_tables(source: Source) -> None:
    """SIGKILLed four times while it applies, then run to the end: every table equals the
    primary's; a second run applies nothing and changes nothing."""
    target = source.target("killed")
    for delay in (0.3, 0.6, 0.9, 1.2):
        process = start_receivewal("apply", "-D", str(source.outdir), "--to", target)
        time.sleep(delay)
        process.kill()
        process.wait()
    done = source.apply(target)
    assert done.returncode == 0, done.stderr[-3000:]
    assert compare_tables(dsn(source.pg, "app"), target, TABLES) == {}
    again = source.apply(target)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "applied 0 snapshot tables (0 rows) and 0 transactions" in again.stdout
    assert compare_tables(dsn(source.pg, "app"), target, TABLES) == {}


def test_apply_in_one_run_counts_what_it_applied(source: Source) -> None:
    """One run: every snapshot table, then every transaction; the summary says so."""
    target = source.target("once")
    done = source.apply(target)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"applied {len(TABLES)} snapshot tables" in done.stdout
    assert compare_tables(dsn(source.pg, "app"), target, TABLES) == {}
    with psycopg.connect(target) as conn:
        row = conn.execute("SELECT snapshot_tables, applied_through::text FROM "
                           "receivewal.apply_progress WHERE source = 'applied'").fetchone()
    assert row is not None
    assert row[0] == len(TABLES)


def test_a_key_already_in_the_target_stops_naming_the_table_and_applies_none_of_it(
        source: Source) -> None:
    target = source.target("conflicted")
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("INSERT INTO pgbench_branches VALUES (1, 0, 'there before')")
    done = source.apply(target)
    assert done.returncode == 4  # a new run cannot fix it: the unit stays down
    assert "pgbench_branches" in done.stderr
    assert "nothing of the table was applied" in done.stderr
    assert "Traceback" not in done.stderr
    with psycopg.connect(target) as conn:
        assert conn.execute("SELECT count(*) FROM pgbench_branches").fetchone() == (1,)


def test_a_change_that_finds_no_row_stops_naming_its_lsn_and_table(source: Source) -> None:
    """The target claims the snapshot but lacks its rows: the first update stops apply with
    the transaction's LSN, the table and the key; nothing of that transaction is applied."""
    target = source.target("missing")
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA receivewal")
        conn.execute("CREATE TABLE receivewal.apply_progress (source text PRIMARY KEY, "
                     "snapshot_tables integer NOT NULL DEFAULT 0, applied_through pg_lsn NOT "
                     "NULL DEFAULT '0/0', updated_at timestamptz NOT NULL DEFAULT now())")
        conn.execute("INSERT INTO receivewal.apply_progress (source, snapshot_tables) "
                     "VALUES ('applied', 99)")
    done = source.apply(target)
    assert done.returncode == 4
    assert "transaction committed at" in done.stderr
    assert "finds no row of table public.pgbench_" in done.stderr
    assert "Traceback" not in done.stderr
    with psycopg.connect(target) as conn:
        assert conn.execute("SELECT applied_through::text FROM receivewal.apply_progress"
                            ).fetchone() == ("0/0",)


def test_bad_input_gets_one_line(source: Source, tmp_path: Path) -> None:
    missing = receivewal("apply", "-D", str(tmp_path / "nowhere"), "--to", "dbname=x")
    assert missing.returncode == 1
    assert "Traceback" not in missing.stderr
    empty = receivewal("apply", "-D", str(tmp_path), "--to", dsn(source.pg, "app"))
    assert empty.returncode == 1
    assert "holds no change log" in empty.stderr
    unreachable = receivewal("apply", "-D", str(source.outdir), "--to",
                             "host=127.0.0.1 port=1 user=postgres password=sekrit dbname=x")
    assert unreachable.returncode == 1
    assert "cannot connect to the target" in unreachable.stderr
    assert "sekrit" not in unreachable.stderr


def test_follow_applies_what_the_log_receives_and_stops_cleanly_on_sigterm(
        source: Source) -> None:
    """apply --follow beside a running logical daemon: a row committed at the primary reaches
    the target through the log; SIGTERM ends apply with 0 (last in the module: the log grows)."""
    target = source.target("followed")
    daemon = start_receivewal("logical", "-d", dsn(source.pg, "app"), "-D", str(source.outdir),
                              "-S", "applied", "-P", "pub", "--two-phase", "--status-interval",
                              "1")
    follower = start_receivewal("apply", "-D", str(source.outdir), "--to", target, "--follow")
    try:
        source.pg.sql("INSERT INTO items VALUES (777777, 'followed', 1)", "app")
        deadline = time.monotonic() + 120
        with psycopg.connect(target, autocommit=True) as conn:
            while conn.execute("SELECT count(*) FROM items WHERE id = 777777").fetchone() != (1,):
                assert follower.poll() is None, "apply --follow ended on its own"
                assert time.monotonic() < deadline, "the row never reached the target"
                time.sleep(0.2)
        follower.terminate()
        assert follower.wait(timeout=30) == 0
    finally:
        for process in (follower, daemon):
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=30)
    assert compare_tables(dsn(source.pg, "app"), target, TABLES) == {}
