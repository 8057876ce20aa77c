# Over 500 lines: psycopg's second door: the target's transactions and the statements they send.
"""A PostgreSQL database as ``apply``'s target (``--to CONNSTR``).

The tables must exist there with the source's schema-qualified names and the columns the log
names. Progress is the row of ``receivewal.apply_progress`` named after the source (created on
first use): how many of the snapshot's tables are in, and the end LSN of the last transaction
applied. Each snapshot table (``COPY ... FROM STDIN``) and each batch of whole transactions
(:data:`BATCH_CHANGES`) is applied in one transaction of the target together with that row's
update, so the target holds a unit whole or not at all, and a later run starts right after
what it holds. A batch's changes go in runs of one shape: inserts by COPY, updates and deletes
by a key set-wise through a temporary table, the rest pipelined.

Changes are applied by the replica identity: an update or delete finds its row by the old
key the server sent (or, with REPLICA IDENTITY FULL, the whole old row, one row of equal ones
for a table without a key), else by the new row's key columns; an unchanged TOAST column is
left as the target has it. A change that finds no row, or an insert whose key is there
already, is a conflict: :class:`ApplyConflict` names the transaction's LSN, the table and the
key, and the transaction is rolled back (nothing of it applied; a failed batch is applied
again a transaction at a time to find it, those before it committed).

This module and :mod:`receivewal.replication.connection` are the two that import psycopg (the
replication connection's pq layer there; a plain client session here).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import psycopg
from psycopg import sql

from receivewal.apply.source import Columns, Record, Transaction
from receivewal.errors import ConnectionLost, ReceivewalError
from receivewal.secrets import redacted
from receivewal.wal.lsn import format_lsn, parse_lsn

PROGRESS_TABLE = ("receivewal", "apply_progress")
#: The session's settings: values read as the log writes them; and a set-wise run joined to
#: its table by the key's index, a row at a time (the planner, knowing nothing of a
#: temporary table's rows, would otherwise hash the whole table for each run)
_SESSION = ("-c TimeZone=UTC -c DateStyle=ISO -c enable_hashjoin=off "
            "-c enable_mergejoin=off")
#: A run of this many inserts goes as one COPY, and of updates or deletes by a key as one
#: statement through a temporary table (a pipelined statement costs psycopg ~0.1 ms of CPU
#: and the server a statement each; COPY streams the rows).
COPY_AT = 16
#: Changes applied in one transaction of the target at most (a bigger transaction alone):
#: runs of one shape then span transactions, and the target commits once for many.
BATCH_CHANGES = 10_000
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

    #: transactions are applied together, with their progress, up to this many changes
    batch_changes = BATCH_CHANGES
    #: one per transaction: not counted apart
    commits: int | None = None

    def __init__(self, conninfo: str, source: str) -> None:
        self.source = source
        self.snapshot_tables = 0
        #: the set-wise runs' temporary tables made on this connection, and in the
        #: transaction being applied (gone again if it rolls back)
        self.temporary: set[str] = set()
        self.made: list[str] = []
        #: those that hold rows in the transaction being applied
        self.used: set[str] = set()
        try:
            self.conn = psycopg.connect(conninfo, autocommit=False, options=_SESSION)
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
        """The transactions of ``batch`` and the progress row through the last, in one
        transaction of the target; how many. When anything of it fails (a change that finds
        no row, a key there already, any error), that transaction is rolled back and the
        batch applied again one transaction at a time (:meth:`apply_transaction`), which
        stops at the one that fails and names it, those before it applied."""
        if len(batch) > 1:
            try:
                with self.conn.transaction(), self.conn.cursor() as cur:
                    self._apply_runs(cur, [c for t in batch for c in t.changes], None)
                    self._record(cur, batch[-1])
            except (_Unmatched, ReceivewalError, psycopg.Error):
                self._forget_made()  # rolled back: one at a time says what failed
            else:
                return len(batch)
            finally:
                self.made.clear()
                self.used.clear()
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

        The changes go to the server in runs of one shape (the same statement: table,
        operation and columns; :func:`_runs`): a long run of inserts as one COPY, a long run
        of updates or deletes by a key set-wise (:meth:`_set_wise`), a short run pipelined
        (``executemany``: one round trip for many). An update or delete must touch one row
        each, which a run's total says. When a pipelined run's does not, the transaction is
        rolled back and applied again one change at a time to name the change that finds no
        row, then rolled back again: nothing of it is applied."""
        try:
            try:
                with self.conn.transaction(), self.conn.cursor() as cur:
                    self._apply_runs(cur, transaction.changes, transaction)
                    self._record(cur, transaction)
            except _Unmatched:
                self._forget_made()
                self.used.clear()
                with self.conn.transaction(), self.conn.cursor() as cur:
                    for record, columns in transaction.changes:
                        shape, row = _statement(record, columns, self.conn)
                        cur.execute(shape.statement, row)
                        if shape.counted and cur.rowcount != 1:
                            raise _no_row(transaction, record, columns) from None
                raise ReceivewalError(f"transaction committed at {transaction.lsn}: a change "
                                      "found no row when applied with others, and every one "
                                      "alone did; nothing of the transaction was applied"
                                      ) from None
        except ApplyConflict:
            self._forget_made()
            raise
        except psycopg.errors.UniqueViolation as exc:
            self._forget_made()
            raise ApplyConflict(f"transaction committed at {transaction.lsn}: a key is in "
                                f"the target already ({_one_line(exc)}); nothing of the "
                                "transaction was applied") from exc
        except psycopg.Error as exc:
            self._forget_made()
            raise ReceivewalError(f"transaction committed at {transaction.lsn}: "
                                  f"{_one_line(exc)}; nothing of the transaction was applied"
                                  ) from exc
        finally:
            self.made.clear()
            self.used.clear()

    def _apply_runs(self, cur: psycopg.Cursor[Any], changes: list[tuple[Record, Columns]],
                    transaction: Transaction | None) -> None:
        """``changes`` run by run; those of one ``transaction`` (else of a batch, which
        _Unmatched sends one transaction at a time)."""
        for run in _runs(changes, self.conn):
            shape = run.shape
            if shape.copy is not None and len(run.rows) >= COPY_AT:  # inserts: one COPY
                with cur.copy(shape.copy) as stream:
                    for row in run.rows:
                        stream.write_row(row)
            elif shape.set_wise is not None and len(run.rows) >= COPY_AT:
                self._set_wise(cur, run, transaction)
            else:
                cur.executemany(shape.statement, run.rows)
                if shape.counted and cur.rowcount != len(run.rows):
                    raise _Unmatched

    def _set_wise(self, cur: psycopg.Cursor[Any], run: _Run,
                  transaction: Transaction | None) -> None:
        """A run of updates or deletes by a key, in one statement: the run's rows copied into
        a temporary table (made once per shape and connection, emptied at each commit), then
        one ``UPDATE ... FROM`` or ``DELETE ... USING`` joined on the key. Each change must
        touch one row (a run holds a key once, and an update that changes its key is never
        in one). A batch's run raises _Unmatched when the statement touches fewer; one
        transaction's is inside a savepoint, rolled back when the statement touches fewer or
        fails, and the run is then applied one change at a time, which names the change that
        finds no row."""
        set_wise = run.shape.set_wise
        assert set_wise is not None
        if set_wise.table not in self.temporary:
            cur.execute(set_wise.create)
            self.temporary.add(set_wise.table)
            self.made.append(set_wise.table)
        elif set_wise.table in self.used:  # its rows are deleted at commit, not before
            cur.execute(set_wise.empty)
        self.used.add(set_wise.table)
        if transaction is None:
            self._copy_and_join(cur, run, set_wise)
            return
        try:
            self._one_statement(cur, run, set_wise)
        except (_Unmatched, psycopg.errors.IntegrityError, psycopg.errors.DataError):
            pass  # rolled back to the savepoint: the changes one at a time say which
        else:
            return
        for (record, columns), row in zip(run.changes, run.rows, strict=True):
            cur.execute(run.shape.statement, row)
            if cur.rowcount != 1:
                raise _no_row(transaction, record, columns)

    def _one_statement(self, cur: psycopg.Cursor[Any], run: _Run, set_wise: _SetWise) -> None:
        """The run set-wise inside a savepoint; _Unmatched (rolled back) when a change
        touched no row."""
        with self.conn.transaction():
            self._copy_and_join(cur, run, set_wise)

    @staticmethod
    def _copy_and_join(cur: psycopg.Cursor[Any], run: _Run, set_wise: _SetWise) -> None:
        width = set_wise.width
        with cur.copy(set_wise.copy) as stream:
            for row in run.rows:
                stream.write_row(row[:width])
        cur.execute(set_wise.statement)
        if cur.rowcount != len(run.rows):
            raise _Unmatched

    def _forget_made(self) -> None:
        """The temporary tables made in a transaction rolled back are gone with it."""
        self.temporary.difference_update(self.made)
        self.made.clear()

    def _record(self, cur: psycopg.Cursor[Any], transaction: Transaction) -> None:
        cur.execute("UPDATE receivewal.apply_progress SET applied_through = %s, "
                    "updated_at = now() WHERE source = %s",
                    [format_lsn(transaction.end_lsn), self.source])


