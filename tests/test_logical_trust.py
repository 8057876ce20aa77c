"""``receivewal logical`` trusts the slot over a damaged or shortened change log, against a real
PostgreSQL 15 (one server for the module): a damaged line in the middle of the ``.partial`` is
refused, naming the line and the LSNs, and nothing is changed; a slot confirmed past what the
log holds (the ``.partial`` removed, the slot dropped and created again) is refused naming both
LSNs until ``--accept-gap`` records the gap as a line of its own; a slot confirmed on
keepalives while the published tables were quiet is no gap; tables added to and dropped from
the publication and columns added and dropped mid-stream, and a TRUNCATE of a table never
described, give a log that a reader following docs/changelog.md takes (each change after a
relation line of its table naming its columns)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.changelog import log_files, read_log, runs
from support.logical import LOGICAL_CONF, current_lsn
from support.servers import PgServer, running_server
from support.streams import receivewal

from receivewal.daemon.supervisor import EXIT_STAY_DOWN
from receivewal.logical.store import CONFIRMED_THROUGH
from receivewal.wal.lsn import format_lsn, parse_lsn

pytestmark = [pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    """Database app: table t in publication pub; database other, never streamed."""
    with running_server(LOGICAL_CONF) as server:
        server.sql("CREATE DATABASE app")
        server.sql("CREATE DATABASE other")
        server.sql("CREATE TABLE t (id int PRIMARY KEY, v text)", "app")
        server.sql("CREATE TABLE busy (id serial PRIMARY KEY, v text)", "other")
        server.sql("CREATE PUBLICATION pub FOR TABLE t", "app")
        yield server


def logical(pg: PgServer, *args: str) -> subprocess.CompletedProcess[str]:
    """``receivewal logical`` on database app, run to completion."""
    return receivewal("logical", "-d", f"host=127.0.0.1 port={pg.port} user=postgres "
                      "dbname=app", "--log-format", "json", "--reconnect-delay", "0.05",
                      "--reconnect-delay-max", "0.5", *args)


def stream_to_end(pg: PgServer, out: Path, slot: str, *args: str,
                  ) -> subprocess.CompletedProcess[str]:
    return logical(pg, "-D", str(out), "-S", slot, "-P", "pub", "-s", "0.2", "-E",
                   format_lsn(current_lsn(pg, "app")), *args)


def create(pg: PgServer, slot: str) -> None:
    done = logical(pg, "-S", slot, "--create-slot")
    assert done.returncode == 0, done.stderr[-2000:]


def insert(pg: PgServer, first: int, count: int) -> None:
    for key in range(first, first + count):  # one transaction each
        pg.sql(f"INSERT INTO t VALUES ({key}, 'row {key}')", "app")


def confirmed(pg: PgServer, slot: str) -> int:
    return parse_lsn(pg.sql("SELECT confirmed_flush_lsn FROM pg_replication_slots "
                            f"WHERE slot_name = '{slot}'"))


def keys(out: Path) -> list[int]:
    return [int(r["new"]["id"]) for r in read_log(out) if r["op"] == "insert"]


def snapshot(out: Path) -> dict[str, bytes]:
    """The change log's files and its record of the slot (not the lock, not the state)."""
    return {p.name: p.read_bytes() for p in [*log_files(out), out / CONFIRMED_THROUGH]}


