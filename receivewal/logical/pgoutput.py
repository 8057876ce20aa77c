"""pgoutput's messages, protocol versions 1 to 4, decoded from CopyData payloads (pure).

:class:`PgoutputDecoder` reads one message per call, as PostgreSQL's ``logicalrep_read_*``
functions read them, with what the client and the server agreed in START_REPLICATION
(:class:`PgoutputOptions`): a message or a field that agreement does not allow is an error,
as is an unknown message type, a message that ends early or has bytes left over, an unknown
flag, kind or action byte. The decoder keeps one piece of state, whether a stream block
(StreamStart .. StreamStop) is open: inside one, every change, Relation, Type and Message
carries the id of the (sub)transaction it belongs to. Whether transactions begin and end in
order, and which relations were announced, is :mod:`receivewal.logical.assembly`'s business.

Version by version (PostgreSQL's "Logical Streaming Replication Protocol"):

- 1 (PostgreSQL 10): Begin ``B``, Commit ``C``, Origin ``O``, Relation ``R``, Type ``Y``,
  Insert ``I``, Update ``U``, Delete ``D``, Truncate ``T`` (11), and Message ``M`` when the
  ``messages`` option is on (14); tuple values ``n``, ``u``, ``t``, and ``b`` with ``binary``.
- 2 (14), with ``streaming``: Stream Start ``S``, Stop ``E``, Commit ``c``, Abort ``A``.
- 3 (15), with ``two_phase``: Begin Prepare ``b``, Prepare ``P``, Commit Prepared ``K``,
  Rollback Prepared ``r``, and Stream Prepare ``p`` when streaming too.
- 4 (16), with ``streaming = parallel``: Stream Abort carries the abort's LSN and time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from receivewal.errors import ConfigurationError, ProtocolError
from receivewal.logical import outputmessages as m
from receivewal.logical.cursor import MessageReader
from receivewal.replication.commands import quote_identifier
from receivewal.wal.lsn import format_lsn

STREAMING_MODES = ("off", "on", "parallel")
# the first PostgreSQL release (server_version_num) with each protocol version, and options
_VERSION_SINCE = {1: 100000, 2: 140000, 3: 150000, 4: 160000}
_OPTION_SINCE = {"binary": 140000, "messages": 140000, "origin": 160000}
REPLICA_IDENTITIES = "dnfi"  # default, nothing, full, index (pg_class.relreplident)
_KEY_COLUMN = 1  # a Relation column's flag: part of the replica identity
_TRANSACTIONAL = 1  # a Message's flag
_CASCADE, _RESTART_IDENTITY = 1, 2  # a Truncate's flags


@dataclass(frozen=True)
class PgoutputOptions:
    """What START_REPLICATION asked pgoutput for (and the slot allows: ``two_phase``)."""

    proto_version: int
    streaming: str = "off"
    two_phase: bool = False
    binary: bool = False
    messages: bool = False
    origin: str | None = None  # "any" or "none" (PostgreSQL 16); None: not sent

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ConfigurationError(problem)

    def problem(self) -> str | None:
        """Why this combination cannot be asked for, or None."""
        checks = [
            (self.proto_version not in (1, 2, 3, 4),
             f"pgoutput protocol version {self.proto_version} is not one of 1 to 4"),
            (self.streaming not in STREAMING_MODES,
             f"streaming must be off, on or parallel, not {self.streaming!r}"),
            (self.streaming != "off" and self.proto_version < 2,
             "streaming needs pgoutput protocol version 2 or later"),
            (self.streaming == "parallel" and self.proto_version < 4,
             "parallel streaming needs pgoutput protocol version 4 or later"),
            (self.two_phase and self.proto_version < 3,
             "two-phase needs pgoutput protocol version 3 or later"),
            (self.origin not in (None, "any", "none"),
             f"origin must be any or none, not {self.origin!r}"),
        ]
        return next((problem for failed, problem in checks if failed), None)

    def server_problem(self, server_version: int) -> str | None:
        """Why a server of ``server_version`` (e.g. 150018) cannot stream with these
        options, or None."""
        since = _VERSION_SINCE[self.proto_version]
        if server_version < since:
            return (f"pgoutput protocol version {self.proto_version} needs PostgreSQL "
                    f"{since // 10000} or later (the server is {server_version // 10000})")
        for option, needed in _OPTION_SINCE.items():
            if getattr(self, option) not in (False, None) and server_version < needed:
                return f"pgoutput's {option} option needs PostgreSQL {needed // 10000} or later"
        return None

    def start_options(self, publications: list[str]) -> list[tuple[str, str]]:
        """The options of START_REPLICATION ... LOGICAL that ask pgoutput for this.
        Publication names are quoted identifiers: their case is kept."""
        if not publications:
            raise ConfigurationError("pgoutput needs at least one publication")
        options = [("proto_version", str(self.proto_version)),
                   ("publication_names", ",".join(quote_identifier(p) for p in publications))]
        if self.streaming != "off":
            options.append(("streaming", self.streaming))
        for flag in ("two_phase", "binary", "messages"):
            if getattr(self, flag):
                options.append((flag, "on"))
        if self.origin is not None:
            options.append(("origin", self.origin))
        return options


def highest_proto_version(server_version: int) -> int:
    """The newest pgoutput protocol a server of ``server_version`` speaks: 1 before 14, 2 on
    14, 3 on 15, 4 from 16."""
    return max(v for v, since in _VERSION_SINCE.items() if server_version >= since)


class PgoutputDecoder:
    """Decodes the pgoutput messages of one replication connection, in the order received."""

    def __init__(self, options: PgoutputOptions) -> None:
        self.options = options
        self.in_stream = False  # between StreamStart and StreamStop

    def decode(self, lsn: int, payload: bytes | memoryview) -> m.LogicalMessage:
        """The message in ``payload``, which the server sent at ``lsn`` (its XLogData's
        walStart). Raises ProtocolError naming the LSN for anything not exactly right."""
        data = bytes(payload)
        if not data:
            raise ProtocolError(f"pgoutput message at {format_lsn(lsn)}: empty message")
        entry = _MESSAGES.get(data[0])
        if entry is None:
            raise ProtocolError(f"pgoutput message at {format_lsn(lsn)}: unknown message "
                                f"type {_show(data[0])}")
        name, allowed, read = entry
        reader = MessageReader(data, lsn, f"pgoutput {name}", start=1)
        refusal = allowed(self.options)
        if refusal:
            raise reader.error(f"not part of the agreed protocol ({refusal})")
        message = read(self, reader)
        reader.end()
        if isinstance(message, m.StreamStart):
            self.in_stream = True
        elif isinstance(message, m.StreamStop):
            self.in_stream = False
        return message

    # -- one reader per message type ----------------------------------------------------------
    def _outside_stream(self, r: MessageReader) -> None:
        if self.in_stream:
            raise r.error("inside a stream block (StreamStart without StreamStop)")

    def _xid(self, r: MessageReader) -> int | None:
        """The (sub)transaction id that a change carries inside a stream block."""
        return _valid_xid(r, r.u32("transaction id")) if self.in_stream else None

    def _begin(self, r: MessageReader) -> m.Begin:
        self._outside_stream(r)
        final_lsn = _set_lsn(r, r.u64("final LSN"), "final LSN")
        commit_time = r.i64("commit timestamp")
        return m.Begin(final_lsn, commit_time, _valid_xid(r, r.u32("transaction id")))

    def _commit(self, r: MessageReader) -> m.Commit:
        self._outside_stream(r)
        r.no_flags()
        return m.Commit(_set_lsn(r, r.u64("commit LSN"), "commit LSN"),
                        _set_lsn(r, r.u64("end LSN"), "end LSN"), r.i64("commit timestamp"))

    def _origin(self, r: MessageReader) -> m.Origin:
        return m.Origin(r.u64("origin LSN"), r.cstring("origin name"))

    def _relation(self, r: MessageReader) -> m.Relation:
        xid = self._xid(r)
        relation_id = r.u32("relation OID")
        namespace = r.cstring("namespace")
        name = r.cstring("relation name")
        identity = r.char("replica identity")
        if identity not in REPLICA_IDENTITIES:
            raise r.error(f"unknown replica identity {identity!r}")
        columns = []
        for number in range(1, r.u16("column count") + 1):
            flags = r.byte(f"column {number} flags")
            if flags & ~_KEY_COLUMN:
                raise r.error(f"unknown flags {flags:#x} on column {number}")
            columns.append(m.RelationColumn(bool(flags), r.cstring(f"column {number} name"),
                                            r.u32(f"column {number} type OID"),
                                            r.i32(f"column {number} type modifier")))
        return m.Relation(xid, relation_id, namespace, name, identity, tuple(columns))

    def _type(self, r: MessageReader) -> m.Type:
        xid = self._xid(r)
        return m.Type(xid, r.u32("type OID"), r.cstring("namespace"), r.cstring("type name"))

    def _insert(self, r: MessageReader) -> m.Insert:
        xid = self._xid(r)
        relation_id = r.u32("relation OID")
        r.expect("N", "new tuple")
        return m.Insert(xid, relation_id, self._tuple(r))

    def _update(self, r: MessageReader) -> m.Update:
        xid = self._xid(r)
        relation_id = r.u32("relation OID")
        return m.Update(xid, relation_id, *r.update_tuples(self._tuple))

    def _delete(self, r: MessageReader) -> m.Delete:
        xid = self._xid(r)
        relation_id = r.u32("relation OID")
        return m.Delete(xid, relation_id, *r.delete_tuple(self._tuple))

    def _tuple(self, r: MessageReader) -> m.TupleData:
        return read_tuple(r, binary=self.options.binary)

    def _truncate(self, r: MessageReader) -> m.Truncate:
        xid = self._xid(r)
        count = r.u32("relation count")
        flags = r.byte("options")
        if flags & ~(_CASCADE | _RESTART_IDENTITY):
            raise r.error(f"unknown options {flags:#x}")
        if count > r.remaining // 4:
            raise r.error(f"{count} relations announced, {r.remaining // 4} sent")
        ids = tuple(r.u32("relation OID") for _ in range(count))
        return m.Truncate(xid, ids, bool(flags & _CASCADE), bool(flags & _RESTART_IDENTITY))

    def _message(self, r: MessageReader) -> m.Message:
        xid = self._xid(r)
        flags = r.byte("flags")
        if flags & ~_TRANSACTIONAL:
            raise r.error(f"unknown flags {flags:#x}")
        lsn = r.u64("message LSN")
        prefix = r.cstring("prefix")
        content = r.raw(r.u32("content length"), "content")
        return m.Message(xid, bool(flags & _TRANSACTIONAL), lsn, prefix, content)

    def _stream_start(self, r: MessageReader) -> m.StreamStart:
        self._outside_stream(r)
        xid = _valid_xid(r, r.u32("transaction id"))
        first = r.byte("first segment flag")
        if first not in (0, 1):
            raise r.error(f"first segment flag is {first}, not 0 or 1")
        return m.StreamStart(xid, bool(first))

    def _stream_stop(self, r: MessageReader) -> m.StreamStop:
        if not self.in_stream:
            raise r.error("no stream block is open")
        return m.StreamStop()

    def _stream_commit(self, r: MessageReader) -> m.StreamCommit:
        self._outside_stream(r)
        xid = _valid_xid(r, r.u32("transaction id"))
        r.no_flags()
        return m.StreamCommit(xid, _set_lsn(r, r.u64("commit LSN"), "commit LSN"),
                              _set_lsn(r, r.u64("end LSN"), "end LSN"),
                              r.i64("commit timestamp"))

    def _stream_abort(self, r: MessageReader) -> m.StreamAbort:
        self._outside_stream(r)
        xid = _valid_xid(r, r.u32("transaction id"))
        subxid = _valid_xid(r, r.u32("subtransaction id"))
        if self.options.streaming == "parallel":
            return m.StreamAbort(xid, subxid, r.u64("abort LSN"), r.i64("abort timestamp"))
        return m.StreamAbort(xid, subxid, None, None)

    def _begin_prepare(self, r: MessageReader) -> m.BeginPrepare:
        self._outside_stream(r)
        return m.BeginPrepare(*self._two_phase(r, "prepare"))

    def _prepare(self, r: MessageReader) -> m.Prepare:
        self._outside_stream(r)
        r.no_flags()
        return m.Prepare(*self._two_phase(r, "prepare"))

    def _commit_prepared(self, r: MessageReader) -> m.CommitPrepared:
        self._outside_stream(r)
        r.no_flags()
        return m.CommitPrepared(*self._two_phase(r, "commit"))

    def _rollback_prepared(self, r: MessageReader) -> m.RollbackPrepared:
        self._outside_stream(r)
        r.no_flags()
        return m.RollbackPrepared(
            _set_lsn(r, r.u64("prepare end LSN"), "prepare end LSN"),
            _set_lsn(r, r.u64("rollback end LSN"), "rollback end LSN"),
            r.i64("prepare timestamp"), r.i64("rollback timestamp"),
            _valid_xid(r, r.u32("transaction id")), r.cstring("GID"))

    def _stream_prepare(self, r: MessageReader) -> m.StreamPrepare:
        self._outside_stream(r)
        r.no_flags()
        return m.StreamPrepare(*self._two_phase(r, "prepare"))

    def _two_phase(self, r: MessageReader, event: str) -> tuple[int, int, int, int, str]:
        """The fields the two-phase messages share: the ``event``'s (prepare's or commit's)
        LSN, the end LSN, the event's time, the xid, the GID."""
        return (_set_lsn(r, r.u64(f"{event} LSN"), f"{event} LSN"),
                _set_lsn(r, r.u64("end LSN"), "end LSN"), r.i64(f"{event} timestamp"),
                _valid_xid(r, r.u32("transaction id")), r.cstring("GID"))