class _Unmatched(Exception):  # noqa: N818 - internal: a batch touched fewer rows than changes
    pass


@dataclass(frozen=True)
class _SetWise:
    """How a run of one update or delete shape by a key is applied as one statement."""

    table: str  # the temporary table's name, one per shape
    create: str  # its CREATE TEMPORARY TABLE (the target table's types, no rows)
    empty: str  # its TRUNCATE, for a second run in one transaction
    copy: str  # the COPY of a run's rows into it
    statement: str  # the UPDATE ... FROM or DELETE ... USING it, joined on the key
    width: int  # how many leading parameters of a change go into it (its columns)


@dataclass(frozen=True)
class _Shape:
    """One change's statement, composed once per shape (table, operation, columns)."""

    statement: str
    counted: bool  # each change must touch exactly one row
    copy: str | None = None  # inserts: the COPY of the same columns
    set_wise: _SetWise | None = None  # updates and deletes by a key
    key_at: int = 0  # a set-wise update's: where the key's values begin in its parameters


@dataclass
class _Run:
    """Consecutive changes of one shape, with their parameters."""

    shape: _Shape
    rows: list[list[object]] = field(default_factory=list)
    changes: list[tuple[Record, Columns]] = field(default_factory=list)
    keys: set[tuple[object, ...]] = field(default_factory=set)


