"""Delta Lake tables as ``apply``'s target (``--to delta:DIR``), written with ``deltalake``.

Each source table is the Delta table ``DIR/<schema>/<table>`` (DIR a directory, or a bucket's
prefix as :func:`receivewal.archive.location.is_bucket_url` tells), created on first use.
Every column is a string column holding the log's value as it stands (PostgreSQL's text
output, NULL as null): lossless for every type, and what a reader casts as it needs. A column
that a relation line names and the table lacks is added to it (a nullable string column).

Exactly once without a progress table: every commit that writes rows carries a Delta
application transaction (``app_id`` ``receivewal:<slot>``, ``version`` the end LSN of the last
transaction it holds, or the snapshot's consistent point for the snapshot's load), in the
same atomic commit as the rows. A table's ``transaction_version`` is then how far that table
holds the log: a change at or before it is passed over for that table, so a run killed
between two tables' commits, or between a commit and anything else, and run again applies
nothing twice and skips nothing.

Transactions are taken a batch at a time (:data:`BATCH_CHANGES`, never splitting one), and
each table a batch touches gets one commit:

- A table with a key (the relation's ``key`` columns, not all of them): the batch's changes
  folded per key in commit order (the last one wins; an update sets only the columns it
  carries, so an unchanged TOAST value keeps the table's), then one MERGE on the key:
  deletes, updates (a column the change did not carry keeps the table's value), inserts. An
  update that changed the key takes what it did not carry from the old key's row (read back
  first).
- A table without a key (or with REPLICA IDENTITY FULL: every column a key): inserts are
  appended; when the batch updates or deletes, the rows equal to a changed row's old or new
  values are read, the batch's changes applied to them in order (an update or delete takes
  one row of equal ones), and what remains replaces them in one commit (an overwrite under
  that predicate).
- A TRUNCATE empties the table: what came before it in the batch is moot, and the table is
  overwritten with what the batch puts in after it.

A change that finds no row is not an error here (a MERGE upserts): an update of a missing
key inserts what the change carries, a delete of a missing row does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Field, QueryBuilder, write_deltalake
from deltalake import Transaction as AppTransaction
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.schema import PrimitiveType

from receivewal.apply.source import Columns, Record, Transaction
from receivewal.archive.location import is_bucket_url
from receivewal.errors import ConfigurationError, ReceivewalError

#: Changes in one batch (a transaction bigger than this is a batch of its own).
BATCH_CHANGES = 20_000
#: Rows of a snapshot table per record batch written.
SNAPSHOT_BATCH_ROWS = 8_192
#: A table without a key reads back the rows equal to at most this many changed rows per
#: commit (the predicate names each); a batch is cut at the transaction that would pass it.
KEYLESS_ROWS = 500

Row = dict[str, Any]
Key = tuple[Any, ...]


class DeltaTarget:
    """The Delta tables under one directory or prefix, for one source (a slot's change log)."""

    batch_changes = BATCH_CHANGES

    def __init__(self, where: str, source: str) -> None:
        if not where:
            raise ConfigurationError("--to delta:DIR names no directory")
        self.where = where.rstrip("/") or "/"
        self.bucket = is_bucket_url(where)
        self.app_id = f"receivewal:{source}"
        self.storage: dict[str, str] | None = _storage_options() if self.bucket else None
        self.versions: dict[tuple[str, str], int | None] = {}
        self.consistent_point = 0
        self.commits = 0

    def close(self) -> None:
        """Nothing held open between commits."""

    def begin(self, consistent_point: int) -> int:
        """The LSN the target holds everything through: none in particular (each table
        says for itself, :meth:`version`)."""
        self.consistent_point = consistent_point
        return 0

    def uri(self, schema: str, table: str) -> str:
        for name in (schema, table):
            if "/" in name or name in {"", ".", ".."} or "\\" in name:
                raise ReceivewalError(f"table {schema}.{table}: its name cannot be a Delta "
                                      "table's folder (a slash, a backslash, or . or ..)")
        if self.bucket:
            return f"{self.where}/{schema}/{table}"
        return os.path.join(self.where, schema, table)

    def open(self, schema: str, table: str) -> DeltaTable | None:
        """The table, None when it is not there yet."""
        try:
            return DeltaTable(self.uri(schema, table), storage_options=self.storage)
        except TableNotFoundError:
            return None
        except (DeltaError, OSError) as exc:
            raise _failed(schema, table, exc) from exc

    def version(self, schema: str, table: str) -> int | None:
        """The end LSN through which the table holds the log (None: not there, or never
        written by this source)."""
        name = (schema, table)
        if name not in self.versions:
            opened = self.open(schema, table)
            self.versions[name] = None if opened is None else \
                opened.transaction_version(self.app_id)
        return self.versions[name]

    def holds_table(self, index: int, schema: str, table: str) -> bool:
        """Whether the snapshot's table is in: the table holds any of this source's commits
        (the snapshot's load is its first)."""
        return self.version(schema, table) is not None

    def apply_table(self, index: int, relation: Record, rows: Iterable[Record]) -> int:
        """The snapshot's table (its relation line and row lines), streamed into one commit
        that replaces whatever the folder held, versioned at the consistent point."""
        schema, table = relation["schema"], relation["table"]
        names = [column["name"] for column in relation["columns"]]
        arrow = _schema(names)
        count = [0]

        def batches() -> Iterator[pa.RecordBatch]:
            chunk: list[Row] = []
            for record in rows:
                new = record["new"]
                chunk.append({name: _value(new[name]) for name in names})
                count[0] += 1
                if len(chunk) >= SNAPSHOT_BATCH_ROWS:
                    yield pa.RecordBatch.from_pylist(chunk, schema=arrow)
                    chunk = []
            if chunk:
                yield pa.RecordBatch.from_pylist(chunk, schema=arrow)

        reader = pa.RecordBatchReader.from_batches(arrow, batches())
        self._write(schema, table, reader, self.consistent_point, mode="overwrite",
                    schema_mode="overwrite")
        return count[0]

    def apply_batch(self, batch: list[Transaction]) -> int:
        """The batch's changes, one commit per table it touches (cut where a table without a
        key would read back too many rows); the transactions of which something was
        applied."""
        applied = 0
        pending = _Batch()
        for transaction in batch:
            if pending.last and pending.keyless_rows(transaction) > KEYLESS_ROWS:
                self._commit(pending)
                pending = _Batch()
            taken = False
            for record, columns in transaction.changes:
                taken |= self._take(pending, transaction, record, columns)
            pending.last = transaction.end_lsn
            applied += taken
        if pending.last:
            self._commit(pending)
        return applied

    def _take(self, pending: _Batch, transaction: Transaction, record: Record,
              columns: Columns) -> bool:
        """Fold one change into the batch, unless its table holds it already."""
        if record["op"] == "truncate":
            taken = False
            for schema, table in record["tables"]:
                if self._holds(schema, table, transaction):
                    continue
                pending.table(schema, table, None).truncate()
                taken = True
            return taken
        schema, table = record["schema"], record["table"]
        if self._holds(schema, table, transaction):
            return False
        pending.table(schema, table, columns).add(record)
        return True

    def _holds(self, schema: str, table: str, transaction: Transaction) -> bool:
        version = self.version(schema, table)
        return version is not None and transaction.end_lsn <= version

    def _commit(self, pending: _Batch) -> None:
        for (schema, table), changes in pending.tables.items():
            self._commit_table(schema, table, changes, pending.last)

    def _commit_table(self, schema: str, table: str, changes: _TableChanges,
                      version: int) -> None:
        opened = self.open(schema, table)
        names = changes.names()
        if opened is None and not names:
            return  # a TRUNCATE of a table not there yet: nothing to empty
        if opened is not None:
            names = self._evolve(opened, schema, table, names)
        if opened is None or changes.emptied:
            rows = changes.rows_from_empty()
            self._write(schema, table, pa.Table.from_pylist(rows, schema=_schema(names)),
                        version, mode="overwrite")
        elif changes.keyed:
            self._merge(opened, schema, table, changes, names=names, version=version)
        elif not changes.matched:
            self._write(schema, table, pa.Table.from_pylist(
                [change.new for change in changes.keyless], schema=_schema(names)),
                version, mode="append")
        else:
            predicate = " OR ".join(sorted({_row_predicate(row) for row in changes.matched}))
            rows = changes.rows_over(_rows_where(opened, schema, table, predicate))
            self._write(schema, table, pa.Table.from_pylist(rows, schema=_schema(names)),
                        version, mode="overwrite", predicate=predicate)

    def _evolve(self, opened: DeltaTable, schema: str, table: str,
                names: list[str]) -> list[str]:
        """The table's columns, with those the log names and it lacks added."""
        have = [str(name) for name in pa.schema(opened.schema().to_arrow()).names]
        missing = [name for name in names if name not in have]
        if missing:
            try:
                opened.alter.add_columns([Field(name, PrimitiveType("string"), nullable=True)
                                          for name in missing])
            except (DeltaError, OSError) as exc:
                raise _failed(schema, table, exc) from exc
        return have + missing

    def _merge(self, opened: DeltaTable, schema: str, table: str, changes: _TableChanges, *,
               names: list[str], version: int) -> None:
        keys = changes.key_names
        if changes.carry:
            self._carry_over(opened, schema, table, changes)
        data: dict[str, list[Any]] = {"op": []}
        for index in range(len(names)):
            data[f"c{index}"], data[f"m{index}"] = [], []
        for key, (op, values) in changes.keyed_rows.items():
            row = {**dict(zip(keys, key, strict=True)), **values}
            data["op"].append(op)
            for index, name in enumerate(names):
                data[f"c{index}"].append(row.get(name))
                data[f"m{index}"].append(name in row)
        source = pa.table(data, schema=pa.schema(
            [("op", pa.string())] + [field for index in range(len(names)) for field in
                                     (pa.field(f"c{index}", pa.string()),
                                      pa.field(f"m{index}", pa.bool_()))]))
        column = {name: index for index, name in enumerate(names)}
        on = " AND ".join(f"t.{_quoted(name)} = s.c{column[name]}" for name in keys)
        updates = {_quoted(name): f"CASE WHEN s.m{index} THEN s.c{index} ELSE "
                   f"t.{_quoted(name)} END" for index, name in enumerate(names)
                   if name not in keys}
        inserts = {_quoted(name): f"s.c{index}" for index, name in enumerate(names)}
        try:
            merger = opened.merge(source, on, source_alias="s", target_alias="t",
                                  commit_properties=self._stamp(version))
            merger = merger.when_matched_delete(predicate="s.op = 'd'")
            if updates:
                merger = merger.when_matched_update(updates, predicate="s.op = 'u'")
            merger.when_not_matched_insert(inserts, predicate="s.op = 'u'").execute()
        except (DeltaError, pa.ArrowException, OSError) as exc:
            raise _failed(schema, table, exc) from exc
        self._written(schema, table, version)

    def _carry_over(self, opened: DeltaTable, schema: str, table: str,
                    changes: _TableChanges) -> None:
        """Fill the rows whose key an update changed with the columns it did not carry (an
        unchanged TOAST value), from the row of the key they moved from."""
        keys = changes.key_names
        sources = set(changes.carry.values())
        predicate = " OR ".join(sorted(_row_predicate(dict(zip(keys, key, strict=True)))
                                       for key in sources))
        rows = {tuple(row.get(name) for name in keys): row
                for row in _rows_where(opened, schema, table, predicate)}
        for key, source in changes.carry.items():
            op, values = changes.keyed_rows[key]
            if op == "u" and source in rows:
                changes.keyed_rows[key] = (op, {**rows[source], **values})

    def _write(self, schema: str, table: str, data: pa.Table | pa.RecordBatchReader,
               version: int, **how: Any) -> None:
        try:
            write_deltalake(self.uri(schema, table), data, storage_options=self.storage,
                            commit_properties=self._stamp(version), **how)
        except (DeltaError, pa.ArrowException, OSError) as exc:
            raise _failed(schema, table, exc) from exc
        self._written(schema, table, version)

    def _stamp(self, version: int) -> CommitProperties:
        return CommitProperties(app_transactions=[AppTransaction(self.app_id, version)])

    def _written(self, schema: str, table: str, version: int) -> None:
        self.versions[(schema, table)] = version
        self.commits += 1


@dataclass
class _Change:
    """A change to a table without a key: the row it looks for, and what it leaves."""

    old: Row | None
    new: Row | None


@dataclass
class _TableChanges:
    """What a batch does to one table, folded."""

    columns: Columns
    emptied: bool = False
    keyed_rows: dict[Key, tuple[str, Row]] = field(default_factory=dict)
    #: a key whose row moved from another key the table holds, lacking columns that row has
    carry: dict[Key, Key] = field(default_factory=dict)
    keyless: list[_Change] = field(default_factory=list)
    matched: list[Row] = field(default_factory=list)

    @property
    def key_names(self) -> list[str]:
        keys = [column["name"] for column in self.columns if column.get("key")]
        return [] if len(keys) == len(self.columns) else keys

    @property
    def keyed(self) -> bool:
        return bool(self.key_names)

    def names(self) -> list[str]:
        return [column["name"] for column in self.columns]

    def truncate(self) -> None:
        self.emptied = True
        self.keyed_rows.clear()
        self.carry.clear()
        self.keyless.clear()
        self.matched.clear()

    def add(self, record: Record) -> None:
        op = record["op"]
        new = {name: _value(value) for name, value in (record.get("new") or {}).items()}
        old = {name: _value(value) for name, value in (record.get("old") or {}).items()}
        if self.keyed:
            self._fold(op, old, new)
            return
        if op == "insert":
            self.keyless.append(_Change(None, new))
            if self.matched:
                self.matched.append(new)
            return
        if not self.matched:  # from now on the rows equal to the batch's are read back
            self.matched.extend(change.new for change in self.keyless if change.new)
        self.keyless.append(_Change(old, new if op == "update" else None))
        self.matched.append(old)
        if op == "update":
            self.matched.append(new)

    def _fold(self, op: str, old: Row, new: Row) -> None:
        keys = self.key_names
        key = tuple((new or old).get(name) for name in keys)
        was = tuple(old.get(name) for name in keys) if old else key
        if op == "delete":
            self.keyed_rows.pop(was, None)
            self.keyed_rows[was] = ("d", {})
            self.carry.pop(was, None)
            return
        before = self.keyed_rows.pop(was, None)
        if was != key:  # the key changed: the old key's row is gone, the new one takes its
            self.keyed_rows[was] = ("d", {})  # values (an unchanged TOAST column's too)
            self.keyed_rows.pop(key, None)
        carried = self.carry.pop(was, None)
        self.carry.pop(key, None)
        if op == "insert" or (before is not None and before[0] == "d"):
            values, source = new, None  # a whole row
        elif before is None:  # on top of the table's row of the old key
            values, source = new, (was if was != key else None)
        else:  # on top of what the batch made of it
            values, source = {**before[1], **new}, carried or (was if was != key else None)
        if source is not None and any(name not in values for name in self.names()):
            self.carry[key] = source  # the row it moved from fills in what it lacks
        self.keyed_rows[key] = ("u", values)

    def rows_from_empty(self) -> list[Row]:
        """The rows the table holds after the batch when it starts empty."""
        if self.keyed:
            keys = self.key_names
            return [{**dict(zip(keys, key, strict=True)), **values}
                    for key, (op, values) in self.keyed_rows.items() if op == "u"]
        return self.rows_over([])

    def rows_over(self, rows: list[Row]) -> list[Row]:
        """``rows`` (the table's rows the batch may touch) after the batch's changes."""
        rows = list(rows)
        for change in self.keyless:
            if change.old is None:
                rows.append(dict(change.new or {}))
                continue
            found = next((index for index, row in enumerate(rows) if all(
                row.get(name) == value for name, value in change.old.items())), None)
            if found is None:
                if change.new is not None:
                    rows.append({**change.old, **change.new})
                continue
            if change.new is None:
                del rows[found]
            else:
                rows[found] = {**rows[found], **change.new}
        return rows


@dataclass
class _Batch:
    """The tables a batch touches, in the order first touched; its last transaction's end."""

    tables: dict[tuple[str, str], _TableChanges] = field(default_factory=dict)
    last: int = 0

    def table(self, schema: str, table: str, columns: Columns | None) -> _TableChanges:
        changes = self.tables.get((schema, table))
        if changes is None:
            changes = self.tables[(schema, table)] = _TableChanges(columns or [])
        elif columns is not None:
            changes.columns = columns  # a column added since: the latest relation line
        return changes

    def keyless_rows(self, transaction: Transaction) -> int:
        """The rows a table without a key reads back, with ``transaction`` in the batch
        (counted roughly: every row a change of it names)."""
        touched = sum(len(changes.matched) for changes in self.tables.values())
        return touched + sum(2 for record, columns in transaction.changes
                             if record["op"] in ("update", "delete"))


def _schema(names: list[str]) -> pa.Schema:
    return pa.schema([pa.field(name, pa.string()) for name in names])


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _rows_where(opened: DeltaTable, schema: str, table: str,
                predicate: str) -> list[dict[str, Any]]:
    """The rows of ``opened`` that ``predicate`` (names and values quoted) selects, read back."""
    try:
        held = QueryBuilder().register("t", opened).execute(
            f"SELECT * FROM t WHERE {predicate}"  # noqa: S608 - names and values quoted
        ).read_all()
    except (DeltaError, OSError) as exc:
        raise _failed(schema, table, exc) from exc
    rows: list[dict[str, Any]] = pa.table(held).to_pylist()
    return rows


def _row_predicate(row: Row) -> str:
    """SQL that holds for the rows equal to ``row`` (NULL equal to NULL)."""
    return "(" + " AND ".join(  # each in parentheses: IS NOT DISTINCT FROM binds loosely
        f"({_quoted(name)} IS NOT DISTINCT FROM "
        f"{'NULL' if value is None else _literal(value)})"
        for name, value in sorted(row.items())) + ")"


def _value(value: object) -> str | None:
    if isinstance(value, dict):
        raise ReceivewalError("a value kept as bytes (binary_b64 or internal_b64: a type "
                              "--binary does not convert) cannot be applied")
    return None if value is None else str(value)


def _storage_options() -> dict[str, str]:
    """What delta-rs needs for a bucket beyond the standard AWS environment it reads
    itself: plain http for an endpoint that is (a test's, an on-premises store's)."""
    options = {}
    if os.environ.get("AWS_ENDPOINT_URL", "").startswith("http:"):
        options["AWS_ALLOW_HTTP"] = "true"
    return options


def _failed(schema: str, table: str, exc: Exception) -> ReceivewalError:
    text = " ".join(str(exc).split())[:500]
    return ReceivewalError(f"Delta table {schema}.{table}: {text}")