_KIND_TEXT, _KIND_BINARY, _KIND_NULL, _KIND_UNCHANGED = b"tbnu"


def read_tuple(r: MessageReader, *, binary: bool) -> m.TupleData:
    """TupleData: a column count, then per column its kind and, for ``t`` and ``b``, a
    length and the bytes. ``b`` is allowed only when binary transfer was agreed.

    Read in one go (every change has one or two: the hot path); a row that is not exactly
    right is read again field by field (:func:`_read_tuple_checked`), whose errors say
    what is wrong."""
    data, start = r.tell()
    end = len(data)
    if start + 2 > end:
        return _read_tuple_checked(r, binary=binary)
    count = int.from_bytes(data[start:start + 2], "big")
    position = start + 2
    kinds = bytearray()
    values: list[bytes | None] = []
    for _ in range(count):
        if position >= end:
            return _read_tuple_checked(r, binary=binary)
        kind = data[position]
        position += 1
        if kind == _KIND_TEXT or (kind == _KIND_BINARY and binary):
            length = int.from_bytes(data[position:position + 4], "big", signed=True)
            position += 4
            if position > end or length < 0 or position + length > end:
                return _read_tuple_checked(r, binary=binary)
            values.append(data[position:position + length])
            position += length
        elif kind in (_KIND_NULL, _KIND_UNCHANGED):
            values.append(None)
        else:
            return _read_tuple_checked(r, binary=binary)
        kinds.append(kind)
    r.seek(position)
    return m.TupleData(kinds.decode("ascii"), tuple(values))