def test_a_damaged_line_in_the_partial_file_is_refused_and_nothing_changes(
        pg: PgServer, tmp_path: Path) -> None:
    """Twelve transactions in the ``.partial``, one line of the fifth damaged: the restart
    exits 1 naming the file, the line and the LSNs, and the directory is as it was (it used
    to cut the file there and stream from the slot, which had confirmed past it: seven
    transactions lost, exit 0)."""
    create(pg, "damaged")
    insert(pg, 1000, 12)
    out = tmp_path / "log"
    out.mkdir()
    first = stream_to_end(pg, out, "damaged")
    assert first.returncode == 0, first.stderr[-2000:]
    (partial,) = log_files(out)
    lines = partial.read_bytes().splitlines(keepends=True)
    inserts = [n for n, line in enumerate(lines) if b'"op":"insert"' in line]
    assert len(inserts) == 12
    lines[inserts[4]] = lines[inserts[4]][:20] + b"\x00\n"
    partial.write_bytes(b"".join(lines))
    before = snapshot(out)
    again = stream_to_end(pg, out, "damaged")
    assert again.returncode == 1, again.stderr[-2000:]
    assert f"{partial} is damaged: line {inserts[4] + 1} (at byte " in again.stderr
    assert "not a torn tail" in again.stderr
    assert "the file is whole through 0/" in again.stderr
    assert "Traceback" not in again.stderr
    assert snapshot(out) == before


def test_a_slot_ahead_of_the_log_is_refused_until_the_gap_is_accepted(
        pg: PgServer, tmp_path: Path) -> None:
    """The ``.partial`` removed: the slot was confirmed past what the log holds, so the start
    exits 4 (the unit does not restart it) naming both LSNs and writes nothing;
    ``--accept-gap`` goes on from the slot with a ``gap`` line naming them, and later starts
    take the log as it is."""
    create(pg, "ahead")
    start = confirmed(pg, "ahead")
    insert(pg, 2000, 6)
    out = tmp_path / "log"
    out.mkdir()
    assert stream_to_end(pg, out, "ahead").returncode == 0
    assert (out / CONFIRMED_THROUGH).exists()
    (partial,) = log_files(out)
    partial.unlink()
    through = confirmed(pg, "ahead")
    refused = stream_to_end(pg, out, "ahead")
    assert refused.returncode == EXIT_STAY_DOWN, refused.stderr[-2000:]
    assert (f'replication slot \\"ahead\\" was confirmed through {format_lsn(through)}, but '
            f"the change log in {out} holds transactions only up to "
            f"{format_lsn(start)}") in refused.stderr
    assert "--accept-gap" in refused.stderr
    assert log_files(out) == []
    insert(pg, 2100, 2)
    accepted = stream_to_end(pg, out, "ahead", "--accept-gap")
    assert accepted.returncode == 0, accepted.stderr[-2000:]
    records = read_log(out)
    gaps = [r for r in records if r["op"] == "gap"]
    assert len(gaps) == 1
    assert {k: gaps[0][k] for k in ("lsn", "from_lsn", "slot")} == {
        "lsn": format_lsn(through), "from_lsn": format_lsn(start), "slot": "ahead"}
    assert keys(out) == [2100, 2101]
    insert(pg, 2200, 1)
    later = stream_to_end(pg, out, "ahead")
    assert later.returncode == 0, later.stderr[-2000:]
    assert keys(out) == [2100, 2101, 2200]
    assert [r[0]["op"] for r in runs(read_log(out))] == ["gap", "begin", "begin", "begin"]


def test_a_slot_dropped_and_created_again_is_refused(pg: PgServer, tmp_path: Path) -> None:
    """The slot dropped and created again with --create-slot: the transactions committed in
    between are in neither; the start exits 4 naming where the log ends and where the new
    slot starts."""
    create(pg, "again")
    insert(pg, 3000, 3)
    out = tmp_path / "log"
    out.mkdir()
    assert stream_to_end(pg, out, "again").returncode == 0
    end = max(parse_lsn(r["end_lsn"]) for r in read_log(out) if r["op"] == "commit")
    assert logical(pg, "-S", "again", "--drop-slot").returncode == 0
    insert(pg, 3100, 3)  # in neither the log nor the new slot
    create(pg, "again")
    insert(pg, 3200, 2)
    refused = stream_to_end(pg, out, "again")
    assert refused.returncode == EXIT_STAY_DOWN, refused.stderr[-2000:]
    assert (f'replication slot \\"again\\" was confirmed through '
            f"{format_lsn(confirmed(pg, 'again'))}, but the change log in {out} holds "
            f"transactions only up to {format_lsn(end)}") in refused.stderr
    assert keys(out) == [3000, 3001, 3002]