def _runs(changes: list[tuple[Record, Columns]], conn: psycopg.Connection[Any]) -> list[_Run]:
    """Changes as runs of one shape each. A run of updates by a key holds each key once:
    applied set-wise, a key updated twice would be updated once."""
    runs: list[_Run] = []
    run: _Run | None = None
    for change in changes:
        shape, row = _statement(change[0], change[1], conn)
        at = shape.key_at
        if at:
            key = tuple(row[at:])
            if run is None or run.shape is not shape or key in run.keys:
                run = _Run(shape)
                runs.append(run)
            run.keys.add(key)
        elif run is None or run.shape is not shape:
            run = _Run(shape)
            runs.append(run)
        run.rows.append(row)
        run.changes.append(change)
    return runs


def _no_row(transaction: Transaction, record: Record, columns: Columns) -> ApplyConflict:
    match, _ = _identity(record, columns)
    return ApplyConflict(f"transaction committed at {transaction.lsn}: {record['op']} at "
                         f"{record['lsn']} finds no row of table {_name(record)} with "
                         f"{_describe(match)}; nothing of the transaction was applied")


_SHAPES: dict[tuple[object, ...], _Shape] = {}
#: the temporary tables of set-wise runs: ``pg_temp.receivewal_run_<n>``, one per shape
_TEMPORARY = "receivewal_run_{}"
_NUMBERS = itertools.count(1)


def _statement(record: Record, columns: Columns, conn: psycopg.Connection[Any]
               ) -> tuple[_Shape, list[object]]:
    """One change as its shape and its parameters; a shape is composed once."""
    op = record["op"]
    if op == "insert":
        new = record["new"]
        return _composed((op, record["schema"], record["table"], *new), conn), _values(new)
    if op == "truncate":
        text = sql.SQL("TRUNCATE {}{}{}").format(
            sql.SQL(", ").join(sql.Identifier(s, t) for s, t in record["tables"]),
            sql.SQL(" RESTART IDENTITY" if record.get("restart_identity") else ""),
            sql.SQL(" CASCADE" if record.get("cascade") else "")).as_string(conn)
        return _Shape(text, counted=False), []
    new = record.get("new") or {}
    old = record.get("old")
    keys, full = _keys(columns)
    if old:
        names = tuple(old)
        values = _values(old)
    else:
        names = tuple(name for name in keys if name in new)
        values = [new[name] for name in names]
    if not names:
        raise ApplyConflict(f"{op} of table {_name(record)} at {record['lsn']} names no row "
                            "(no replica identity); nothing of the transaction was applied")
    # an update by a key it keeps (no old key sent) can go set-wise, as can a keyed delete
    set_wise = not full and (op == "delete" or not old)
    if op == "delete":
        shape = (op, record["schema"], record["table"], not full, set_wise, *names)
        return _composed(shape, conn), values
    shape = (op, record["schema"], record["table"], not full, set_wise, tuple(new), *names)
    row = _values(new)
    row += values
    return _composed(shape, conn), row


