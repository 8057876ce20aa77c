"""pglogical_output's native protocol, decoded from CopyData payloads (pure).

The plugin Debian's ``postgresql-15-pglogical`` ships (pglogical 2.4) sends, after the client's
START_REPLICATION parameters (:func:`startup_parameters`), a Startup message ``S`` with
the settings it chose, and then transactions: Begin ``B``, an Origin ``O`` when the
transaction came from another node, a relation's metadata ``R`` before the first row of it in
the session, Insert ``I``, Update ``U``, Delete ``D`` and Commit ``C``. Every message but
Startup starts with a flags byte that must be zero ("reserved, the client must ERROR if set").
Names are counted strings whose count includes their zero byte; a text value ends with a zero
byte too. The relation metadata carries no column types (the startup parameter ``coltypes`` is
false), so binary values cannot be turned into text here.

Values come as text unless binary transfer was asked for and granted (the Startup message's
``binary.binary_basetypes`` or ``binary.internal_basetypes`` say ``t``); a binary or internal
value the Startup message did not grant is an error, as is any message before the Startup
message, an unknown type, kind or action byte, a message that ends early or has bytes left.
TRUNCATE is not a message of this protocol: pglogical queues it in its own table, whose rows
arrive as ordinary inserts.
"""

from __future__ import annotations

from collections.abc import Callable

from receivewal.errors import ProtocolError
from receivewal.logical import outputmessages as m
from receivewal.logical.cursor import MessageReader
from receivewal.wal.lsn import format_lsn

PROTOCOL_VERSION = "1"  # the only native protocol version pglogical_output speaks
STARTUP_FORMAT = 1  # the Startup message's own version
_KEY_COLUMN = 1  # a column's flag: part of the replica identity


