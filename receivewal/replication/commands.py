"""Replication commands: IDENTIFY_SYSTEM, SHOW, the slot commands, TIMELINE_HISTORY, and the
result set that ends a timeline, over any
:class:`~receivewal.replication.link.ReplicationLink`.

Each function sends one command (or reads one result), checks the answer the way
pg_receivewal does, and raises ServerError / ProtocolError with its words. The session calls
them; it never builds a command string itself except START_REPLICATION.

The logical slot's commands are built as text by pure functions
(:func:`create_logical_slot_command`, :func:`start_logical_replication_command`): names
are double-quoted identifiers and option values string literals, escaped as the walsender's
scanner reads them (a doubled quote; a backslash is an ordinary character there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from receivewal.errors import ConfigurationError, ConnectionLost, ProtocolError, ServerError
from receivewal.replication.link import ReplicationLink, Result, ResultStatus
from receivewal.wal.lsn import check_segment_size, format_lsn, parse_lsn
from receivewal.wal.names import history_file_name, parse_history_file_name
from receivewal.wal.timeline import parse_history

_UNITS = {"B": 1, "kB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}


@dataclass(frozen=True)
class ServerInfo:
    """What IDENTIFY_SYSTEM and a few SHOW commands told us about the server."""

    system_identifier: str
    timeline: int
    xlogpos: int
    segment_size: int
    file_mode: int
    version: int


def parse_size(text: str) -> int:
    """Parse a size as SHOW prints it ("16MB", "1GB") into bytes."""
    number = text.rstrip("kMGTB")
    unit = text[len(number):] or "B"
    if not number.isdigit() or unit not in _UNITS:
        raise ServerError(f"could not parse WAL segment size {text!r}")
    return int(number) * _UNITS[unit]


def _identify_system(conn: ReplicationLink) -> tuple[str | None, ...]:
    """IDENTIFY_SYSTEM's one row: systemid, timeline, xlogpos, dbname (any may be NULL)."""
    rows = conn.query("IDENTIFY_SYSTEM")
    if len(rows) != 1 or len(rows[0]) < 4:
        raise ServerError(f"could not identify system: got {len(rows)} rows, expected 1 row "
                          "with 4 or more fields")
    return tuple(rows[0][:4])


def identify_server(conn: ReplicationLink) -> ServerInfo:
    """IDENTIFY_SYSTEM plus the settings the archive depends on."""
    sysid, tli, xlogpos, dbname = _identify_system(conn)
    if dbname is not None:
        raise ServerError("replication connection is unexpectedly database specific "
                          f'(database "{dbname}"): physical streaming needs replication=true')
    if sysid is None or tli is None or xlogpos is None:
        raise ServerError("could not identify system: IDENTIFY_SYSTEM returned NULLs")
    segsize_text = conn.query("SHOW wal_segment_size")[0][0] or ""
    try:
        segment_size = check_segment_size(parse_size(segsize_text))
    except ConfigurationError as exc:
        raise ServerError(f"server reports an unusable WAL segment size: {exc}") from exc
    mode_text = conn.query("SHOW data_directory_mode")[0][0] or "0700"
    group_readable = int(mode_text, 8) & 0o040
    return ServerInfo(sysid, int(tli), parse_lsn(xlogpos), segment_size,
                      0o640 if group_readable else 0o600, conn.server_version)


@dataclass(frozen=True)
class DatabaseInfo:
    """What IDENTIFY_SYSTEM told a logical replication connection (replication=database)."""

    system_identifier: str
    timeline: int
    xlogpos: int
    database: str
    version: int


def identify_database(conn: ReplicationLink) -> DatabaseInfo:
    """IDENTIFY_SYSTEM on a database connection: the database must be named."""
    sysid, tli, xlogpos, dbname = _identify_system(conn)
    if sysid is None or tli is None or xlogpos is None:
        raise ServerError("could not identify system: IDENTIFY_SYSTEM returned NULLs")
    if dbname is None:
        raise ConfigurationError("a logical slot needs a database connection: the connection "
                                 "is not database specific (name the database with dbname=)")
    return DatabaseInfo(sysid, int(tli), parse_lsn(xlogpos), dbname, conn.server_version)


@dataclass(frozen=True)
class LogicalSlot:
    """A logical slot as pg_replication_slots shows it."""

    plugin: str
    database: str
    wal_status: str | None  # reserved, extended, unreserved, lost (None: not reserved yet)
    confirmed_flush: int | None = None  # confirmed_flush_lsn (None: not set yet)