def _composed(shape: tuple[object, ...], conn: psycopg.Connection[Any]) -> _Shape:
    known = _SHAPES.get(shape)
    if known is not None:
        return known
    op, schema, name = shape[0], str(shape[1]), str(shape[2])
    table = sql.Identifier(schema, name)
    if op == "insert":
        names = sql.SQL(", ").join(sql.Identifier(str(n)) for n in shape[3:])
        composed = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            table, names, sql.SQL(", ").join(sql.Placeholder() * len(shape[3:])))
        copy = sql.SQL("COPY {} ({}) FROM STDIN").format(table, names)
        made = _SHAPES[shape] = _Shape(composed.as_string(conn), counted=False,
                                       copy=copy.as_string(conn))
        return made
    keyed, set_wise = bool(shape[3]), bool(shape[4])
    assigned = cast(tuple[str, ...], shape[5]) if op == "update" else ()
    match = [str(n) for n in shape[(5 if op == "delete" else 6):]]
    # a key by equality (its index finds the row); a whole old row null-safely, one row
    compare = sql.SQL("{} = %s") if keyed else sql.SQL("{} IS NOT DISTINCT FROM %s")
    where = sql.SQL(" AND ").join(compare.format(sql.Identifier(n)) for n in match)
    target = where if keyed else sql.SQL("ctid = (SELECT ctid FROM {} WHERE {} LIMIT 1)"
                                        ).format(table, where)
    if op == "delete":
        composed = sql.SQL("DELETE FROM {} WHERE {}").format(table, target)
    else:
        assignments = sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(n))
                                         for n in assigned)
        composed = sql.SQL("UPDATE {} SET {} WHERE {}").format(table, assignments, target)
    made = _SHAPES[shape] = _Shape(
        composed.as_string(conn), counted=True,
        set_wise=_set_wise(table, op, assigned, match, conn) if set_wise else None,
        key_at=len(assigned) if set_wise else 0)
    return made


def _set_wise(table: sql.Identifier, op: object, assigned: tuple[str, ...], key: list[str],
              conn: psycopg.Connection[Any]) -> _SetWise:
    """The temporary table, COPY and statement of a set-wise shape: an update's table holds
    the columns it assigns (the key among them), a delete's the key."""
    columns = list(assigned) if op == "update" else key
    temporary = sql.Identifier("pg_temp", _TEMPORARY.format(next(_NUMBERS)))
    names = sql.SQL(", ").join(map(sql.Identifier, columns))
    create = sql.SQL("CREATE TEMPORARY TABLE {} ON COMMIT DELETE ROWS AS SELECT {} FROM {} "
                     "WITH NO DATA").format(temporary, names, table)
    joined = sql.SQL(" AND ").join(
        sql.SQL("t.{0} = s.{0}").format(sql.Identifier(n)) for n in key)
    if op == "delete":
        statement = sql.SQL("DELETE FROM {} AS t USING {} AS s WHERE {}").format(
            table, temporary, joined)
    else:
        changed = [n for n in assigned if n not in key] or key
        statement = sql.SQL("UPDATE {} AS t SET {} FROM {} AS s WHERE {}").format(
            table, sql.SQL(", ").join(sql.SQL("{0} = s.{0}").format(sql.Identifier(n))
                                      for n in changed), temporary, joined)
    return _SetWise(temporary.as_string(conn), create.as_string(conn),
                    sql.SQL("TRUNCATE {}").format(temporary).as_string(conn),
                    sql.SQL("COPY {} ({}) FROM STDIN").format(temporary, names).as_string(conn),
                    statement.as_string(conn), len(columns))


def _identity(record: Record, columns: Columns) -> tuple[dict[str, Any], bool]:
    """The values that find the changed row, and whether they are a key (else the whole old
    row of a table with REPLICA IDENTITY FULL, which may match equal rows)."""
    keys, full = _keys(columns)
    old = record.get("old")
    if old:
        return old, not full
    new = record.get("new") or {}
    return {name: new[name] for name in keys if name in new}, not full


#: A relation's key columns and whether they are all of them (REPLICA IDENTITY FULL), by
#: the relation's columns (one list for all the changes after a relation line).
_KEYS: dict[int, tuple[Columns, tuple[str, ...], bool]] = {}


def _keys(columns: Columns) -> tuple[tuple[str, ...], bool]:
    known = _KEYS.get(id(columns))
    if known is None or known[0] is not columns:
        if len(_KEYS) > 4096:
            _KEYS.clear()
        keys = tuple(column["name"] for column in columns if column.get("key"))
        known = _KEYS[id(columns)] = (columns, keys,
                                      bool(columns) and len(keys) == len(columns))
    return known[1], known[2]


def _values(row: dict[str, Any]) -> list[object]:
    values = list(row.values())
    if dict in map(type, values):
        _value({})
    return values


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