def startup_parameters(replication_sets: list[str], *, binary: bool = False,
                       forward_origins: bool = False, server_version: int | None = None,
                       ) -> list[tuple[str, str]]:
    """The START_REPLICATION options that ask pglogical_output for its native protocol in
    UTF-8 with the given replication sets. ``forward_origins`` asks for transactions that
    came from other nodes too (with an Origin message); ``binary`` asks for the types'
    send/receive format, which the plugin grants only to a client that names the server's
    major version as PG_VERSION_NUM / 100 does (1500 for ``server_version`` 150018)."""
    options = [("startup_params_format", "1"),
               ("min_proto_version", PROTOCOL_VERSION), ("max_proto_version", PROTOCOL_VERSION),
               ("proto_format", "native"), ("expected_encoding", "UTF8"),
               ("pglogical.replication_set_names", ",".join(replication_sets))]
    if forward_origins:
        options.append(("pglogical.forward_origins", "all"))
    if binary:
        if server_version is None:
            raise ValueError("binary transfer needs the server's version")
        options += [("binary.want_binary_basetypes", "1"),
                    ("binary.basetypes_major_version", str(server_version // 100))]
    return options


class PglogicalDecoder:
    """Decodes the pglogical_output messages of one replication connection, in order."""

    def __init__(self) -> None:
        self.startup: m.Startup | None = None
        self._kinds = "nut"  # the value kinds allowed: binary ones once granted

    def decode(self, lsn: int, payload: bytes | memoryview) -> m.LogicalMessage:
        """The message in ``payload``, sent at ``lsn``; ProtocolError naming the LSN for
        anything not exactly right."""
        data = bytes(payload)
        if not data:
            raise ProtocolError(f"pglogical_output message at {format_lsn(lsn)}: empty message")
        entry = _MESSAGES.get(data[0])
        if entry is None:
            raise ProtocolError(f"pglogical_output message at {format_lsn(lsn)}: unknown "
                                f"message type 0x{data[0]:02x}")
        name, read = entry
        reader = MessageReader(data, lsn, f"pglogical_output {name}", start=1)
        if (self.startup is None) != (name == "Startup"):
            raise reader.error("the Startup message must come first, and only once")
        message = read(self, reader)
        reader.end()
        return message

    def _startup(self, r: MessageReader) -> m.Startup:
        version = r.byte("startup message version")
        if version != STARTUP_FORMAT:
            raise r.error(f"startup message version {version}, not {STARTUP_FORMAT}")
        pairs = []
        while r.remaining:
            key = r.cstring("parameter name")
            pairs.append((key, r.cstring(f"value of {key}")))
        startup = m.Startup(version, tuple(pairs))
        for bound in ("min_proto_version", "max_proto_version"):
            if startup.get(bound) != PROTOCOL_VERSION:
                raise r.error(f"{bound} is {startup.get(bound)!r}, not {PROTOCOL_VERSION!r}")
        if startup.get("coltypes") == "t":
            raise r.error("coltypes is on: column types are not part of protocol version 1")
        self._kinds = "nut" + "b" * (startup.get("binary.binary_basetypes") == "t") \
            + "i" * (startup.get("binary.internal_basetypes") == "t")
        self.startup = startup
        return startup

    def _begin(self, r: MessageReader) -> m.Begin:
        r.no_flags()
        return m.Begin(r.u64("final LSN"), r.i64("commit timestamp"), r.u32("transaction id"))

    def _commit(self, r: MessageReader) -> m.Commit:
        r.no_flags()
        return m.Commit(r.u64("commit LSN"), r.u64("end LSN"), r.i64("commit timestamp"))

    def _origin(self, r: MessageReader) -> m.Origin:
        r.no_flags()
        origin_lsn = r.u64("origin LSN")
        return m.Origin(origin_lsn, r.counted_cstring(r.byte("origin name length"),
                                                      "origin name"))

    def _relation(self, r: MessageReader) -> m.Relation:
        r.no_flags()
        relation_id = r.u32("relation id")
        namespace = r.counted_cstring(r.byte("namespace length"), "namespace")
        name = r.counted_cstring(r.byte("relation name length"), "relation name")
        r.expect("A", "attributes block")
        columns = []
        for number in range(1, r.u16("attribute count") + 1):
            r.expect("C", f"column {number} block")
            flags = r.byte(f"column {number} flags")
            if flags & ~_KEY_COLUMN:
                raise r.error(f"unknown flags {flags:#x} on column {number}")
            r.expect("N", f"column {number} name block")
            column = r.counted_cstring(r.u16(f"column {number} name length"),
                                       f"column {number} name")
            columns.append(m.RelationColumn(bool(flags), column, None, None))
        return m.Relation(None, relation_id, namespace, name, None, tuple(columns))

    def _insert(self, r: MessageReader) -> m.Insert:
        r.no_flags()
        relation_id = r.u32("relation id")
        r.expect("N", "new tuple")
        return m.Insert(None, relation_id, self._tuple(r))

    def _update(self, r: MessageReader) -> m.Update:
        r.no_flags()
        relation_id = r.u32("relation id")
        return m.Update(None, relation_id, *r.update_tuples(self._tuple))

    def _delete(self, r: MessageReader) -> m.Delete:
        r.no_flags()
        relation_id = r.u32("relation id")
        return m.Delete(None, relation_id, *r.delete_tuple(self._tuple))

    def _tuple(self, r: MessageReader) -> m.TupleData:
        r.expect("T", "tuple block")
        kinds: list[str] = []
        values: list[bytes | None] = []
        for number in range(1, r.u16("tuple column count") + 1):
            kind = r.char(f"column {number} kind")
            if kind not in self._kinds:
                granted = "not granted by the Startup message" if kind in "bi" else "unknown"
                raise r.error(f"column {number} has kind {kind!r}, {granted}")
            value: bytes | None = None
            if kind in "tbi":
                length = r.i32(f"column {number} length")
                if length < 0:
                    raise r.error(f"column {number} has a negative length {length}")
                value = r.raw(length, f"column {number} value")
                if kind == "t":
                    if not value or value[-1] != 0:
                        raise r.error(f"column {number}'s text does not end with a zero byte")
                    value = value[:-1]
            kinds.append(kind)
            values.append(value)
        return m.TupleData("".join(kinds), tuple(values))


_MESSAGES: dict[int, tuple[str, Callable[[PglogicalDecoder, MessageReader],
                                          m.LogicalMessage]]] = {
    ord("S"): ("Startup", PglogicalDecoder._startup),
    ord("B"): ("Begin", PglogicalDecoder._begin),
    ord("C"): ("Commit", PglogicalDecoder._commit),
    ord("O"): ("Origin", PglogicalDecoder._origin),
    ord("R"): ("Relation", PglogicalDecoder._relation),
    ord("I"): ("Insert", PglogicalDecoder._insert),
    ord("U"): ("Update", PglogicalDecoder._update),
    ord("D"): ("Delete", PglogicalDecoder._delete),
}
