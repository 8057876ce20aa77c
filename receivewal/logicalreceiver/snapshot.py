"""``logical --create-slot --snapshot``: a new slot and its tables as of its consistent point.

The slot is created exporting its snapshot (``CREATE_REPLICATION_SLOT ... (SNAPSHOT
'export')``); while the replication connection holds it (it runs no other command), a second,
plain connection to the same database with the same credentials
(:meth:`~receivewal.replication.connection.ReplicationConnection.sql_session`) opens a
read-only repeatable-read transaction in that snapshot (``SET TRANSACTION SNAPSHOT``) and
copies every table of the publications (``COPY (SELECT ...) TO STDOUT``, the publication's
column list and row filters applied, as pgoutput applies them to the changes) into
``OUTDIR/snapshot/`` (:mod:`receivewal.logical.snapshot`), row by row in bounded memory. The
slot's first change comes after the consistent point, so the snapshot and the change log
together hold every row exactly once.

Nothing runs over a change log that has begun: OUTDIR must hold no change file and no
snapshot. A run killed before the end leaves ``snapshot.partial/`` naming the slot it created;
the next run with the same slot drops that slot (its snapshot can never be had again) and
takes everything anew.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from receivewal.archive.directory import Archive
from receivewal.daemon.events import Event, Listener
from receivewal.daemon.lifecycle import SlotCreating, SlotDropping
from receivewal.errors import ArchiveError, ConfigurationError, ServerError, StopRequested
from receivewal.logical.snapshot import (
    SnapshotColumn,
    SnapshotTable,
    SnapshotWriter,
    decode_copy_row,
    read_manifest,
    unfinished_snapshot,
)
from receivewal.logical.store import change_log_contents
from receivewal.logicalreceiver.logicalsettings import LogicalSettings
from receivewal.replication.commands import (
    ExportedSnapshot,
    create_exporting_slot,
    drop_slot,
    quote_identifier,
    quote_literal,
)
from receivewal.replication.link import COPY_DONE, ReplicationLink, SessionLink, SqlLink
from receivewal.wal.lsn import format_lsn

#: The snapshot's session, as the change log's connection has it (docs/changelog.md): the
#: same text for the same value in the snapshot and in the log.
_SESSION = (("client_encoding", "UTF8"), ("TimeZone", "UTC"), ("DateStyle", "ISO"),
            ("extra_float_digits", "1"), ("bytea_output", "hex"))


@dataclass(frozen=True, slots=True)
class SnapshotTableCopied(Event):
    """--snapshot: one table copied in the slot's snapshot."""

    name = "snapshot_table_copied"
    table: str
    rows: int


@dataclass(frozen=True, slots=True)
class SnapshotTaken(Event):
    """--snapshot: every table copied; the change log begins at ``consistent_point``."""

    name = "snapshot_taken"
    slot: str
    tables: int
    rows: int
    consistent_point: str


def take_snapshot(conn: SessionLink, settings: LogicalSettings, events: Listener) -> None:
    """Create the slot exporting its snapshot and copy the published tables into OUTDIR.
    Raises ReceivewalError; the slot created here is dropped again when the copy fails."""
    base = settings.base
    slot = base.slot
    assert slot is not None
    assert base.directory is not None
    outdir = Path(base.directory)
    directory = Archive(outdir, sync=base.sync)
    directory.lock()
    try:
        directory.check_usable()
        _check_outdir(outdir, conn, slot, events)
        writer = SnapshotWriter(outdir, compression=settings.files_compression,
                                recipients=base.encrypt_to, mode=directory.file_mode,
                                sync=base.sync)
        writer.begin(slot)
        events(SlotCreating(slot, False))
        try:
            exported = create_exporting_slot(conn, slot, settings.plugin,
                                             two_phase=settings.two_phase)
        except BaseException:
            writer.abandon()
            raise
        try:
            _copy_tables(conn, settings, writer, exported, events)
        except BaseException:
            # the snapshot is gone with the copy's transaction: the slot cannot be used for a
            # log that needs it; drop it now unless the connection is gone (the next run does)
            try:
                drop_slot(conn, slot)
                writer.abandon()
            except (ServerError, StopRequested, OSError):
                pass
            raise
    finally:
        directory.unlock()


def _check_outdir(outdir: Path, conn: ReplicationLink, slot: str, events: Listener) -> None:
    """OUTDIR holds no change log yet (an unfinished snapshot of this slot's: its slot is
    dropped, to be created again)."""
    contents = change_log_contents(outdir)
    if contents.files or contents.partial:
        raise ArchiveError(f"{outdir} holds a change log already: a snapshot is taken only "
                           "into an empty directory, with a new slot")
    manifest = read_manifest(outdir)
    if manifest is not None:
        raise ArchiveError(f"{outdir} holds a snapshot already (slot \"{manifest.slot}\" at "
                           f"{format_lsn(manifest.consistent_point)})")
    owner = unfinished_snapshot(outdir)
    if owner is None:
        return
    if owner != slot:
        raise ArchiveError(f"{outdir} holds an unfinished snapshot for slot \"{owner}\": "
                           f"drop that slot (--drop-slot -S {owner}) and remove "
                           f"{outdir}/snapshot.partial, or take it again with -S {owner}")
    # the slot the killed run created (if it got that far): its snapshot is lost with it.
    # Its walsender may not have noticed the kill yet: WAIT until it lets the slot go.
    events(SlotDropping(slot))
    try:
        conn.query(f"DROP_REPLICATION_SLOT {quote_identifier(slot)} WAIT")
    except ServerError as exc:
        if exc.sqlstate != "42704":  # undefined_object: never created
            raise


