"""``receivewal analyze --changes DIR --as-of TIME|LSN --tables OUT`` (issue 37, section 3):
a change log's tables as they were at a commit, built on Spark, against a real PostgreSQL 15.

The source is test_apply's (rows before the slot, ``logical --create-slot --snapshot``, the
change log tests' workload), with track_commit_timestamp on and the workload in two halves:
between them nothing is connected to the database, its LSN and time are recorded and the
database is copied (``CREATE DATABASE middle TEMPLATE app``), the oracle of the tables at that
point. Every table built as of that LSN, and as of that time, equals the copy; built as of the
end, the primary. Hand-written logs hold the rules the workload cannot show on demand (order
by commit then position, not by a change's LSN; prepared transactions at their COMMIT
PREPARED; TRUNCATE; a key that moves; the refusals). One Spark session for every module
(tests/conftest.py's ``spark``).
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from psycopg import sql
from support.logical import (
    LOGICAL_CONF,
    TABLES,
    current_lsn,
    pgbench,
    prepare_database,
    run_workload,
)
from support.seaweed import SeaweedS3
from support.servers import PgServer, make_shared_dir, running_server
from support.sparkarchives import SharedSession
from support.streams import receivewal

from receivewal.archive.bucket import Bucket
from receivewal.check import sparksession
from receivewal.check.asof import AsOf, parse_as_of, run_as_of
from receivewal.commands.group import cli
from receivewal.errors import ArchiveError, ConfigurationError
from receivewal.wal.lsn import format_lsn, parse_lsn

pytestmark = [pytest.mark.spark, pytest.mark.slow]
#: The change log's session settings (docs/changelog.md): the oracle's text is the log's.
SESSION = ("-c TimeZone=UTC -c DateStyle=ISO -c extra_float_digits=1 -c bytea_output=hex "
           "-c client_encoding=UTF8")


def dsn(pg: PgServer, dbname: str) -> str:
    return f"host=127.0.0.1 port={pg.port} user=postgres dbname={dbname}"


def built(out: Path, table: str) -> tuple[list[str], Counter[tuple[str | None, ...]]]:
    """A table read back from its Parquet folder: its columns, and its rows counted."""
    read = pq.read_table(out / table)
    columns = read.column_names
    return columns, Counter(zip(*(read.column(c).to_pylist() for c in columns), strict=True))


def rows_of(conninfo: str, table: str, columns: list[str]) -> Counter[tuple[str | None, ...]]:
    """The database's rows of ``table`` as the change log writes values: each type's text
    output under the log's session settings (COPY's text, as the snapshot takes it; a cast
    to text is not it: ``true`` for ``t``, a char(5) trimmed)."""
    schema, name = table.split(".")
    query = sql.SQL("COPY (SELECT {} FROM {}) TO STDOUT").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in columns), sql.Identifier(schema, name))
    with psycopg.connect(conninfo, options=SESSION) as conn, \
            conn.cursor().copy(query) as copy:
        return Counter(tuple(row) for row in copy.rows())


def assert_equal_tables(out: Path, conninfo: str) -> None:
    for table in TABLES:
        columns, rows = built(out, f"public.{table}")
        assert rows == rows_of(conninfo, f"public.{table}", columns), table


@dataclass
class Source:
    pg: PgServer
    outdir: Path
    middle_lsn: int
    middle_time: str
    end_lsn: int


def second_half(pg: PgServer) -> None:
    """After the middle point: more of every kind of change, a key moved, a TOAST column
    left unchanged again, a two-phase commit, a truncate."""
    pgbench(pg, "app", "-c", "2", "-j", "2", "-t", "20")
    for statement in (
            "UPDATE docs SET note = 'third' WHERE id = 1",
            "UPDATE items SET qty = qty + 1 WHERE id % 7 = 0",
            "DELETE FROM items WHERE id % 11 = 0",
            "UPDATE items SET id = id + 200000 WHERE id BETWEEN 100001 AND 100010",
            "INSERT INTO full_rows VALUES (3, 'd'), (3, 'd')",
            "DELETE FROM full_rows WHERE id = 1",
            "BEGIN; INSERT INTO scratch (v) VALUES ('2pc later'); PREPARE TRANSACTION 'late'",
            "COMMIT PREPARED 'late'",
            "TRUNCATE pgbench_history",
            "INSERT INTO pgbench_history (tid, bid, aid, delta) VALUES (1, 1, 1, 5)"):
        pg.sql(statement, "app")


@pytest.fixture(scope="module")
def source() -> Iterator[Source]:
    with running_server({**LOGICAL_CONF, "track_commit_timestamp": "on"}) as pg:
        prepare_database(pg, "app")
        pg.sql("INSERT INTO items SELECT g, 'before the slot', g FROM "
               "generate_series(100001, 100300) g", "app")
        pg.sql("CREATE PUBLICATION pub FOR ALL TABLES", "app")
        outdir = make_shared_dir("receivewal-asof-")
        common = ["-d", dsn(pg, "app"), "-D", str(outdir), "-S", "asof", "-P", "pub",
                  "--two-phase", "--log-format", "json"]
        created = receivewal("logical", *common, "--create-slot", "--snapshot", "-Z", "zstd")
        assert created.returncode == 0, created.stderr[-3000:]
        run_workload(pg, "app")
        # the middle point: the workload paused, nothing connected to app
        middle_lsn = current_lsn(pg, "app")
        middle_time = pg.sql("SELECT to_char(now() AT TIME ZONE 'UTC', "
                             "'YYYY-MM-DD\"T\"HH24:MI:SS.US') || '+00:00'")
        pg.sql("CREATE DATABASE middle TEMPLATE app")
        second_half(pg)
        end = current_lsn(pg, "app")
        streamed = receivewal("logical", *common, "--endpos", format_lsn(end), "--no-loop",
                              "--file-size", "64kB")
        assert streamed.returncode == 0, streamed.stderr[-3000:]
        yield Source(pg, outdir, middle_lsn, middle_time, end)


@pytest.mark.server
def test_as_of_the_middle_lsn_equals_the_copy_taken_there(spark: Any, source: Source,
                                                           tmp_path: Path) -> None:
    done = run_as_of(spark, str(source.outdir), str(tmp_path), AsOf(lsn=source.middle_lsn))
    assert set(done.tables) == {f"public.{t}" for t in TABLES}
    assert done.last_commit is not None
    assert done.last_commit[0] <= source.middle_lsn
    assert_equal_tables(tmp_path, dsn(source.pg, "middle"))
    assert rows_of(dsn(source.pg, "middle"), "public.items", ["id"]) != rows_of(
        dsn(source.pg, "app"), "public.items", ["id"])  # the halves differ: a real test


@pytest.mark.server
def test_as_of_the_middle_time_through_the_command_equals_the_copy(
        spark: Any, source: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``receivewal analyze --changes DIR --as-of TIME --tables OUT`` through the command
    group, on the shared session."""
    monkeypatch.setattr(sparksession, "make_session", lambda *_, **__: SharedSession(spark))
    run = CliRunner().invoke(cli, ["analyze", "--changes", str(source.outdir), "--as-of",
                                   source.middle_time, "--tables", str(tmp_path / "t")])
    assert run.exit_code == 0, run.output
    first, *_ = run.stdout.splitlines()
    assert first.startswith(f"{source.outdir}: as of ")
    assert "through the transaction committed at" in first
    assert "public.items: " in run.stdout
    assert_equal_tables(tmp_path / "t", dsn(source.pg, "middle"))