def test_a_slot_confirmed_on_keepalives_is_no_gap(pg: PgServer, tmp_path: Path) -> None:
    """The published table quiet, WAL written elsewhere: the slot is confirmed to a
    keepalive's walEnd, past the log's last transaction; that position is recorded before the
    server is told, so the next start is no gap."""
    create(pg, "quiet")
    insert(pg, 4000, 1)
    out = tmp_path / "log"
    out.mkdir()
    assert stream_to_end(pg, out, "quiet").returncode == 0
    end = max(parse_lsn(r["end_lsn"]) for r in read_log(out) if r["op"] == "commit")
    pg.sql("INSERT INTO busy (v) SELECT 'x' FROM generate_series(1, 1000)", "other")
    quiet = stream_to_end(pg, out, "quiet")
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert confirmed(pg, "quiet") > end
    insert(pg, 4100, 1)
    later = stream_to_end(pg, out, "quiet")
    assert later.returncode == 0, later.stderr[-2000:]
    assert keys(out) == [4000, 4100]


def described_in_order(records: list[dict[str, Any]]) -> None:
    """Read a file as docs/changelog.md tells a reader to: a change's table must have been
    described before it in the file, and a row names only the columns described last."""
    columns: dict[tuple[str, str], set[str]] = {}
    for record in records:
        op = record["op"]
        if op == "header":
            columns = {}
        elif op == "relation":
            columns[(record["schema"], record["table"])] = {c["name"] for c in
                                                            record["columns"]}
        elif op == "truncate":
            for schema, table in record["tables"]:
                assert (schema, table) in columns, record
        elif op in ("insert", "update", "delete"):
            names = columns[(record["schema"], record["table"])]
            for row in (record.get("new"), record.get("old")):
                assert row is None or set(row) <= names, record


def test_publication_and_column_changes_mid_stream_read_as_the_docs_say(
        pg: PgServer, tmp_path: Path) -> None:
    """Tables added to and dropped from the publication, a column added and dropped, and a
    TRUNCATE of a table the file never described, streamed as they happen: each change
    follows a relation line of its table naming its columns; what the publication did not
    hold at the time is not in the log."""
    for table in ("d", "u", "w"):
        pg.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)", "app")
    pg.sql("CREATE PUBLICATION ddl FOR TABLE d", "app")
    create(pg, "ddl")
    for sql in ("INSERT INTO d VALUES (1, 'a')",
                "ALTER PUBLICATION ddl ADD TABLE u", "INSERT INTO u VALUES (1, 'in')",
                "ALTER TABLE d ADD COLUMN c int", "INSERT INTO d VALUES (2, 'b', 5)",
                "ALTER TABLE d DROP COLUMN c", "INSERT INTO d VALUES (3, 'c')",
                "ALTER PUBLICATION ddl DROP TABLE u", "INSERT INTO u VALUES (2, 'out')",
                "ALTER PUBLICATION ddl ADD TABLE w", "TRUNCATE w",
                "INSERT INTO w VALUES (1, 'w')"):
        pg.sql(sql, "app")
    out = tmp_path / "log"
    out.mkdir()
    done = logical(pg, "-D", str(out), "-S", "ddl", "-P", "ddl", "-E",
                   format_lsn(current_lsn(pg, "app")))
    assert done.returncode == 0, done.stderr[-2000:]
    records = read_log(out)
    described_in_order(records)
    changes = [(r["op"], r.get("table") or r["tables"][0][1], r.get("new"))
               for r in records if r["op"] in ("insert", "truncate")]
    assert changes == [("insert", "d", {"id": "1", "v": "a"}),
                       ("insert", "u", {"id": "1", "v": "in"}),
                       ("insert", "d", {"id": "2", "v": "b", "c": "5"}),
                       ("insert", "d", {"id": "3", "v": "c"}),
                       ("truncate", "w", None),
                       ("insert", "w", {"id": "1", "v": "w"})]