def _copy_tables(conn: SessionLink, settings: LogicalSettings, writer: SnapshotWriter,
                 exported: ExportedSnapshot, events: Listener) -> None:
    """The copy itself, on a second connection in the exported snapshot."""
    snapshot, consistent_point = exported.name, exported.consistent_point
    sql = conn.sql_session()
    try:
        sql.query("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        sql.query(f"SET TRANSACTION SNAPSHOT {quote_literal(snapshot)}")
        for name, value in _SESSION:
            sql.query(f"SET LOCAL {name} = {quote_literal(value)}")
        tables = published_tables(sql, settings.publications)
        header = {"slot": settings.base.slot, "snapshot": snapshot,
                  "consistent_point": format_lsn(consistent_point)}
        total = 0
        for table in tables:
            rows = writer.write_table(table, header, copied_rows(sql, table))
            total += rows
            events(SnapshotTableCopied(table.name, rows))
        sql.query("COMMIT")
    finally:
        sql.close()
    assert settings.base.slot is not None
    taken_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    writer.finish(settings.base.slot, snapshot, consistent_point, taken_at)
    events(SnapshotTaken(settings.base.slot, len(tables), total,
                         format_lsn(consistent_point)))


def published_tables(sql: SqlLink, publications: tuple[str, ...]
                     ) -> list[SnapshotTable]:
    """The tables the publications send, in name order, each with the columns they send
    (a column list applied; generated columns left out, as pgoutput leaves them) and the
    union of their row filters (None: every row). ConfigurationError when a publication
    does not exist."""
    names = ", ".join(quote_literal(name) for name in publications)
    known = {row[0] for row in sql.query(
        f"SELECT pubname FROM pg_catalog.pg_publication WHERE pubname IN ({names})")}  # noqa: S608
    missing = [name for name in publications if name not in known]
    if missing:
        raise ConfigurationError(f'publication "{missing[0]}" does not exist')
    rows = sql.query(
        "SELECT pt.schemaname, pt.tablename, c.oid, pt.rowfilter "  # noqa: S608 - literals
        "FROM pg_catalog.pg_publication_tables pt "
        "JOIN pg_catalog.pg_namespace n ON n.nspname = pt.schemaname "
        "JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename "
        f"WHERE pt.pubname IN ({names}) ORDER BY pt.schemaname, pt.tablename")
    filters: dict[tuple[str, str, str], list[str | None]] = {}
    for schema, table, oid, row_filter in rows:
        assert schema is not None
        assert table is not None
        assert oid is not None
        filters.setdefault((schema, table, oid), []).append(row_filter)
    tables = []
    for (schema, table, oid), found in filters.items():
        row_filter = None if any(f is None for f in found) else \
            " OR ".join(f"({f})" for f in dict.fromkeys(found))
        tables.append(SnapshotTable(schema, table, _columns(sql, oid, schema, table, names),
                                    row_filter))
    return tables


def _columns(sql: SqlLink, oid: str, schema: str, table: str,
             publications: str) -> tuple[SnapshotColumn, ...]:
    """The columns of table ``oid`` the publications send, as a relation line names them:
    the type by name (``schema.name`` outside pg_catalog), ``key`` the replica identity's."""
    rows = sql.query(
        "SELECT a.attname, CASE WHEN t.oid < 10000 OR tn.nspname = 'pg_catalog' "  # noqa: S608
        "THEN t.typname::text ELSE tn.nspname || '.' || t.typname END, "
        "c.relreplident = 'f' OR coalesce(a.attnum = ANY(i.indkey), false) "
        "FROM pg_catalog.pg_attribute a "
        "JOIN pg_catalog.pg_class c ON c.oid = a.attrelid "
        "JOIN pg_catalog.pg_type t ON t.oid = a.atttypid "
        "JOIN pg_catalog.pg_namespace tn ON tn.oid = t.typnamespace "
        "LEFT JOIN pg_catalog.pg_index i ON i.indrelid = c.oid AND ("
        "(c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident)) "
        f"WHERE a.attrelid = {int(oid)} AND a.attnum > 0 AND NOT a.attisdropped "
        "AND a.attgenerated = '' AND EXISTS (SELECT 1 FROM pg_catalog.pg_publication_tables pt "
        f"WHERE pt.pubname IN ({publications}) AND pt.schemaname = {quote_literal(schema)} "
        f"AND pt.tablename = {quote_literal(table)} AND a.attname = ANY(pt.attnames)) "
        "ORDER BY a.attnum")
    return tuple(SnapshotColumn(str(name), type_name, key == "t")
                 for name, type_name, key in rows)


def copied_rows(sql: SqlLink, table: SnapshotTable) -> Iterator[list[str | None]]:
    """The table's rows in the transaction's snapshot, one at a time (COPY ... TO STDOUT)."""
    columns = ", ".join(quote_identifier(column.name) for column in table.columns)
    query = (f"COPY (SELECT {columns} FROM {quote_identifier(table.schema)}."  # noqa: S608
             f"{quote_identifier(table.table)}"
             + (f" WHERE {table.row_filter}" if table.row_filter else "") + ") TO STDOUT")
    sql.start_copy_out(query)  # identifiers quoted; the filter is the publication's own SQL
    while True:
        payload = sql.read_copy(1.0)
        if payload is COPY_DONE:
            break
        if payload is None:
            if sql.stopping:
                raise StopRequested(f"stopped while copying table {table.name}")
            continue  # nothing yet
        yield decode_copy_row(bytes(payload)) if table.columns else []
    while sql.next_result() is not None:
        pass
