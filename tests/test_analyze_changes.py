"""``receivewal analyze --changes``: a real change log counted on Spark, against the server's
own counters.

A PostgreSQL 15 server with wal_level=logical: a pgoutput slot, then pgbench -i, a few seconds
of pgbench, deletes, updates and TRUNCATEs. The slot's changes are taken with
pg_logical_slot_get_binary_changes (pgoutput protocol 1) and fed to ChangeLogConsumer into two
change logs (zstd at rest, and plain), each cut into several files and ending with a
``.partial``; the zstd one is uploaded to a real S3 server too. analyze's per-table insert,
update and delete counts must equal the deltas of pg_stat_user_tables' n_tup_ins, n_tup_upd and
n_tup_del (HOT updates are in n_tup_upd), its change volume the bytes of the change lines.
One Spark session for every module (tests/conftest.py's ``spark``).
"""

from __future__ import annotations

import datetime
import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from support.changelog import consume, log_files, open_store
from support.logical import LOGICAL_CONF, pgbench
from support.seaweed import SeaweedS3
from support.servers import running_server
from support.sparkarchives import SharedSession

from receivewal.archive.bucket import Bucket
from receivewal.check import sparksession
from receivewal.check.changes import ChangesResult, run_changes
from receivewal.commands.group import cli
from receivewal.errors import ArchiveError
from receivewal.logical.pgoutput import PgoutputOptions
from receivewal.replication.connection import ReplicationConnection
from receivewal.wal.lsn import parse_lsn

pytestmark = [pytest.mark.spark, pytest.mark.server, pytest.mark.slow]
COUNTERS = ("n_tup_ins", "n_tup_upd", "n_tup_del")
TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history",
          "scratch")
OPTIONS = PgoutputOptions(1)


@dataclass
class Log:
    path: Path
    expected: dict[str, dict[str, int]]  # table: inserts, updates, deletes, truncates
    change_bytes: dict[str, int]  # table: bytes of its change lines, read back here


@dataclass
class Logs:
    zstd: Log  # the whole workload, pgbench -i included
    plain: Log  # what came after pgbench -i
    url: str  # the zstd log uploaded
    hours: set[int]  # the hours (Unix seconds) the workload ran in


def counters(dsn: str) -> dict[str, tuple[int, ...]]:
    conn = ReplicationConnection.open(dsn)
    try:
        rows = conn.query(f"SELECT relname, {', '.join(COUNTERS)} FROM pg_stat_user_tables")
    finally:
        conn.close()
    return {str(name): tuple(int(v or 0) for v in values) for name, *values in rows}


def change_lines(directory: Path) -> Iterator[tuple[dict[str, Any], int]]:
    """Every line of a change log with its size in bytes (newline included), read here."""
    import zstandard  # noqa: PLC0415 - the test's own reader

    for path in log_files(directory):
        data = path.read_bytes()
        if path.name.endswith(".zst"):
            data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
        for line in data.splitlines():
            yield json.loads(line), len(line) + 1


def changes(dsn: str) -> list[tuple[int, bytes]]:
    """What the slot has for pgoutput protocol 1 since the last call, consumed."""
    conn = ReplicationConnection.open(dsn)
    try:
        rows = conn.query("SELECT lsn, data FROM pg_logical_slot_get_binary_changes('changes', "
                          "NULL, NULL, 'proto_version', '1', 'publication_names', 'pub')")
    finally:
        conn.close()
    return [(parse_lsn(lsn or ""), bytes.fromhex((data or "")[2:])) for lsn, data in rows]


def write_log(directory: Path, messages: list[tuple[int, bytes]], compression: str,
              file_size: int, *, before: dict[str, tuple[int, ...]],
              after: dict[str, tuple[int, ...]]) -> Log:
    """A change log of ``messages``; what analyze must count in it: the server's counters
    from ``before`` to ``after``, TRUNCATEs and the change lines' bytes read back here."""
    directory.mkdir()
    store = open_store(directory, file_size=file_size, compression=compression, sync=False)
    consume(store, messages, OPTIONS).close()
    store.close()
    expected = {}
    for table in TABLES:
        ins, upd, dels = (a - b for a, b in zip(after[table], before.get(table, (0, 0, 0)),
                                                strict=True))
        expected[table] = {"inserts": ins, "updates": upd, "deletes": dels, "truncates": 0}
    change_bytes: Counter[str] = Counter()
    for record, size in change_lines(directory):
        if record["op"] == "truncate":
            for _, table in record["tables"]:
                expected[table]["truncates"] += 1
                change_bytes[table] += size
        elif record["op"] in ("insert", "update", "delete"):
            change_bytes[record["table"]] += size
    return Log(directory, expected, dict(change_bytes))


