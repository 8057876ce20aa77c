"""``receivewal apply`` into PostgreSQL against a real PostgreSQL 15 (issue 37, section 2): a
database with rows before the slot, its snapshot, then the workload of the change log tests
(pgbench, a streamed big transaction, two-phase commits committed and rolled back, TRUNCATE,
an unchanged TOAST column, a REPLICA IDENTITY FULL table without a key, every common type),
applied into an empty copy of the schema with SIGKILLs of apply in between: every table equal
to the primary's, and a second run changes nothing. A conflict stops with one line naming the
table (or the LSN) and applies nothing of its unit."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from support.agekeys import new_identity_file
from support.logical import TABLES, change_log_source, current_lsn, dsn
from support.logical import ChangeLogSource as Source
from support.replay import compare_tables
from support.streams import RECEIVEWAL, receivewal, start_receivewal

from receivewal.apply.postgres import PostgresTarget
from receivewal.apply.source import Transaction
from receivewal.archive.storedform import plain_chunks
from receivewal.logical.store import change_files, parse_file_name
from receivewal.wal.lsn import format_lsn

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


def test_a_set_wise_run_that_finds_no_row_names_its_key_with_the_transactions_before_applied(
        source: Source) -> None:
    """The streamed transaction's 200 updates go set-wise; the target lost one of its rows (a
    trigger skips it): apply stops naming that update's key, with nothing of that transaction
    applied and the transactions before it (pgbench's, in the same batch) applied."""
    target = source.target("set_wise")
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION skip_150() RETURNS trigger LANGUAGE plpgsql AS "
                     "$$BEGIN IF NEW.id = 150 THEN RETURN NULL; END IF; RETURN NEW; END$$")
        conn.execute("CREATE TRIGGER skip_150 BEFORE INSERT ON items FOR EACH ROW "
                     "EXECUTE FUNCTION skip_150()")
    done = source.apply(target)
    assert done.returncode == 4, done.stderr[-3000:]
    assert "update at " in done.stderr
    assert "finds no row of table public.items with id = '150'" in done.stderr
    assert "nothing of the transaction was applied" in done.stderr
    assert "Traceback" not in done.stderr
    with psycopg.connect(target) as conn:
        assert conn.execute("SELECT count(*) FROM pgbench_history").fetchone() == (80,)
        assert conn.execute("SELECT count(*) FROM items WHERE name <> 'before the slot'"
                            ).fetchone() == (0,)