def read_logical_slot(conn: ReplicationLink, slot: str) -> LogicalSlot:
    """The logical slot ``slot``, with the position the server was last told is flushed
    (``confirmed_flush_lsn``); ConfigurationError when it does not exist, is physical, or
    was invalidated (its WAL removed: it can never stream again)."""
    rows = conn.query("SELECT slot_type, plugin, database, wal_status, "  # noqa: S608 - a
                      "confirmed_flush_lsn FROM pg_catalog.pg_replication_slots "  # quoted
                      "WHERE slot_name = " + quote_literal(slot))  # literal
    if not rows:
        raise ConfigurationError(f'replication slot "{slot}" does not exist (create it with '
                                 "--create-slot)")
    slot_type, plugin, database, wal_status, confirmed = rows[0][:5]
    if slot_type != "logical" or plugin is None or database is None:
        raise ConfigurationError(f'replication slot "{slot}" is a {slot_type} slot, not logical')
    if wal_status == "lost":
        raise ConfigurationError(f'replication slot "{slot}" is invalidated: the server removed '
                                 "WAL it needs (wal_status lost); drop it and create it again")
    return LogicalSlot(plugin, database, wal_status,
                       None if confirmed is None else parse_lsn(confirmed))


def create_logical_slot(conn: ReplicationLink, slot: str, plugin: str, *, two_phase: bool,
                        if_not_exists: bool) -> bool:
    """CREATE_REPLICATION_SLOT ... LOGICAL; False when it existed and that was allowed."""
    return _create_slot(conn, create_logical_slot_command(
        slot, plugin, two_phase=two_phase, server_version=conn.server_version), if_not_exists)


@dataclass(frozen=True)
class ExportedSnapshot:
    """A logical slot just created with its snapshot exported: the slot's consistent point
    (its first change comes after it) and the snapshot's name (SET TRANSACTION SNAPSHOT)."""

    slot: str
    consistent_point: int
    name: str


def create_exporting_slot(conn: ReplicationLink, slot: str, plugin: str, *,
                          two_phase: bool) -> ExportedSnapshot:
    """CREATE_REPLICATION_SLOT ... LOGICAL exporting its snapshot: the snapshot stays
    usable by other sessions until ``conn`` runs another command or ends."""
    rows = conn.query(create_logical_slot_command(slot, plugin, two_phase=two_phase,
                                                  server_version=conn.server_version,
                                                  export=True))
    if len(rows) != 1 or len(rows[0]) < 3 or rows[0][1] is None or rows[0][2] is None:
        raise ServerError("unexpected response to CREATE_REPLICATION_SLOT: no exported "
                          "snapshot")
    return ExportedSnapshot(slot, parse_lsn(rows[0][1]), rows[0][2])


def read_slot(conn: ReplicationLink, slot: str) -> tuple[int, int] | None:
    """The slot's (restart_lsn, timeline), or None when it has not reserved WAL yet.

    Raises ServerError when the slot does not exist or is not physical.
    """
    rows = conn.query(f"READ_REPLICATION_SLOT {slot}")
    if not rows or rows[0][0] is None:
        raise ServerError(f'replication slot "{slot}" does not exist')
    slot_type, restart_lsn, restart_tli = rows[0][:3]
    if slot_type != "physical":
        raise ServerError(f'replication slot "{slot}" is a {slot_type} slot, not physical')
    if restart_lsn is None or restart_tli is None:
        return None
    return parse_lsn(restart_lsn), int(restart_tli)


def slot_exists(conn: ReplicationLink, slot: str) -> bool:
    """Whether READ_REPLICATION_SLOT finds the slot (of any type)."""
    rows = conn.query(f"READ_REPLICATION_SLOT {slot}")
    return bool(rows) and rows[0][0] is not None


def create_slot(conn: ReplicationLink, slot: str, *, reserve_wal: bool,
                if_not_exists: bool) -> bool:
    """CREATE_REPLICATION_SLOT ... PHYSICAL; False when it existed and that was allowed."""
    command = f"CREATE_REPLICATION_SLOT {slot} PHYSICAL" + (" RESERVE_WAL" if reserve_wal else "")
    return _create_slot(conn, command, if_not_exists)


def _create_slot(conn: ReplicationLink, command: str, if_not_exists: bool) -> bool:
    """Run a CREATE_REPLICATION_SLOT ``command``; False when the slot existed and
    ``if_not_exists`` allows that."""
    try:
        conn.query(command)
    except ServerError as exc:
        if if_not_exists and exc.sqlstate == "42710":  # duplicate_object
            return False
        raise
    return True


def quote_identifier(name: str) -> str:
    """``name`` as a double-quoted identifier (its case kept, ``"`` doubled)."""
    if not name or "\0" in name:
        raise ConfigurationError(f"invalid name {name!r}")
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    """``value`` as a string literal of the replication grammar (``'`` doubled)."""
    if "\0" in value:
        raise ConfigurationError(f"invalid value {value!r}: it holds a zero byte")
    return "'" + value.replace("'", "''") + "'"


