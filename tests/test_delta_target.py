"""The Delta target of ``apply`` (receivewal/apply/delta.py) without a server: transactions as
the change log's reader makes them, applied to Delta tables in a temporary directory, and read
back with deltalake. The last change of a key in a batch wins, an unchanged TOAST column keeps
the table's value, a table without a key takes one row of equal ones, a TRUNCATE splits the
batch, a column added at the source is added, and a commit that is there is never made again
(a run that died between two tables' commits resumes each table where it stands)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from receivewal.apply.source import Columns, Record, Transaction

deltalake = pytest.importorskip("deltalake")
delta = pytest.importorskip("receivewal.apply.delta")

KEYED: Columns = [{"name": "id", "type": "int4", "key": True},
                  {"name": "body", "type": "text", "key": False},
                  {"name": "note", "type": "text", "key": False}]
FULL: Columns = [{"name": "id", "type": "int4", "key": True},
                 {"name": "val", "type": "text", "key": True}]
APP = "receivewal:slot"


def change(op: str, table: str, *, new: dict[str, Any] | None = None,
           old: dict[str, Any] | None = None) -> Record:
    return {"op": op, "schema": "public", "table": table, "lsn": "0/1", "new": new, "old": old}


def transaction(end: int, *changes: tuple[Record, Columns]) -> Transaction:
    return Transaction(end, end - 8, None, list(changes))


def rows(where: Path, table: str) -> list[tuple[Any, ...]]:
    data = deltalake.DeltaTable(str(where / "public" / table)).to_pyarrow_table()
    return sorted((tuple(row.values()) for row in data.to_pylist()), key=str)


def version(where: Path, table: str) -> tuple[int, int | None]:
    opened = deltalake.DeltaTable(str(where / "public" / table))
    return opened.version(), opened.transaction_version(APP)


def test_last_change_of_a_key_wins_and_an_unchanged_toast_column_keeps_its_value(
        tmp_path: Path) -> None:
    target = delta.DeltaTarget(str(tmp_path), "slot")
    target.apply_batch([transaction(
        100, (change("insert", "docs", new={"id": "1", "body": "long", "note": "a"}), KEYED),
        (change("insert", "docs", new={"id": "2", "body": "b", "note": "b"}), KEYED))])
    assert target.apply_batch([
        transaction(200, (change("update", "docs", new={"id": "1", "note": "b"}), KEYED)),
        transaction(300, (change("update", "docs", new={"id": "1", "note": "c"}), KEYED),
                    (change("delete", "docs", old={"id": "2"}), KEYED),
                    (change("insert", "docs", new={"id": "3", "body": "x", "note": None}),
                     KEYED),
                    (change("update", "docs", old={"id": "3"},
                            new={"id": "4", "body": "y", "note": None}), KEYED))]) == 2
    assert rows(tmp_path, "docs") == [("1", "long", "c"), ("4", "y", None)]
    assert version(tmp_path, "docs") == (1, 300)  # one commit for the batch: a MERGE


def test_a_table_without_a_key_takes_one_row_of_equal_ones(tmp_path: Path) -> None:
    target = delta.DeltaTarget(str(tmp_path), "slot")
    target.apply_batch([transaction(100, *[
        (change("insert", "full", new={"id": i, "val": v}), FULL)
        for i, v in [("1", "a"), ("2", "b"), ("2", "b"), ("3", None)]])])
    target.apply_batch([
        transaction(200, (change("update", "full", old={"id": "1", "val": "a"},
                                 new={"id": "1", "val": "c"}), FULL),
                    (change("delete", "full", old={"id": "2", "val": "b"}), FULL)),
        transaction(300, (change("insert", "full", new={"id": "5", "val": "e"}), FULL),
                    (change("delete", "full", old={"id": "3", "val": None}), FULL))])
    assert rows(tmp_path, "full") == [("1", "c"), ("2", "b"), ("5", "e")]
    assert version(tmp_path, "full") == (1, 300)


def test_a_truncate_empties_the_table_and_what_follows_it_stays(tmp_path: Path) -> None:
    target = delta.DeltaTarget(str(tmp_path), "slot")
    target.apply_batch([transaction(
        100, (change("insert", "docs", new={"id": "1", "body": "a", "note": "a"}), KEYED))])
    target.apply_batch([transaction(
        200, (change("insert", "docs", new={"id": "2", "body": "b", "note": "b"}), KEYED),
        ({"op": "truncate", "lsn": "0/1", "tables": [["public", "docs"]]}, []),
        (change("insert", "docs", new={"id": "3", "body": "c", "note": "c"}), KEYED))])
    assert rows(tmp_path, "docs") == [("3", "c", "c")]


def test_a_column_added_at_the_source_is_added_to_the_table(tmp_path: Path) -> None:
    target = delta.DeltaTarget(str(tmp_path), "slot")
    target.apply_batch([transaction(
        100, (change("insert", "docs", new={"id": "1", "body": "a", "note": "a"}), KEYED))])
    wider = [*KEYED, {"name": "Added col", "type": "text", "key": False}]
    target.apply_batch([transaction(
        200, (change("insert", "docs", new={"id": "2", "body": "b", "note": "b",
                                            "Added col": "new"}), wider))])
    assert rows(tmp_path, "docs") == [("1", "a", "a", None), ("2", "b", "b", "new")]


def test_a_batch_cut_between_two_tables_commits_resumes_each_table_where_it_stands(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first table's commit is made, then the run dies before the second's: run again,
    the first table passes over what it holds (no new version) and the second takes all."""
    batch = [transaction(100, (change("insert", "a", new={"id": "1", "val": "x"}), FULL),
                         (change("insert", "b", new={"id": "1", "val": "x"}), FULL))]
    dying = delta.DeltaTarget(str(tmp_path), "slot")
    real = dying._commit_table

    def commit_one(schema: str, table: str, *args: Any) -> None:
        if table == "b":
            raise SystemExit("killed")
        real(schema, table, *args)

    monkeypatch.setattr(dying, "_commit_table", commit_one)
    with pytest.raises(SystemExit):
        dying.apply_batch(batch)
    assert version(tmp_path, "a") == (0, 100)
    again = delta.DeltaTarget(str(tmp_path), "slot")
    assert again.apply_batch(batch) == 1
    assert version(tmp_path, "a") == (0, 100)
    assert version(tmp_path, "b") == (0, 100)
    assert rows(tmp_path, "a") == rows(tmp_path, "b") == [("1", "x")]
    third = delta.DeltaTarget(str(tmp_path), "slot")
    assert third.apply_batch(batch) == 0
    assert third.commits == 0