def _read_tuple_checked(r: MessageReader, *, binary: bool) -> m.TupleData:
    """:func:`read_tuple` field by field, naming what is wrong."""
    count = r.u16("tuple column count")
    kinds: list[str] = []
    values: list[bytes | None] = []
    for number in range(1, count + 1):
        kind = r.char(f"column {number} kind")
        if kind in "nu":
            values.append(None)
        elif kind == "t" or (kind == "b" and binary):
            length = r.i32(f"column {number} length")
            if length < 0:
                raise r.error(f"column {number} has a negative length {length}")
            values.append(r.raw(length, f"column {number} value"))
        elif kind == "b":
            raise r.error(f"column {number} is binary, which was not agreed")
        else:
            raise r.error(f"column {number} has an unknown kind {kind!r}")
        kinds.append(kind)
    return m.TupleData("".join(kinds), tuple(values))


def _show(byte: int) -> str:
    return f"{chr(byte)!r} (0x{byte:02x})" if 0x20 < byte < 0x7F else f"0x{byte:02x}"


def _set_lsn(r: MessageReader, lsn: int, field: str) -> int:
    if lsn == 0:
        raise r.error(f"its {field} is not set (0/0)")
    return lsn


def _valid_xid(r: MessageReader, xid: int) -> int:
    if xid == 0:
        raise r.error("its transaction id is invalid (0)")
    return xid


