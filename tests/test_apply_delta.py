"""``receivewal apply --to delta:DIR`` against a real PostgreSQL 15 (issue 37, section 2): the
source of tests/test_apply.py (rows before the slot, its snapshot, then the change log tests'
workload: pgbench, a streamed big transaction, two-phase commits committed and rolled back,
TRUNCATE, an unchanged TOAST column, a REPLICA IDENTITY FULL table without a key, every
common type) applied into Delta tables with SIGKILLs of apply in between: every table, read
back with deltalake, holds the primary's rows (as PostgreSQL's text output), and a second run
writes no new Delta version."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.logical import SESSION, TABLES, ChangeLogSource, change_log_source, dsn
from support.seaweed import SeaweedS3
from support.servers import PgServer
from support.streams import start_receivewal

deltalake = pytest.importorskip("deltalake")

pytestmark = [pytest.mark.server]

Rows = list[tuple[str | None, ...]]


class Source(ChangeLogSource):
    def primary_rows(self, table: str) -> tuple[list[str], Rows]:
        """The table's columns, and its rows as text (sorted, NULL as None)."""
        with psycopg.connect(dsn(self.pg, "app"), options=SESSION) as conn:
            names = [row[0] for row in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
                " AND NOT attisdropped ORDER BY attnum", [f"public.{table}"])]
            # format's %s is the type's output function (a cast to text is not: bool, char)
            columns = ", ".join(f"""CASE WHEN "{name}" IS NOT NULL THEN format('%s', "{name}")"""
                                " END" for name in names)
            rows = conn.execute(f"SELECT {columns} FROM public.{table}").fetchall()
        return names, sorted(rows, key=_sortable)


def _sortable(row: tuple[str | None, ...]) -> tuple[tuple[bool, str], ...]:
    return tuple((value is None, value or "") for value in row)


def opened(where: Path | str, table: str) -> Any:
    """The Delta table of ``public.table`` under a directory or a bucket's prefix (the
    latter read with the environment's endpoint and keys)."""
    if isinstance(where, Path):
        return deltalake.DeltaTable(str(where / "public" / table))
    return deltalake.DeltaTable(f"{where}/public/{table}", storage_options={
        "AWS_ALLOW_HTTP": "true", **{key: os.environ[key] for key in (
            "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")}})


def delta_rows(where: Path | str, table: str, names: list[str]) -> Rows:
    """The Delta table's rows, in the primary's column order, sorted as theirs."""
    data = opened(where, table).to_pyarrow_table()
    columns = [data.column(name).to_pylist() for name in names]
    return sorted(zip(*columns, strict=True), key=_sortable)


def commits(where: Path) -> set[Path]:
    """The Delta commits made under ``where``, every table's."""
    return set(where.glob("public/*/_delta_log/*.json"))


def versions(where: Path | str) -> dict[str, int]:
    return {table: opened(where, table).version() for table in TABLES}


def assert_equal_to_primary(source: Source, where: Path | str) -> None:
    differ = []
    for table in TABLES:
        names, mine = source.primary_rows(table)
        theirs = delta_rows(where, table, names)
        if mine != theirs:
            first = next(((m, t) for m, t in zip(mine, theirs, strict=False) if m != t),
                         ((), ()))
            columns = {name: (m, t) for name, m, t in zip(names, *first, strict=False)
                       if m != t}
            differ.append(f"{table}: {len(mine)} rows at the primary, {len(theirs)} in Delta;"
                          f" the first row that differs, in {columns}")
    assert differ == []


def _column_added(pg: PgServer) -> None:
    pg.sql("ALTER TABLE docs ADD COLUMN added text", "app")
    pg.sql("INSERT INTO docs VALUES (3, 'after the column', 'y', 'new column')", "app")
    pg.sql("UPDATE docs SET added = 'set later' WHERE id = 1", "app")  # body: TOAST


@pytest.fixture(scope="module")
def source() -> Iterator[Source]:
    with change_log_source("deltas", "receivewal-apply-delta-", _column_added) as made:
        yield Source(made.pg, made.outdir)