@pytest.fixture(scope="module")
def logs(seaweed_server: SeaweedS3, tmp_path_factory: pytest.TempPathFactory) -> Logs:
    base = tmp_path_factory.mktemp("changelogs")
    with running_server(LOGICAL_CONF) as pg:
        dsn = f"host=127.0.0.1 port={pg.port} user=postgres dbname=app"
        pg.sql("CREATE DATABASE app")
        pg.sql("CREATE PUBLICATION pub FOR ALL TABLES", "app")
        pg.sql("SELECT pg_create_logical_replication_slot('changes', 'pgoutput')", "app")
        began = time.time()
        before = counters(dsn)  # no table yet: every count starts at 0
        pgbench(pg, "app", "-i", "-s", "1")
        pg.sql("CREATE TABLE scratch (id int PRIMARY KEY, v text)", "app")
        initialized = changes(dsn)
        middle = counters(dsn)
        pgbench(pg, "app", "-c", "2", "-j", "2", "-T", "3")
        for sql in ("DELETE FROM pgbench_accounts WHERE aid % 97 = 0",
                    "DELETE FROM pgbench_tellers WHERE tid > 8",
                    "UPDATE pgbench_accounts SET filler = 'changed' WHERE aid % 89 = 0",
                    "INSERT INTO scratch SELECT g, 'v' FROM generate_series(1, 50) g",
                    "UPDATE scratch SET id = id + 1000 WHERE id <= 10",  # the key changes
                    "TRUNCATE scratch",
                    "INSERT INTO scratch VALUES (1, 'after')", "TRUNCATE scratch"):
            pg.sql(sql, "app")
        after = counters(dsn)
        ended = time.time()
        worked = changes(dsn)
    # small files: pgbench's initialisation fills many, and in the plain log each of the two
    # big fixed statements after pgbench (~1,000 deletes, ~1,100 updates: one run each, and a
    # file is completed only between runs) overflows a file of its own, however few
    # transactions pgbench got through before them on a loaded machine (at 128 KiB the
    # deletes and a handful of pgbench's fitted in one file with the updates: 2 files)
    zstd_log = write_log(base / "zstd", initialized + worked, "zstd", 1 << 17, before=before,
                         after=after)
    plain_log = write_log(base / "plain", worked, "", 1 << 16, before=middle, after=after)
    url = f"s3://{seaweed_server.bucket}/changes/app"
    with pytest.MonkeyPatch.context() as patch:
        for name, value in seaweed_server.env().items():
            patch.setenv(name, value)
        bucket = Bucket.connect(url)
        for path in log_files(zstd_log.path):
            bucket.put_new(path.name, path)
    return Logs(zstd_log, plain_log, url,
                set(range(int(began) // 3600 * 3600, int(ended) + 1, 3600)))


@pytest.fixture(scope="module")
def result(spark: Any, logs: Logs, tmp_path_factory: pytest.TempPathFactory) -> ChangesResult:
    return run_changes(spark, [str(logs.zstd.path), str(logs.plain.path)],
                       tmp_path_factory.mktemp("analysis"))


def per_table(spark: Any, result: ChangesResult, log: str) -> dict[str, dict[str, int]]:
    rows = spark.read.parquet(result.tables["changes_per_hour"]).where(f"log = '{log}'") \
        .groupBy("table").sum("inserts", "updates", "deletes", "truncates", "change_bytes") \
        .collect()
    return {r["table"]: {k: int(r[f"sum({k})"]) for k in
                         ("inserts", "updates", "deletes", "truncates", "change_bytes")}
            for r in rows}


def test_the_log_has_every_kind_of_file(logs: Logs) -> None:
    for log, complete in ((logs.zstd, ".jsonl.zst"), (logs.plain, ".jsonl")):
        names = [p.name for p in log_files(log.path)]
        assert len(names) >= 3, names
        assert all(n.endswith(complete) for n in names[:-1]), names
        assert names[-1].endswith(".partial"), names


def test_counts_per_table_equal_the_servers_counters(spark: Any, result: ChangesResult,
                                                     logs: Logs) -> None:
    assert logs.zstd.expected["pgbench_accounts"]["inserts"] == 100_000
    assert logs.plain.expected["pgbench_accounts"]["updates"] > 100  # pgbench ran a while
    for log in (logs.zstd, logs.plain):
        assert log.expected["scratch"]["truncates"] == 2
        counted = per_table(spark, result, str(log.path))
        assert set(counted) == set(TABLES) if log is logs.zstd else set(counted) <= set(TABLES)
        for table in TABLES:
            got = counted.get(table, dict.fromkeys((*log.expected[table], "change_bytes"), 0))
            assert {k: got[k] for k in log.expected[table]} == log.expected[table], table
            assert got["change_bytes"] == log.change_bytes.get(table, 0), table


def test_changes_fall_in_the_hours_the_workload_ran(spark: Any, result: ChangesResult,
                                                   logs: Logs) -> None:
    rows = spark.read.parquet(result.tables["changes_per_hour"]).collect()
    assert {r["hour_seconds"] for r in rows} <= logs.hours
    assert all(r["hour"].timestamp() == r["hour_seconds"] for r in rows)
    assert sum(r["inserts"] + r["updates"] + r["deletes"] for r in rows) == sum(
        e["inserts"] + e["updates"] + e["deletes"]
        for log in (logs.zstd, logs.plain) for e in log.expected.values())


def test_files_table_and_totals(spark: Any, result: ChangesResult, logs: Logs) -> None:
    files = spark.read.parquet(result.tables["change_files"]).collect()
    for log in (logs.zstd, logs.plain):
        own = sorted((r for r in files if r["log"] == str(log.path)), key=lambda r: r["file"])
        assert [(r["file"], r["file_bytes"]) for r in own] == [
            (p.name, p.stat().st_size) for p in log_files(log.path)]
        assert [r["partial"] for r in own] == [False] * (len(own) - 1) + [True]
        lines = list(change_lines(log.path))
        assert sum(r["lines"] for r in own) == len(lines)
        assert sum(r["line_bytes"] for r in own) == sum(size for _, size in lines)
        totals = result.logs[str(log.path)]
        assert totals["transactions"] == sum(rec["op"] == "commit" for rec, _ in lines)
        assert totals["partial_files"] == 1
        assert totals["inserts"] == sum(e["inserts"] for e in log.expected.values())


def test_report_has_the_summary_tables_and_charts(result: ChangesResult, logs: Logs) -> None:
    names = sorted(p.name for p in result.report_files)
    assert names == ["changes_by_table.png", "changes_over_time.png", "report.html",
                     "report.md"]
    md = (result.output / "report" / "report.md").read_text()
    assert md.startswith("# Change log analysis\n\n## Summary\n")
    inserts = sum(e["inserts"] for log in (logs.zstd, logs.plain)
                  for e in log.expected.values())
    assert f"{inserts:,} inserts" in md
    assert "| public.pgbench_accounts | zstd |" in md
    assert "![changes_over_time](changes_over_time.png)" in md
    assert all(p.stat().st_size > 5000 for p in result.report_files if p.suffix == ".png")


def test_an_s3_change_log_counts_the_same(spark: Any, logs: Logs, result: ChangesResult,
                                          seaweed_server: SeaweedS3, tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as patch:  # the driver lists the prefix with boto3
        for name, value in seaweed_server.env().items():
            patch.setenv(name, value)
        from_s3 = run_changes(spark, [logs.url], tmp_path / "s3", report=False)
    assert per_table(spark, from_s3, logs.url) == per_table(spark, result, str(logs.zstd.path))
    assert from_s3.logs[logs.url]["files"] == len(log_files(logs.zstd.path))


def test_a_hadoop_uri_counts_the_same(spark: Any, logs: Logs, result: ChangesResult,
                                     tmp_path: Path) -> None:
    """A URI (listed with Spark's binaryFile source, read with pyarrow's file systems)."""
    uri = logs.plain.path.as_uri()
    from_uri = run_changes(spark, [uri], tmp_path / "uri", report=False)
    assert per_table(spark, from_uri, uri) == per_table(spark, result, str(logs.plain.path))
    assert from_uri.logs[uri]["files"] == len(log_files(logs.plain.path))


def test_bad_input_is_one_error_naming_the_file(spark: Any, logs: Logs, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no log here\n")
    with pytest.raises(ArchiveError, match=f"^{empty} holds no change log files"):
        run_changes(spark, [str(empty)], tmp_path / "out", report=False)
    broken = tmp_path / "broken"
    broken.mkdir()
    first = log_files(logs.plain.path)[0]
    lines = first.read_bytes().splitlines(keepends=True)
    (broken / first.name).write_bytes(b"".join([*lines[:3], b"{not json\n", *lines[3:]]))
    with pytest.raises(ArchiveError, match=f"^{broken}/{first.name}: line 4 is not a change "
                                           "log record$"):
        run_changes(spark, [str(broken)], tmp_path / "out", report=False)
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    zst = log_files(logs.zstd.path)[0]
    (damaged / zst.name).write_bytes(zst.read_bytes()[:-100])
    with pytest.raises(ArchiveError, match=f"^{damaged}/{zst.name}: .*zstd"):
        run_changes(spark, [str(damaged)], tmp_path / "out", report=False)


def test_the_command_prints_the_totals_or_one_error(spark: Any, logs: Logs, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``receivewal analyze --changes`` through the real command group (on the shared
    session: a session of its own costs a JVM; the WAL analyze's CLI test starts one). An
    error is click's one line here; ``receivewal`` itself prints it as ``receivewal: error:``."""
    monkeypatch.setattr(sparksession, "make_session", lambda *_, **__: SharedSession(spark))
    out = tmp_path / "analysis"
    run = CliRunner().invoke(cli, ["analyze", "--changes", str(logs.plain.path), "-o", str(out)])
    assert run.exit_code == 0, run.output
    inserts = sum(e["inserts"] for e in logs.plain.expected.values())
    first, *rest = run.stdout.splitlines()
    files = len(log_files(logs.plain.path))
    assert first.startswith(f"{logs.plain.path}: {files} files, ")
    assert f" {inserts:,} inserts, " in first
    assert rest[-2] == f"report: {out / 'report' / 'report.html'}"
    assert (out / "changes_per_hour").is_dir()
    empty = tmp_path / "empty"
    empty.mkdir()
    run = CliRunner().invoke(cli, ["analyze", "--changes", str(empty), "-o", str(out)])
    assert (run.exit_code, run.output) == (
        1, f"Error: {empty} holds no change log files "
           "(<16 hex digits>.jsonl[.zst])\n")


def record_lines(*records: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def test_a_prepared_transaction_rolled_back_is_not_counted(spark: Any, tmp_path: Path) -> None:
    """Two-phase: a prepared transaction's changes are in the log at its prepare; when a
    later file says it was rolled back, they are left out (the committed one counts, at its
    prepare time). Lines as docs/changelog.md gives them."""
    log = tmp_path / "twophase"
    log.mkdir()
    row = {"schema": "public", "table": "t"}

    def prepared(xid: int, gid: str, when: str) -> list[dict[str, Any]]:
        times = {"xid": xid, "gid": gid, "prepare_time": when}
        return [{"op": "begin_prepare", **times},
                {"op": "insert", "xid": xid, **row, "new": {"id": str(xid)}},
                {"op": "delete", "xid": xid, **row, "old": {"id": "1"}},
                {"op": "prepare", **times}]

    header = {"op": "header", "format": 1, "plugin": "pgoutput"}
    (log / "0000000001000000.jsonl").write_bytes(record_lines(
        header, *prepared(700, "kept", "2026-11-26T10:59:59.999999Z"),
        *prepared(701, "dropped", "2026-11-26T10:30:00.000000Z")))
    (log / "0000000002000000.jsonl.partial").write_bytes(record_lines(
        header, {"op": "commit_prepared", "lsn": "0/2000000", "xid": 700, "gid": "kept",
                 "commit_lsn": "0/2000000", "end_lsn": "0/2000100",
                 "commit_time": "2026-11-26T12:00:00.000000Z"},
        {"op": "rollback_prepared", "lsn": "0/2000200", "xid": 701, "gid": "dropped",
         "prepare_end_lsn": "0/1000900", "rollback_end_lsn": "0/2000300"},
        {"op": "begin", "lsn": "0/2000400", "xid": 702, "commit_lsn": "0/2000500",
         "commit_time": "2026-11-26T11:00:00.000000Z"},
        {"op": "insert", "lsn": "0/2000450", "xid": 702, **row, "new": {"id": "702"}},
        {"op": "commit", "lsn": "0/2000500", "xid": 702, "commit_lsn": "0/2000500",
         "end_lsn": "0/2000600", "commit_time": "2026-11-26T11:00:00.000000Z"},
        {"op": "begin", "lsn": "0/2000700", "xid": 703, "commit_lsn": "0/2000800",
         "commit_time": "2026-11-26T11:00:01.000000Z"},  # never ended: not counted
        {"op": "insert", "lsn": "0/2000750", "xid": 703, **row, "new": {"id": "703"}},
    ) + b'{"op": "commit", "lsn": "0/20')
    done = run_changes(spark, [str(log)], tmp_path / "out", report=False)
    rows = sorted((r["hour_seconds"], r["inserts"], r["deletes"]) for r in
                  spark.read.parquet(done.tables["changes_per_hour"]).collect())
    ten = int(datetime.datetime(2026, 11, 26, 10, tzinfo=datetime.UTC).timestamp())
    assert rows == [(ten, 1, 1), (ten + 3600, 1, 0)]
    (log / "0000000003000000.jsonl").write_bytes(record_lines({"op": "header", "format": 2}))
    with pytest.raises(ArchiveError, match=r"0000000003000000\.jsonl: line 1 is a change log "
                                           r"of format 2, not 1$"):
        run_changes(spark, [str(log)], tmp_path / "out", report=False)


def test_a_partial_file_damaged_in_the_middle_is_an_error_naming_the_line(
        spark: Any, tmp_path: Path) -> None:
    """A damaged line in the middle of a ``.partial``, valid transactions after it: one error
    naming the file and the line (as the same damage in a complete file gives), never the
    first four of twelve transactions counted as if the rest were a torn tail."""
    log = tmp_path / "torn"
    log.mkdir()
    row = {"schema": "public", "table": "t"}
    lines = [json.dumps({"op": "header", "format": 1, "plugin": "pgoutput"}).encode() + b"\n"]
    for xid in range(12):
        at = 0x1000 * (xid + 1)
        when = f"2026-11-26T10:00:{xid:02}.000000Z"
        lines.append(record_lines(
            {"op": "begin", "lsn": f"0/{at:X}", "xid": xid, "commit_lsn": f"0/{at + 0x80:X}",
             "commit_time": when},
            {"op": "insert", "lsn": f"0/{at + 8:X}", "xid": xid, **row,
             "new": {"id": str(xid)}},
            {"op": "commit", "lsn": f"0/{at + 0x80:X}", "xid": xid,
             "commit_lsn": f"0/{at + 0x80:X}", "end_lsn": f"0/{at + 0xB0:X}",
             "commit_time": when}))
    data = b"".join(lines).splitlines(keepends=True)
    data[13] = b'{"op":"begin","lsn":"0/5\x00\x00\n'  # the fifth transaction's begin
    partial = log / "0000000000001080.jsonl.partial"
    partial.write_bytes(b"".join(data))
    with pytest.raises(ArchiveError, match=rf"^{partial}: line 14 \(at byte \d+\) is not a "
                                           r"change log record; change log records follow it "
                                           r"\(from line 15, up to 0/C0B0\)"):
        run_changes(spark, [str(log)], tmp_path / "out", report=False)
    # a gap line (--accept-gap) is a line of its own that readers take, in either kind of file
    gap = {"op": "gap", "lsn": "0/D000", "from_lsn": "0/C0B0", "slot": "s",
           "recorded_at": "2026-11-26T11:00:00.000000Z"}
    (log / "0000000000001080.jsonl").write_bytes(b"".join([*lines, record_lines(gap)]))
    partial.unlink()
    (log / "000000000000D000.jsonl.partial").write_bytes(
        b"".join([lines[0], record_lines(gap), lines[1]]))
    done = run_changes(spark, [str(log)], tmp_path / "out", report=False)
    assert done.logs[str(log)]["transactions"] == 13