@pytest.mark.server
def test_as_of_the_end_equals_the_primary(spark: Any, source: Source, tmp_path: Path) -> None:
    run_as_of(spark, str(source.outdir), str(tmp_path), AsOf(lsn=source.end_lsn))
    assert_equal_tables(tmp_path, dsn(source.pg, "app"))


@pytest.mark.server
def test_before_the_consistent_point_is_refused(spark: Any, source: Source,
                                                tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="before the snapshot's consistent point"):
        run_as_of(spark, str(source.outdir), str(tmp_path), AsOf(lsn=0x100))
    with pytest.raises(ConfigurationError, match="before the snapshot was taken"):
        run_as_of(spark, str(source.outdir), str(tmp_path),
                  parse_as_of("2000-01-01T00:00:00Z"))


# -- hand-written logs -------------------------------------------------------------------------
T_COLUMNS = [{"name": "id", "type": "int4", "key": True},
             {"name": "v", "type": "text", "key": False},
             {"name": "body", "type": "text", "key": False}]
BAG_COLUMNS = [{"name": "a", "type": "text", "key": False},
               {"name": "b", "type": "int4", "key": False}]
HEADER = {"op": "header", "format": 1, "plugin": "pgoutput"}


def lines(*records: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def relation(table: str, columns: list[dict[str, Any]]) -> dict[str, Any]:
    return {"op": "relation", "lsn": "0/1000000", "schema": "public", "table": table,
            "columns": columns}


def tx(xid: int, commit: str, when: str, *changes: dict[str, Any]) -> list[dict[str, Any]]:
    times = {"xid": xid, "commit_lsn": commit, "commit_time": f"2026-11-26T10:00:{when}Z"}
    end = format_lsn(parse_lsn(commit) + 0x30)
    return [{"op": "begin", "lsn": commit, **times},
            *({**c, "xid": xid, "schema": "public"} for c in changes),
            {"op": "commit", "lsn": commit, **times, "end_lsn": end}]


def t_row(key: int, v: str, body: str | None = None) -> dict[str, Any]:
    return {"id": str(key), "v": v, **({"body": body} if body is not None else {})}


def write_snapshot(log: Path) -> None:
    (log / "snapshot").mkdir(parents=True)
    tables = []
    for index, (table, columns, rows) in enumerate((
            ("t", T_COLUMNS, [t_row(1, "a", "B1"), t_row(2, "b", "B2"), t_row(3, "c", "B3")]),
            ("bag", BAG_COLUMNS, [{"a": "x", "b": "1"}, {"a": "x", "b": "1"}])), start=1):
        name = f"{index:04d}.jsonl"
        (log / "snapshot" / name).write_bytes(lines(
            {"op": "header", "format": 1, "slot": "s", "snapshot": "00000003-1",
             "consistent_point": "0/1000000"}, relation(table, columns),
            *({"op": "row", "new": row} for row in rows), {"op": "end", "rows": len(rows)}))
        tables.append({"schema": "public", "table": table, "file": name, "rows": len(rows)})
    (log / "snapshot" / "manifest.json").write_text(json.dumps(
        {"format": 1, "slot": "s", "snapshot": "00000003-1", "consistent_point": "0/1000000",
         "taken_at": "2026-11-26T10:00:00.000000Z", "tables": tables}))


def write_log(log: Path, *, snapshot: bool = True) -> None:
    """A snapshot (t: 1, 2, 3; bag: (x, 1) twice) and two files of transactions."""
    log.mkdir()
    if snapshot:
        write_snapshot(log)
    prepared = {"xid": 50, "gid": "g1", "prepare_lsn": "0/1000200", "end_lsn": "0/1000230",
                "prepare_time": "2026-11-26T10:00:01.500000Z"}
    (log / "0000000001000100.jsonl").write_bytes(lines(
        HEADER, relation("t", T_COLUMNS), relation("bag", BAG_COLUMNS),
        *tx(10, "0/1000100", "01.000000",
            {"op": "insert", "lsn": "0/1000010", "table": "t", "new": t_row(4, "d", "B4")},
            {"op": "update", "lsn": "0/1000020", "table": "t", "old": None,
             "new": {"id": "1", "v": "a2"}, "unchanged_toast": ["body"]}),
        {"op": "begin_prepare", "lsn": "0/1000150", **prepared},
        {"op": "update", "lsn": "0/1000160", "xid": 50, "schema": "public", "table": "t",
         "old": None, "new": t_row(2, "b2", "B2x"), "unchanged_toast": []},
        {"op": "prepare", "lsn": "0/1000200", **prepared},
        *tx(11, "0/1000300", "02.000000",
            {"op": "delete", "lsn": "0/1000250", "table": "t", "old": {"id": "3"}},
            {"op": "insert", "lsn": "0/1000260", "table": "bag", "new": {"a": "y", "b": "2"}},
            {"op": "delete", "lsn": "0/1000270", "table": "bag", "old": {"a": "x", "b": "1"}}),
        # the second change's LSN is the lower one: its place in the transaction decides
        *tx(12, "0/1000500", "02.600000",
            {"op": "insert", "lsn": "0/1000480", "table": "t", "new": t_row(5, "e", "B5")},
            {"op": "update", "lsn": "0/1000400", "table": "t", "old": None,
             "new": t_row(5, "e2", "B5")})))
    dropped = {"xid": 51, "gid": "g2", "prepare_lsn": "0/2000200", "end_lsn": "0/2000230",
               "prepare_time": "2026-11-26T10:00:03.500000Z"}
    (log / "0000000002000100.jsonl.partial").write_bytes(lines(
        HEADER, relation("t", T_COLUMNS),
        {"op": "commit_prepared", "lsn": "0/2000100", "xid": 50, "gid": "g1",
         "commit_lsn": "0/2000100", "end_lsn": "0/2000130",
         "commit_time": "2026-11-26T10:00:03.000000Z"},
        {"op": "begin_prepare", "lsn": "0/2000150", **dropped},
        {"op": "insert", "lsn": "0/2000160", "xid": 51, "schema": "public", "table": "t",
         "new": t_row(6, "f", "B6")},
        {"op": "prepare", "lsn": "0/2000200", **dropped},
        {"op": "rollback_prepared", "lsn": "0/2000240", "xid": 51, "gid": "g2",
         "prepare_end_lsn": "0/2000230", "rollback_end_lsn": "0/2000250"},
        *tx(13, "0/2000300", "04.000000",
            {"op": "truncate", "lsn": "0/2000280", "tables": [["public", "t"]],
             "cascade": False, "restart_identity": False},
            {"op": "insert", "lsn": "0/2000290", "table": "t", "new": t_row(7, "g", "B7")}),
        *tx(14, "0/2000500", "05.000000",
            {"op": "update", "lsn": "0/2000450", "table": "t", "old": {"id": "7"},
             "new": t_row(8, "h", "B7")}),
        {"op": "begin", "lsn": "0/2000700", "xid": 15, "commit_lsn": "0/2000700",
         "commit_time": "2026-11-26T10:00:06.000000Z"},
        {"op": "insert", "lsn": "0/2000710", "xid": 15, "schema": "public", "table": "t",
         "new": t_row(9, "never committed", "B9")}))


def tables_at(spark: Any, log: Path | str, out: Path, point: str,
              **options: Any) -> dict[str, Counter[tuple[str | None, ...]]]:
    run_as_of(spark, str(log), str(out), parse_as_of(point), **options)
    found = {}
    for table in ("public.t", "public.bag"):
        columns, rows = built(out, table)
        assert columns == (["id", "v", "body"] if table == "public.t" else ["a", "b"])
        found[table] = rows
    return found


@pytest.fixture(scope="module")
def handmade(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log = tmp_path_factory.mktemp("handmade") / "log"
    write_log(log)
    return log


@pytest.mark.parametrize(("point", "expected"), [
    ("0/1000000", ({("1", "a", "B1"), ("2", "b", "B2"), ("3", "c", "B3")}, {("x", "1"): 2})),
    ("0/1000300", ({("1", "a2", "B1"), ("2", "b", "B2"), ("4", "d", "B4")},
                   {("x", "1"): 1, ("y", "2"): 1})),
    ("2026-11-26T11:00:02.5+01:00", ({("1", "a2", "B1"), ("2", "b", "B2"), ("4", "d", "B4")},
                                     {("x", "1"): 1, ("y", "2"): 1})),
    ("0/1000500", ({("1", "a2", "B1"), ("2", "b", "B2"), ("4", "d", "B4"), ("5", "e2", "B5")},
                   None)),
    ("2026-11-26T10:00:03.9Z", ({("1", "a2", "B1"), ("2", "b2", "B2x"), ("4", "d", "B4"),
                                 ("5", "e2", "B5")}, None)),
    ("0/2000300", ({("7", "g", "B7")}, None)),
    ("0/FFFFFFFF", ({("8", "h", "B7")}, {("x", "1"): 1, ("y", "2"): 1})),
])
def test_a_handmade_log_at_each_point(
        spark: Any, handmade: Path, tmp_path: Path, point: str,
        expected: tuple[set[tuple[str, ...]], dict[tuple[str, ...], int] | None]) -> None:
    """Last change of a key wins in commit order then position (not by a change's LSN); an
    unchanged TOAST column keeps the value before; a prepared transaction counts at its
    COMMIT PREPARED, never at a ROLLBACK PREPARED; TRUNCATE empties the rows before it; a key
    that moves leaves its old key; a table without a key is a multiset; a transaction never
    committed is not in."""
    found = tables_at(spark, handmade, tmp_path, point)
    t, bag = expected
    assert found["public.t"] == Counter(t)
    if bag is not None:
        assert found["public.bag"] == Counter(bag)


def test_tables_into_a_bucket(spark: Any, handmade: Path, store: SeaweedS3) -> None:
    """``--tables s3://BUCKET/PREFIX``: a Parquet object per part, uploaded create-only by the
    executors; the same rows as in a directory; a prefix that holds objects is refused."""
    url = f"s3://{store.bucket}/asof/tables"
    done = run_as_of(spark, str(handmade), url, parse_as_of("0/1000500"))
    assert done.tables["public.t"] == (f"{url}/public.t", 4)
    bucket = Bucket.connect(url)
    rows: Counter[tuple[str | None, ...]] = Counter()
    for name, _ in bucket.listing("public.t"):
        with bucket.open(name) as stream:
            read = pq.read_table(io.BytesIO(stream.read()))
        assert read.column_names == ["id", "v", "body"]
        rows.update(zip(*(read.column(c).to_pylist() for c in read.column_names), strict=True))
    assert rows == Counter({("1", "a2", "B1"), ("2", "b", "B2"), ("4", "d", "B4"),
                            ("5", "e2", "B5")})
    with pytest.raises(ConfigurationError, match="holds objects already"):
        run_as_of(spark, str(handmade), url, parse_as_of("0/1000500"))


def test_a_change_log_in_a_bucket(spark: Any, handmade: Path, store: SeaweedS3,
                                  tmp_path: Path) -> None:
    """The log and its snapshot read from an ``s3://`` prefix build the same tables."""
    url = f"s3://{store.bucket}/asof/log"
    bucket = Bucket.connect(url)
    for path in sorted(handmade.rglob("*")):
        if path.is_file():
            bucket.put_new(str(path.relative_to(handmade)), path)
    from_bucket = tables_at(spark, url, tmp_path / "b", "2026-11-26T10:00:03.9Z")
    assert from_bucket == tables_at(spark, handmade, tmp_path / "d", "2026-11-26T10:00:03.9Z")
    assert len(from_bucket["public.t"]) == 4


def test_refusals_are_one_line(spark: Any, handmade: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"^--as-of 0/FFFFFF is before the snapshot's "
                                                 r"consistent point 0/1000000"):
        run_as_of(spark, str(handmade), str(tmp_path), parse_as_of("0/FFFFFF"))
    bare = tmp_path / "bare"
    write_log(bare, snapshot=False)
    with pytest.raises(ConfigurationError, match=r"has no snapshot .* the tables would lack "
                                                 r"every row from before the slot"):
        run_as_of(spark, str(bare), str(tmp_path / "o"), parse_as_of("0/1000300"))
    done = run_as_of(spark, str(bare), str(tmp_path / "o"), parse_as_of("0/1000300"),
                     without_snapshot=True)
    assert done.tables["public.t"][1] == 2  # 4, and 1 with only what the update sent
    gapped = tmp_path / "gapped"
    write_log(gapped)
    (gapped / "0000000002000100.jsonl.partial").write_bytes(
        (gapped / "0000000002000100.jsonl.partial").read_bytes().replace(
            b'{"op": "commit_prepared"', json.dumps(
                {"op": "gap", "lsn": "0/2000000", "from_lsn": "0/1000530", "slot": "s",
                 "recorded_at": "2026-11-26T10:00:02.800000Z"}).encode() + b'\n'
            + b'{"op": "commit_prepared"', 1))
    before = tables_at(spark, gapped, tmp_path / "g", "0/1000500")
    assert len(before["public.t"]) == 4
    for point in ("0/2000300", "2026-11-26T10:00:03Z"):
        with pytest.raises(ArchiveError, match=r"misses the transactions committed between "
                                               r"0/1000530 and 0/2000000 \(a gap line\)"):
            run_as_of(spark, str(gapped), str(tmp_path / "g"), parse_as_of(point))


@pytest.mark.parametrize(("args", "said"), [
    (["--as-of", "0/1"], "--as-of needs --changes"),
    (["--changes", "--as-of", "0/1"], "--as-of needs --tables"),
    (["--changes", "--tables", "out"], "--tables needs --as-of"),
    (["--changes", "--without-snapshot"], "--without-snapshot goes with --as-of"),
    (["--changes", "--as-of", "yesterday", "--tables", "out"], "is neither an LSN"),
    (["--changes", "--as-of", "2026-11-26T10:00:00", "--tables", "out"], "has no time zone"),
    (["--changes", "--as-of", "0/1", "--tables", "out", "other"], "one change log's tables"),
])
def test_bad_options_are_a_usage_error(args: list[str], said: str) -> None:
    run = CliRunner().invoke(cli, ["analyze", "log", *args])
    assert run.exit_code == 2, run.output
    assert said in run.output
    assert "Traceback" not in run.output
