"""A PostgreSQL database as ``apply``'s target (``--to CONNSTR``).

The tables must exist there with the source's schema-qualified names and the columns the log
names. Progress is the row of ``receivewal.apply_progress`` named after the source (created on
first use): how many of the snapshot's tables are in, and the end LSN of the last transaction
applied. Each snapshot table (``COPY ... FROM STDIN``) and each transaction is applied in one
transaction of the target together with that row's update, so the target holds a unit whole
or not at all, and a later run starts right after what it holds.

Changes are applied by the replica identity: an update or delete finds its row by the old
key the server sent (or, with REPLICA IDENTITY FULL, the whole old row, one row of equal ones
for a table without a key), else by the new row's key columns; an unchanged TOAST column is
left as the target has it. A change that finds no row, or an insert whose key is there
already, is a conflict: :class:`ApplyConflict` names the transaction's LSN, the table and the
key, and the transaction is rolled back (nothing of it applied).

This module and :mod:`receivewal.replication.connection` are the two that import psycopg (the
replication connection's pq layer there; a plain client session here).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import psycopg
from psycopg import sql

from receivewal.apply.source import Columns, Record, Transaction
from receivewal.errors import ConnectionLost, ReceivewalError
from receivewal.secrets import redacted
from receivewal.wal.lsn import format_lsn, parse_lsn

PROGRESS_TABLE = ("receivewal", "apply_progress")
_SETUP = """
CREATE SCHEMA IF NOT EXISTS receivewal;
CREATE TABLE IF NOT EXISTS receivewal.apply_progress (
    source text PRIMARY KEY,
    snapshot_tables integer NOT NULL DEFAULT 0,
    applied_through pg_lsn NOT NULL DEFAULT '0/0',
    updated_at timestamptz NOT NULL DEFAULT now())
"""


class ApplyConflict(ReceivewalError):  # noqa: N818 - a state, as PostgreSQL names it
    """A change the target cannot take as it stands (no row to update or delete, a key that
    is there already): its transaction is not applied, and apply stops."""


@dataclass(frozen=True)
class Progress:
    """How far the target got: snapshot tables applied, and the last transaction's end."""

    snapshot_tables: int
    applied_through: int