def test_a_sealed_change_log_is_applied_with_the_identity(source: Source,
                                                          tmp_path: Path) -> None:
    """logical --snapshot --encrypt-to seals the snapshot and every completed change file;
    apply without --identity stops with one line, with it brings the tables equal to the
    primary's (a snapshot, set-wise updates and deletes, keys updated again in the same batch,
    an unchanged TOAST column), and a second run applies nothing."""
    pg = source.pg
    pg.sql("CREATE DATABASE sealed_src")
    schema = ("CREATE TABLE kv (id int PRIMARY KEY, v text, n int); "
              "CREATE TABLE notes (id int PRIMARY KEY, body text, note text)")
    pg.sql(schema, "sealed_src")
    pg.sql("INSERT INTO kv SELECT g, md5(g::text), g FROM generate_series(1, 500) g",
           "sealed_src")
    pg.sql("CREATE PUBLICATION sealed_pub FOR ALL TABLES", "sealed_src")
    key = new_identity_file(tmp_path / "identity.txt")
    outdir = tmp_path / "log"
    outdir.mkdir()
    common = ["-d", dsn(pg, "sealed_src"), "-D", str(outdir), "-S", "sealed", "-P",
              "sealed_pub", "--log-format", "json", "--encrypt-to", key.recipient, "-Z", "zstd"]
    created = receivewal("logical", *common, "--create-slot", "--snapshot")
    assert created.returncode == 0, created.stderr[-3000:]
    for first in range(501, 3001, 500):
        pg.sql(f"INSERT INTO kv SELECT g, md5(g::text), g FROM generate_series({first}, "
               f"{first + 499}) g", "sealed_src")
    pg.sql("UPDATE kv SET n = n + 1, v = v || 'u' WHERE id <= 1500", "sealed_src")
    for _ in range(2):  # the same keys again: one batch, one shape, the runs cut at a key
        pg.sql("UPDATE kv SET n = n * 2 WHERE id <= 100", "sealed_src")
    pg.sql("DELETE FROM kv WHERE id % 7 = 0", "sealed_src")
    pg.sql("INSERT INTO notes VALUES (1, (SELECT string_agg(md5(g::text), '') FROM "
           "generate_series(1, 400) g), 'first')", "sealed_src")
    pg.sql("UPDATE notes SET note = 'second' WHERE id = 1", "sealed_src")
    end = current_lsn(pg, "sealed_src")
    streamed = receivewal("logical", *common, "--endpos", format_lsn(end), "--no-loop",
                          "--file-size", "64kB")
    assert streamed.returncode == 0, streamed.stderr[-3000:]
    assert [p for p in outdir.iterdir() if p.name.endswith(".jsonl.zst.age")]
    snapshot = sorted(p.name for p in (outdir / "snapshot").iterdir())
    assert [name for name in snapshot if name.endswith(".jsonl.zst.age")], snapshot
    assert not [name for name in snapshot if name.endswith((".jsonl", ".jsonl.zst"))], snapshot
    pg.sql("CREATE DATABASE sealed_dst")
    pg.sql(schema, "sealed_dst")
    target = dsn(pg, "sealed_dst")
    without = receivewal("apply", "-D", str(outdir), "--to", target)
    assert without.returncode == 1
    assert "sealed" in without.stderr
    assert "identity" in without.stderr
    assert "Traceback" not in without.stderr
    done = receivewal("apply", "-D", str(outdir), "--to", target, "--identity", str(key.path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "applied 2 snapshot tables (500 rows)" in done.stdout
    assert compare_tables(dsn(pg, "sealed_src"), target, ["kv", "notes"]) == {}
    again = receivewal("apply", "-D", str(outdir), "--to", target, "--identity", str(key.path))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "applied 0 snapshot tables (0 rows) and 0 transactions" in again.stdout
    assert compare_tables(dsn(pg, "sealed_src"), target, ["kv", "notes"]) == {}


def test_keys_updated_again_in_one_batch_end_with_their_last_values(source: Source) -> None:
    """Three transactions of one batch update the same 20 keys: the set-wise runs (cut at the
    repeated key) leave each row with the last transaction's value, in one target transaction
    (none applied again one at a time)."""
    source.pg.sql("CREATE DATABASE repeated")
    source.pg.sql("CREATE TABLE t (id int PRIMARY KEY, n int); "
                  "INSERT INTO t SELECT g, 0 FROM generate_series(1, 20) g", "repeated")
    columns = [{"name": "id", "key": True}, {"name": "n", "key": False}]
    batch = [Transaction(0x100 + k, 0x100 + k, None, [
        ({"op": "update", "lsn": f"0/{0x100 + k:X}", "schema": "public", "table": "t",
          "old": None, "new": {"id": str(i), "n": str(10 * k + i)}}, columns)
        for i in range(1, 21)]) for k in range(3)]
    target = PostgresTarget(dsn(source.pg, "repeated"), "repeated")
    try:
        target.begin(0)
        alone: list[Transaction] = []
        target.apply_transaction = alone.append  # type: ignore[method-assign,assignment]
        assert target.apply_batch(batch) == 3
        assert alone == []
    finally:
        target.close()
    assert source.pg.sql("SELECT string_agg(n::text, ',' ORDER BY id) FROM t", "repeated") == \
        ",".join(str(20 + i) for i in range(1, 21))


def test_a_follower_reads_only_what_the_log_gained_at_each_poll(source: Source) -> None:
    """apply --follow while a logical daemon writes rows into 8 kB files: each poll goes on
    where the one before stopped, opening only that file and the new ones and reading every
    line of the log once (the summary's counts; a follower that read the log from its first
    file at every poll would count each file once a poll); the target ends equal to the
    primary (last in the module with the follow test: the log grows)."""
    target = source.target("polled")
    daemon = start_receivewal("logical", "-d", dsn(source.pg, "app"), "-D", str(source.outdir),
                              "-S", "applied", "-P", "pub", "--two-phase", "--status-interval",
                              "1", "--file-size", "8kB")
    follower = subprocess.Popen([*RECEIVEWAL, "apply", "-D", str(source.outdir), "--to",
                                 target, "--follow"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        held = int(source.pg.sql("SELECT count(*) FROM items", "app"))
        deadline = time.monotonic() + 300
        with psycopg.connect(target, autocommit=True) as conn:
            while conn.execute("SELECT count(*) FROM items").fetchone() != (held,):
                assert follower.poll() is None, "apply --follow ended on its own"
                assert time.monotonic() < deadline, "the log never reached the target"
                time.sleep(0.2)
        for batch in range(8):  # a poll a second: the rows come over several polls
            first = 900000 + 40 * batch
            source.pg.sql(f"INSERT INTO items SELECT g, 'polled', g FROM "
                          f"generate_series({first}, {first + 39}) g", "app")
            time.sleep(1.2)
        deadline = time.monotonic() + 180
        with psycopg.connect(target, autocommit=True) as conn:
            while conn.execute("SELECT count(*) FROM items WHERE name = 'polled'"
                               ).fetchone() != (320,):
                assert follower.poll() is None, "apply --follow ended on its own"
                assert time.monotonic() < deadline, "the rows never reached the target"
                time.sleep(0.2)
        follower.terminate()
        out, err = follower.communicate(timeout=60)
        assert follower.returncode == 0, err[-3000:]
    finally:
        for process in (follower, daemon):
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=30)
    counted = re.search(r"; (\d+) bytes of the change log read in (\d+) reads "
                        r"\((\d+) files opened\)", out)
    assert counted is not None, out[-3000:]
    taken, reads, opened = (int(group) for group in counted.groups())
    files = change_files(source.outdir)
    assert reads >= 5
    assert len(files) >= 3
    assert opened <= len(files) + reads  # each poll: the file it stopped in, the new ones
    assert taken <= sum(_plain_size(source.outdir / name) for name in files)
    assert compare_tables(dsn(source.pg, "app"), target, TABLES) == {}


def _plain_size(path: Path) -> int:
    parsed = parse_file_name(path.name)
    assert parsed is not None
    with path.open("rb") as fh:
        return sum(len(chunk) for chunk in plain_chunks(fh, parsed[1]))