# -- what each version and option allows ---------------------------------------------------------
Refusal = Callable[[PgoutputOptions], str | None]


def _always(_: PgoutputOptions) -> str | None:
    return None


def _streaming(options: PgoutputOptions) -> str | None:
    if options.streaming == "off":
        return f"protocol version {options.proto_version} without streaming"
    return None


def _two_phase(options: PgoutputOptions) -> str | None:
    if not options.two_phase:
        return f"protocol version {options.proto_version} without two_phase"
    return None


def _streamed_two_phase(options: PgoutputOptions) -> str | None:
    return _two_phase(options) or _streaming(options)


def _messages(options: PgoutputOptions) -> str | None:
    return None if options.messages else "the messages option is off"


Reader = Callable[[PgoutputDecoder, MessageReader], m.LogicalMessage]
D = PgoutputDecoder
_MESSAGES: dict[int, tuple[str, Refusal, Reader]] = {
    ord("B"): ("Begin", _always, D._begin),
    ord("C"): ("Commit", _always, D._commit),
    ord("O"): ("Origin", _always, D._origin),
    ord("R"): ("Relation", _always, D._relation),
    ord("Y"): ("Type", _always, D._type),
    ord("I"): ("Insert", _always, D._insert),
    ord("U"): ("Update", _always, D._update),
    ord("D"): ("Delete", _always, D._delete),
    ord("T"): ("Truncate", _always, D._truncate),
    ord("M"): ("Message", _messages, D._message),
    ord("S"): ("Stream Start", _streaming, D._stream_start),
    ord("E"): ("Stream Stop", _streaming, D._stream_stop),
    ord("c"): ("Stream Commit", _streaming, D._stream_commit),
    ord("A"): ("Stream Abort", _streaming, D._stream_abort),
    ord("b"): ("Begin Prepare", _two_phase, D._begin_prepare),
    ord("P"): ("Prepare", _two_phase, D._prepare),
    ord("K"): ("Commit Prepared", _two_phase, D._commit_prepared),
    ord("r"): ("Rollback Prepared", _two_phase, D._rollback_prepared),
    ord("p"): ("Stream Prepare", _streamed_two_phase, D._stream_prepare),
}
