"""A small replayer of the change log into a database, for the tests: the strongest check of a
change log is that applying it to a copy of the starting state gives the source's tables.

Runs are applied in order: begin .. commit as a transaction; begin_prepare .. prepare as
PREPARE TRANSACTION, then COMMIT PREPARED or ROLLBACK PREPARED when that line comes. Rows are
found by the old key (or whole old row) the server sent, else by the new row's key columns;
unchanged TOAST columns are left as they are. A value kept as bytes (``binary_b64``) cannot be
applied and fails the replay.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg import sql

Record = dict[str, Any]


def compare_tables(source_dsn: str, target_dsn: str, tables: list[str]) -> dict[str, tuple[
        tuple[object, ...], tuple[object, ...]]]:
    """The tables whose rows differ: (count, digest) on each side."""
    query = ("SELECT count(*), md5(coalesce(string_agg(x::text, E'\\n' ORDER BY x::text), '')) "
             "FROM {} x")
    differ = {}
    with psycopg.connect(source_dsn) as source, psycopg.connect(target_dsn) as target:
        for table in tables:
            statement = sql.SQL(query).format(sql.Identifier(*table.split(".")))
            mine = source.execute(statement).fetchone()
            theirs = target.execute(statement).fetchone()
            assert mine is not None
            assert theirs is not None
            if mine != theirs:
                differ[table] = (mine, theirs)
    return differ


def replay(records: Iterable[Record], dsn: str) -> list[Record]:
    """Apply the change log's lines to the database at ``dsn``; the message lines seen."""
    messages: list[Record] = []
    columns: dict[tuple[str, str], list[Record]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for record in records:
            op = record["op"]
            if op == "relation":
                columns[(record["schema"], record["table"])] = record["columns"]
            elif op in ("begin", "begin_prepare"):
                conn.execute("BEGIN")
            elif op == "commit":
                conn.execute("COMMIT")
            elif op == "prepare":
                conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(record["gid"])))
            elif op == "commit_prepared":
                conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(record["gid"])))
            elif op == "rollback_prepared":
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(record["gid"])))
            elif op == "message":
                messages.append(record)
            elif op == "truncate":
                tables = sql.SQL(", ").join(sql.Identifier(s, t) for s, t in record["tables"])
                conn.execute(sql.SQL("TRUNCATE {}{}{}").format(
                    tables, sql.SQL(" RESTART IDENTITY" if record["restart_identity"] else ""),
                    sql.SQL(" CASCADE" if record["cascade"] else "")))
            elif op in ("insert", "update", "delete"):
                _apply_change(conn, record, columns[(record["schema"], record["table"])])
            elif op not in ("header", "origin"):
                raise AssertionError(f"unknown line {record}")
    return messages


def _cast(column: Record) -> sql.Composable:
    if column["type"] is None:
        return sql.SQL("%s")
    return sql.SQL("%s::{}").format(sql.Identifier(*column["type"].split(".")))


def _value(value: object) -> object:
    if isinstance(value, dict):
        raise TypeError(f"a value kept as bytes cannot be replayed: {value}")
    return value


def _apply_change(conn: psycopg.Connection[Any], record: Record,
                  described: list[Record]) -> None:
    table = sql.Identifier(record["schema"], record["table"])
    by_name = {column["name"]: column for column in described}
    if record["op"] == "insert":
        new = record["new"]
        names = list(new)
        conn.execute(sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            table, sql.SQL(", ").join(map(sql.Identifier, names)),
            sql.SQL(", ").join(_cast(by_name[name]) for name in names)),
            [_value(new[name]) for name in names])
        return
    old = record["old"]
    if old is None:  # the key did not change: find the row by the new row's key columns
        old = {c["name"]: record["new"][c["name"]] for c in described if c["key"]}
    where = sql.SQL(" AND ").join(
        sql.SQL("{} IS NOT DISTINCT FROM {}").format(sql.Identifier(name), _cast(by_name[name]))
        for name in old)
    one_row = sql.SQL("ctid = (SELECT ctid FROM {} WHERE {} LIMIT 1)").format(table, where)
    keys = [_value(old[name]) for name in old]
    if record["op"] == "delete":
        done = conn.execute(sql.SQL("DELETE FROM {} WHERE {}").format(table, one_row), keys)
    else:
        new = record["new"]
        assignments = sql.SQL(", ").join(
            sql.SQL("{} = {}").format(sql.Identifier(name), _cast(by_name[name]))
            for name in new)
        done = conn.execute(sql.SQL("UPDATE {} SET {} WHERE {}").format(table, assignments,
                                                                       one_row),
                            [*(_value(new[name]) for name in new), *keys])
    assert done.rowcount == 1, f"no row for {record}"