def create_logical_slot_command(slot: str, plugin: str, *, two_phase: bool,
                                server_version: int, export: bool = False) -> str:
    """CREATE_REPLICATION_SLOT ... LOGICAL for ``plugin``, exporting no snapshot (with
    ``export``, its snapshot, for as long as the connection runs no other command), with
    two-phase decoding when asked (PostgreSQL 15 and later: the option list syntax;
    before 15 the old keywords, and no two-phase)."""
    head = f"CREATE_REPLICATION_SLOT {quote_identifier(slot)} LOGICAL {quote_identifier(plugin)}"
    snapshot = "export" if export else "nothing"
    if server_version >= 150000:
        return head + f" (SNAPSHOT '{snapshot}'" + (", TWO_PHASE)" if two_phase else ")")
    if two_phase:
        raise ConfigurationError("a two-phase slot needs PostgreSQL 15 or later (the server "
                                 f"is {server_version // 10000})")
    return head + (" EXPORT_SNAPSHOT" if export else " NOEXPORT_SNAPSHOT")


def start_logical_replication_command(slot: str, lsn: int,
                                      options: Sequence[tuple[str, str | None]]) -> str:
    """START_REPLICATION SLOT ... LOGICAL at ``lsn`` with the plugin's options (a value of
    None sends the option's name alone)."""
    command = f"START_REPLICATION SLOT {quote_identifier(slot)} LOGICAL {format_lsn(lsn)}"
    if not options:
        return command
    listed = ", ".join(quote_identifier(name) if value is None
                       else f"{quote_identifier(name)} {quote_literal(value)}"
                       for name, value in options)
    return f"{command} ({listed})"


def drop_slot(conn: ReplicationLink, slot: str) -> None:
    """DROP_REPLICATION_SLOT."""
    conn.query(f"DROP_REPLICATION_SLOT {slot}")


def timeline_history(conn: ReplicationLink, timeline: int) -> tuple[str, str]:
    """TIMELINE_HISTORY: the history file's (name, content), both checked."""
    name = history_file_name(timeline)
    rows = conn.query(f"TIMELINE_HISTORY {timeline}")
    if len(rows) != 1 or len(rows[0]) != 2:
        raise ServerError(f"unexpected response to TIMELINE_HISTORY {timeline}")
    server_name, content = rows[0]
    if content is None or server_name is None or server_name != name \
            or parse_history_file_name(server_name) != timeline:
        raise ServerError(f'server reported unexpected history file name "{server_name}" '
                          f"for timeline {timeline}")
    parse_history(content, timeline)  # refuse to store garbage
    return name, content


def read_timeline_end(conn: ReplicationLink, timeline: int, position: int) -> tuple[int, int]:
    """After the server's CopyDone: the (next timeline, its start LSN) it reports.

    ``position`` is where the received WAL of ``timeline`` ends. Raises ConnectionLost when
    the server ended the stream without a next timeline (a shutdown).
    """
    result = conn.next_result()
    if result is not None and result.status in (ResultStatus.COPY_IN, ResultStatus.COPY_BOTH):
        conn.end_copy()
        result = conn.next_result()
    if result is None or result.status == ResultStatus.COMMAND_OK:
        raise ConnectionLost("replication stream was terminated by the server at "
                             f"{format_lsn(position)} (server shut down?)")
    next_tli, next_start = _next_timeline(result)
    if next_tli <= timeline:
        raise ProtocolError(f"server reported unexpected next timeline {next_tli}, "
                            f"following timeline {timeline}")
    if next_start > position:
        raise ProtocolError(
            f"server stopped streaming timeline {timeline} at {format_lsn(position)}, but "
            f"reported next timeline {next_tli} to begin at {format_lsn(next_start)}"
        )
    final = conn.next_result()
    if final is None or final.status != ResultStatus.COMMAND_OK:
        raise ProtocolError("unexpected termination of replication stream after the end "
                            "of a timeline")
    while conn.next_result() is not None:
        pass
    return next_tli, next_start


def _next_timeline(result: Result) -> tuple[int, int]:
    if result.status != ResultStatus.TUPLES_OK or len(result.rows) != 1 or \
            len(result.rows[0]) < 2:
        raise ProtocolError("unexpected result set after end of timeline")
    next_tli_text, next_start_text = result.rows[0][:2]
    if next_tli_text is None or next_start_text is None:
        raise ProtocolError("unexpected result set after end of timeline: NULL values")
    return int(next_tli_text), parse_lsn(next_start_text)