class PostgresTarget:
    """One connection to the target database, for one source (a slot's change log)."""

    #: each transaction is applied (and progress recorded) alone
    batch_changes = 1
    #: one per transaction: not counted apart
    commits: int | None = None

    def __init__(self, conninfo: str, source: str) -> None:
        self.source = source
        self.snapshot_tables = 0
        try:
            self.conn = psycopg.connect(conninfo, autocommit=False,
                                        options="-c TimeZone=UTC -c DateStyle=ISO")
        except psycopg.Error as exc:
            raise ConnectionLost(redacted(f"cannot connect to the target: {_one_line(exc)}")
                                 ) from exc

    def close(self) -> None:
        self.conn.close()

    def progress(self) -> Progress:
        """The source's progress row (made on first use, with its table)."""
        try:
            with self.conn.transaction():
                self.conn.execute(_SETUP)
                self.conn.execute("INSERT INTO receivewal.apply_progress (source) VALUES (%s) "
                                  "ON CONFLICT DO NOTHING", [self.source])
                row = self.conn.execute(
                    "SELECT snapshot_tables, applied_through::text FROM "
                    "receivewal.apply_progress WHERE source = %s", [self.source]).fetchone()
        except psycopg.Error as exc:
            raise ReceivewalError(f"the target's progress table: {_one_line(exc)}") from exc
        assert row is not None
        return Progress(int(row[0]), parse_lsn(row[1]))

    def begin(self, consistent_point: int) -> int:
        """Read the progress row: the end LSN of the last transaction applied."""
        progress = self.progress()
        self.snapshot_tables = progress.snapshot_tables
        return progress.applied_through

    def holds_table(self, index: int, schema: str, table: str) -> bool:
        """Whether the snapshot's table number ``index`` is in (the progress row counts)."""
        return index <= self.snapshot_tables

    def apply_batch(self, batch: list[Transaction]) -> int:
        """Each transaction of ``batch`` in a transaction of its own; how many."""
        for transaction in batch:
            self.apply_transaction(transaction)
        return len(batch)

    def apply_table(self, index: int, relation: Record,
                    rows: Iterable[Record]) -> int:
        """The snapshot's table number ``index`` (its relation line and row lines), in one
        transaction with the progress row; the rows copied."""
        table = sql.Identifier(relation["schema"], relation["table"])
        names = [column["name"] for column in relation["columns"]]
        count = 0
        try:
            with self.conn.transaction(), self.conn.cursor() as cur:
                statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
                    table, sql.SQL(", ").join(map(sql.Identifier, names)))
                with cur.copy(statement) as copy:
                    for record in rows:
                        new = record["new"]
                        copy.write_row([_value(new[name]) for name in names])
                        count += 1
                cur.execute("UPDATE receivewal.apply_progress SET snapshot_tables = %s, "
                            "updated_at = now() WHERE source = %s", [index, self.source])
        except psycopg.errors.UniqueViolation as exc:
            raise ApplyConflict(f"snapshot table {_name(relation)}: a key is in the target "
                                f"already ({_one_line(exc)}); nothing of the table was "
                                "applied") from exc
        except psycopg.Error as exc:
            raise ReceivewalError(f"snapshot table {_name(relation)}: {_one_line(exc)}; "
                                  "nothing of the table was applied") from exc
        return count

    def apply_transaction(self, transaction: Transaction) -> None:
        """Every change of ``transaction`` and the progress row, in one transaction.

        Consecutive changes of one shape (the same statement: table, operation and columns)
        go to the server together (``executemany``, pipelined: one round trip for many); an
        update or delete must touch one row each, which their total says. When it does not,
        the transaction is rolled back and applied again one change at a time to name the
        change that finds no row, then rolled back again: nothing of it is applied."""
        try:
            try:
                with self.conn.transaction(), self.conn.cursor() as cur:
                    self._batched(cur, transaction)
                    self._record(cur, transaction)
            except _Unmatched:
                with self.conn.transaction(), self.conn.cursor() as cur:
                    for record, columns in transaction.changes:
                        statement, row, counted = _statement(record, columns, self.conn)
                        cur.execute(statement, row)
                        if counted and cur.rowcount != 1:
                            raise _no_row(transaction, record, columns) from None
                raise ReceivewalError(f"transaction committed at {transaction.lsn}: a change "
                                      "found no row when applied with others, and every one "
                                      "alone did; nothing of the transaction was applied"
                                      ) from None
        except ApplyConflict:
            raise
        except psycopg.errors.UniqueViolation as exc:
            raise ApplyConflict(f"transaction committed at {transaction.lsn}: a key is in "
                                f"the target already ({_one_line(exc)}); nothing of the "
                                "transaction was applied") from exc
        except psycopg.Error as exc:
            raise ReceivewalError(f"transaction committed at {transaction.lsn}: "
                                  f"{_one_line(exc)}; nothing of the transaction was applied"
                                  ) from exc

    def _batched(self, cur: psycopg.Cursor[Any], transaction: Transaction) -> None:
        for statement, rows, counted in _batches(transaction, self.conn):
            copy = _COPIES.get(statement)
            if copy is not None and len(rows) >= COPY_AT:  # a run of inserts: one COPY
                with cur.copy(copy) as stream:
                    for row in rows:
                        stream.write_row(row)
                continue
            cur.executemany(statement, rows)
            if counted and cur.rowcount != len(rows):
                raise _Unmatched

    def _record(self, cur: psycopg.Cursor[Any], transaction: Transaction) -> None:
        cur.execute("UPDATE receivewal.apply_progress SET applied_through = %s, "
                    "updated_at = now() WHERE source = %s",
                    [format_lsn(transaction.end_lsn), self.source])


class _Unmatched(Exception):  # noqa: N818 - internal: a batch touched fewer rows than changes
    pass


def _batches(transaction: Transaction, conn: psycopg.Connection[Any]
             ) -> list[tuple[str, list[list[object]], bool]]:
    """The transaction's changes as runs of one statement each: (statement, rows, whether
    each row must touch exactly one row)."""
    runs: list[tuple[str, list[list[object]], bool]] = []
    for record, columns in transaction.changes:
        statement, row, counted = _statement(record, columns, conn)
        if runs and runs[-1][0] == statement:
            runs[-1][1].append(row)
        else:
            runs.append((statement, [row], counted))
    return runs


def _no_row(transaction: Transaction, record: Record, columns: Columns) -> ApplyConflict:
    match, _ = _identity(record, columns)
    return ApplyConflict(f"transaction committed at {transaction.lsn}: {record['op']} at "
                         f"{record['lsn']} finds no row of table {_name(record)} with "
                         f"{_describe(match)}; nothing of the transaction was applied")