def test_apply_into_delta_killed_again_and_again_ends_with_the_primarys_tables(
        source: Source, tmp_path: Path) -> None:
    """SIGKILLed right after each new Delta commit it makes (the snapshot's tables one by
    one, then the transactions' batch between two tables' commits), then run to the end:
    every Delta table holds the primary's rows (the column added at the source included, the
    unchanged TOAST value kept); a second run applies nothing and writes no new version."""
    where = tmp_path / "lake"
    kills = 0
    for _ in range(12):
        made = commits(where)
        process = start_receivewal("apply", "-D", str(source.outdir), "--to", f"delta:{where}")
        while process.poll() is None and commits(where) == made:
            time.sleep(0.02)
        if process.poll() is not None:
            break  # it finished between two looks
        process.kill()
        process.wait()
        kills += 1
    print(f"\nkilled {kills} times, each right after a new commit; "
          f"{len(commits(where))} commits then")
    assert kills >= 10
    done = source.apply(f"delta:{where}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert_equal_to_primary(source, where)
    before = versions(where)
    again = source.apply(f"delta:{where}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "applied 0 snapshot tables (0 rows) and 0 transactions" in again.stdout
    assert "(0 Delta commits" in again.stdout
    assert versions(where) == before
    assert_equal_to_primary(source, where)


def test_apply_into_delta_in_one_run_and_its_commits_per_100000_changes(
        source: Source, tmp_path: Path) -> None:
    """One run: every snapshot table, then every transaction, each table's commits carrying
    the slot's application transaction; the Delta commits per 100,000 changes are printed (a
    measure, not an assertion)."""
    where = tmp_path / "lake"
    done = source.apply(f"delta:{where}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"applied {len(TABLES)} snapshot tables" in done.stdout
    assert_equal_to_primary(source, where)
    counted = re.search(r"\((\d+) Delta commits for (\d+) changes read\)", done.stdout)
    assert counted is not None, done.stdout
    commits, changes = int(counted[1]), int(counted[2])
    print(f"\nDelta: {commits} commits for {changes} changes "
          f"({commits * 100_000 / max(changes, 1):.0f} per 100,000 changes)")
    table = deltalake.DeltaTable(str(where / "public" / "items"))
    assert table.transaction_version("receivewal:deltas") is not None


def test_a_bad_delta_target_gets_one_line(source: Source, tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    done = source.apply(f"delta:{blocked}")
    assert done.returncode == 1
    assert "Delta table public." in done.stderr
    assert "Traceback" not in done.stderr
    empty = source.apply("delta:")
    assert empty.returncode == 1
    assert "names no directory" in empty.stderr
    assert "Traceback" not in empty.stderr


def test_apply_into_delta_tables_in_a_bucket(source: Source, store: SeaweedS3) -> None:
    """--to delta:s3://BUCKET/PREFIX, with the AWS environment of the other S3 commands (a real
    S3 server, SeaweedFS): the same tables as the primary's; a second run writes nothing."""
    where = f"s3://{store.bucket}/lake"
    done = source.apply(f"delta:{where}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert_equal_to_primary(source, where)
    before = versions(where)
    again = source.apply(f"delta:{where}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "(0 Delta commits" in again.stdout
    assert versions(where) == before


def test_apply_into_delta_with_follow_stops_on_sigterm(source: Source, tmp_path: Path) -> None:
    """--follow applies everything, keeps waiting for more, and ends with exit 0 on SIGTERM,
    the tables equal to the primary's."""
    where = tmp_path / "lake"
    process = start_receivewal("apply", "-D", str(source.outdir), "--to", f"delta:{where}",
                               "--follow")
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                assert_equal_to_primary(source, where)
                break
            except (AssertionError, KeyError, OSError, deltalake.exceptions.DeltaError):
                assert process.poll() is None, "apply --follow ended by itself"
                assert time.monotonic() < deadline, "apply --follow did not catch up"
                time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