def test_the_snapshots_load_is_versioned_at_the_consistent_point(tmp_path: Path) -> None:
    target = delta.DeltaTarget(str(tmp_path), "slot")
    assert target.begin(0x5000) == 0
    relation = {"op": "relation", "schema": "public", "table": "docs", "columns": KEYED}
    loaded = target.apply_table(1, relation, iter([
        {"op": "row", "new": {"id": str(i), "body": "b", "note": None}} for i in range(20_000)]))
    assert loaded == 20_000
    assert version(tmp_path, "docs") == (0, 0x5000)
    assert delta.DeltaTarget(str(tmp_path), "slot").holds_table(1, "public", "docs")
    assert not delta.DeltaTarget(str(tmp_path), "other").holds_table(1, "public", "docs")


def test_a_name_that_cannot_be_a_folder_is_one_clear_error(tmp_path: Path) -> None:
    target = delta.DeltaTarget(str(tmp_path), "slot")
    with pytest.raises(delta.ReceivewalError, match="cannot be a Delta table's folder"):
        target.apply_batch([transaction(
            100, (change("insert", "../up", new={"id": "1", "val": "x"}), FULL))])


def test_an_update_that_changes_the_key_keeps_an_unchanged_toast_column(tmp_path: Path) -> None:
    """The new key's row takes the value the update did not carry from the old key's row, as
    the table holds it or as the batch left it."""
    target = delta.DeltaTarget(str(tmp_path), "slot")
    target.apply_batch([transaction(
        100, (change("insert", "docs", new={"id": "1", "body": "long1", "note": "a"}), KEYED),
        (change("insert", "docs", new={"id": "2", "body": "long2", "note": "b"}), KEYED))])
    target.apply_batch([
        transaction(200, (change("update", "docs", old={"id": "1"},
                                 new={"id": "10", "note": "moved"}), KEYED)),
        transaction(300, (change("update", "docs", new={"id": "2", "note": "b2"}), KEYED),
                    (change("update", "docs", old={"id": "2"},
                            new={"id": "20", "note": "moved too"}), KEYED),
                    (change("update", "docs", new={"id": "20", "note": "then changed"}),
                     KEYED))])
    assert rows(tmp_path, "docs") == [("10", "long1", "moved"),
                                      ("20", "long2", "then changed")]