_STATEMENTS: dict[tuple[object, ...], str] = {}
#: An insert statement's COPY of the same columns, and the run of inserts from which it is
#: used instead (a pipelined statement costs psycopg ~0.1 ms of CPU; COPY streams the rows).
_COPIES: dict[str, str] = {}
COPY_AT = 16


def _statement(record: Record, columns: Columns, conn: psycopg.Connection[Any]
               ) -> tuple[str, list[object], bool]:
    """One change as (statement, its parameters, whether it must touch exactly one row); the
    statement's text is composed once per shape."""
    op = record["op"]
    if op == "truncate":
        text = sql.SQL("TRUNCATE {}{}{}").format(
            sql.SQL(", ").join(sql.Identifier(s, t) for s, t in record["tables"]),
            sql.SQL(" RESTART IDENTITY" if record.get("restart_identity") else ""),
            sql.SQL(" CASCADE" if record.get("cascade") else "")).as_string(conn)
        return text, [], False
    new = record.get("new") or {}
    if op == "insert":
        shape: tuple[object, ...] = (op, record["schema"], record["table"], *new)
        return _composed(shape, conn), [_value(value) for value in new.values()], False
    match, keyed = _identity(record, columns)
    if not match:
        raise ApplyConflict(f"{op} of table {_name(record)} at {record['lsn']} names no row "
                            "(no replica identity); nothing of the transaction was applied")
    values = [_value(value) for value in match.values()]
    if op == "delete":
        shape = (op, record["schema"], record["table"], keyed, *match)
        return _composed(shape, conn), values, True
    shape = (op, record["schema"], record["table"], keyed, tuple(new), *match)
    return _composed(shape, conn), [*(_value(v) for v in new.values()), *values], True


def _composed(shape: tuple[object, ...], conn: psycopg.Connection[Any]) -> str:
    text = _STATEMENTS.get(shape)
    if text is not None:
        return text
    op, schema, name = shape[0], str(shape[1]), str(shape[2])
    table = sql.Identifier(schema, name)
    if op == "insert":
        names = [str(n) for n in shape[3:]]
        composed = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            table, sql.SQL(", ").join(map(sql.Identifier, names)),
            sql.SQL(", ").join(sql.Placeholder() * len(names)))
        text = _STATEMENTS[shape] = composed.as_string(conn)
        _COPIES[text] = sql.SQL("COPY {} ({}) FROM STDIN").format(
            table, sql.SQL(", ").join(map(sql.Identifier, names))).as_string(conn)
        return text
    keyed = bool(shape[3])
    match = [str(n) for n in (shape[4:] if op == "delete" else shape[5:])]
    # a key by equality (its index finds the row); a whole old row null-safely, one row
    compare = sql.SQL("{} = %s") if keyed else sql.SQL("{} IS NOT DISTINCT FROM %s")
    where = sql.SQL(" AND ").join(compare.format(sql.Identifier(n)) for n in match)
    target = where if keyed else sql.SQL("ctid = (SELECT ctid FROM {} WHERE {} LIMIT 1)"
                                        ).format(table, where)
    if op == "delete":
        composed = sql.SQL("DELETE FROM {} WHERE {}").format(table, target)
    else:
        assigned = cast(tuple[str, ...], shape[4])
        assignments = sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(n))
                                         for n in assigned)
        composed = sql.SQL("UPDATE {} SET {} WHERE {}").format(table, assignments, target)
    text = _STATEMENTS[shape] = composed.as_string(conn)
    return text


def _identity(record: Record, columns: Columns) -> tuple[dict[str, Any], bool]:
    """The values that find the changed row, and whether they are a key (else the whole old
    row of a table with REPLICA IDENTITY FULL, which may match equal rows)."""
    keys = [column["name"] for column in columns if column.get("key")]
    full = bool(columns) and len(keys) == len(columns)
    old = record.get("old")
    if old:
        return dict(old), not full
    new = record.get("new") or {}
    return {name: new[name] for name in keys if name in new}, not full


def _value(value: object) -> object:
    if isinstance(value, dict):
        raise ReceivewalError("a value kept as bytes (binary_b64 or internal_b64: a type "
                              "--binary does not convert) cannot be applied")
    return value


def _name(record: Record) -> str:
    return f"{record['schema']}.{record['table']}"


def _describe(match: dict[str, Any]) -> str:
    shown = ", ".join(f"{name} = {value!r}" for name, value in list(match.items())[:8])
    return shown[:300]


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:500]
