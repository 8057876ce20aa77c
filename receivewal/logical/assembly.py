"""Transactions assembled from decoded messages into runs of change log lines.

:class:`Assembler` takes the messages of one connection in order and hands a :class:`Run`
to its sink for each transaction that commits (or is prepared), in the order the server sends
them, which is commit order: a transaction's lines wait in a
:class:`~receivewal.logical.spool.TransactionBuffer` until its Commit, so a run is written
whole, from ``begin`` to ``commit``, and an aborted one never reaches the log. Streamed
transactions (protocol 2 and later) are buffered per transaction id, several at once (their
blocks interleave), in spool files; a Stream Abort of a subtransaction drops that
subtransaction's changes, of the transaction its whole buffer. Two-phase transactions make a
run from ``begin_prepare`` to ``prepare``; COMMIT PREPARED, ROLLBACK PREPARED and a
non-transactional logical message are runs of one line.

A run is identified by where its last record ends in the WAL (``end_lsn``: the commit's end,
the prepare's end, the rollback's end; a non-transactional message's LSN plus one): the
sink skips runs at or before what it holds, so a resumed stream writes each one once.

The order the protocol demands is checked here, and a break of it is a ProtocolError naming
the LSN: a change outside a transaction, a Begin inside one, a Commit that is not the Begin's,
a change of a relation the server never announced, a stream continued that never started.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from receivewal.errors import ProtocolError
from receivewal.logical import changelines
from receivewal.logical import outputmessages as m
from receivewal.logical.relations import RelationInfo, RelationMap
from receivewal.logical.spool import TransactionBuffer
from receivewal.wal.lsn import format_lsn

MEMORY_LIMIT = 4 << 20  # a transaction's lines in memory, before its buffer spills to disk
NO_RELATION = -1


@dataclass
class Run:
    """One transaction's lines (or one standalone line), ready to be written.

    ``relations`` are the tables its lines need described, as they were at their first change;
    ``lines`` pairs each line with the relation version it was made with (None: none), and
    must be read once; an empty line asks only for its table's description there (a
    truncate's tables, each before the truncate line). ``name_lsn`` names a file the run
    starts (its commit LSN).
    """

    name_lsn: int
    end_lsn: int
    relations: list[RelationInfo]
    lines: Iterator[tuple[RelationInfo | None, bytes]]


class RunSink(Protocol):
    """Where runs go: the change log store."""

    @property
    def written_through(self) -> int:
        """The ``end_lsn`` of the last run it holds (0: none)."""

    def write_run(self, run: Run) -> None: ...


@dataclass
class _Transaction:
    """A transaction whose lines are being buffered."""

    xid: int
    lsn: int  # where its begin line says it started
    buffer: TransactionBuffer
    final_lsn: int = 0  # Begin's final LSN / Begin Prepare's prepare LSN
    commit_time: int = 0
    gid: str | None = None  # a two-phase transaction's
    origin: bytes | None = None
    first_versions: dict[tuple[str, str], RelationInfo] = field(default_factory=dict)
    subtransactions: dict[int, tuple[int, int]] = field(default_factory=dict)

    def add(self, info: RelationInfo | None, line: bytes) -> None:
        if info is not None:
            self.first_versions.setdefault(info.name, info)
        self.buffer.add(NO_RELATION if info is None else info.version, line)


class Assembler:
    """The transactions of one connection's messages, handed to ``sink`` as runs."""

    def __init__(self, sink: RunSink, spool: Path, memory_limit: int = MEMORY_LIMIT) -> None:
        self.sink = sink
        self.spool = spool
        self.memory_limit = memory_limit
        self.relations = RelationMap()
        self.current: _Transaction | None = None  # between Begin (Prepare) and its end
        self.streams: dict[int, _Transaction] = {}  # streamed transactions, by xid
        self.stream: int | None = None  # the xid whose stream block is open
        self.position = 0  # the last non-zero walStart received

    def feed(self, lsn: int, message: m.LogicalMessage) -> None:
        """Take one decoded message that came at ``lsn`` (its XLogData's walStart; the
        server sends 0/0 for a message that is not the last one of a callback)."""
        if lsn:
            self.position = lsn
            if self.current is not None and not self.current.lsn:
                self.current.lsn = lsn  # its Begin came at 0/0: an Origin followed
        handler = _HANDLERS.get(type(message))
        if handler is None:  # the Startup message: the decoder has checked it
            return
        if isinstance(message, m.Begin | m.BeginPrepare):
            handler(self, lsn, message)  # 0/0 stays until the next message tells
        else:
            handler(self, lsn or self.position, message)

    def discard(self) -> None:
        """Drop every transaction still buffered (the connection ended)."""
        for txn in [self.current, *self.streams.values()]:
            if txn is not None:
                txn.buffer.discard()
        self.current, self.streams, self.stream = None, {}, None

    # -- helpers ---------------------------------------------------------------------------
    def _error(self, lsn: int, problem: str) -> ProtocolError:
        return ProtocolError(f"logical stream at {format_lsn(lsn)}: {problem}")

    def _open(self, lsn: int, xid: int, *, streamed: bool) -> _Transaction:
        limit = 0 if streamed else self.memory_limit
        return _Transaction(xid, lsn, TransactionBuffer(self.spool, limit))

    def _outside(self, lsn: int, what: str) -> None:
        if self.current is not None:
            raise self._error(lsn, f"{what} inside transaction {self.current.xid}")
        if self.stream is not None:
            raise self._error(lsn, f"{what} inside the stream block of transaction "
                                   f"{self.stream}")

    def _target(self, lsn: int, xid: int | None, what: str) -> _Transaction:
        """The transaction a change belongs to."""
        if self.stream is not None:
            txn = self.streams[self.stream]
            if xid is not None and xid != txn.xid and xid not in txn.subtransactions:
                txn.subtransactions[xid] = txn.buffer.mark()
            return txn
        if self.current is None:
            raise self._error(lsn, f"{what} outside a transaction")
        return self.current

    def _relation(self, lsn: int, relation_id: int) -> RelationInfo:
        info = self.relations.lookup(relation_id, self.stream)
        if info is None:
            raise self._error(lsn, f"relation {relation_id} was never announced")
        return info

    def _emit(self, run: Run, txn: _Transaction | None = None) -> None:
        """Hand ``run`` to the sink unless it holds it already; ``txn``'s buffer goes."""
        try:
            if run.end_lsn > self.sink.written_through:
                self.sink.write_run(run)
        finally:
            if txn is not None:
                txn.buffer.discard()

    def _transaction_run(self, txn: _Transaction, first: bytes, last: bytes, name_lsn: int,
                         end_lsn: int) -> Run:
        def lines() -> Iterator[tuple[RelationInfo | None, bytes]]:
            yield None, first
            if txn.origin is not None:
                yield None, txn.origin
            seen, info = NO_RELATION, None  # a version looked up once per lines in a row
            for version, line in txn.buffer.entries():
                if version != seen:
                    seen = version
                    info = None if version == NO_RELATION else self.relations.version(version)
                yield info, line
            yield None, last
        return Run(name_lsn, end_lsn, list(txn.first_versions.values()), lines())

    # -- transactions ----------------------------------------------------------------------
    def _begin(self, lsn: int, message: m.Begin) -> None:
        self._outside(lsn or self.position, "Begin")
        self.current = self._open(lsn, message.xid, streamed=False)
        self.current.final_lsn, self.current.commit_time = message.final_lsn, message.commit_time

    def _begin_prepare(self, lsn: int, message: m.BeginPrepare) -> None:
        self._outside(lsn or self.position, "Begin Prepare")
        txn = self.current = self._open(lsn, message.xid, streamed=False)
        txn.final_lsn, txn.commit_time, txn.gid = (message.prepare_lsn, message.prepare_time,
                                                   message.gid)

    def _commit(self, lsn: int, message: m.Commit) -> None:
        txn = self.current
        if txn is None or txn.gid is not None:
            raise self._error(lsn, "Commit without Begin")
        if message.commit_lsn != txn.final_lsn:
            raise self._error(lsn, f"Commit of {format_lsn(message.commit_lsn)} ends the "
                                   f"transaction that Begin announced to commit at "
                                   f"{format_lsn(txn.final_lsn)}")
        self.current = None
        self._committed(lsn, txn, message)

    def _committed(self, lsn: int, txn: _Transaction, message: m.Commit | m.StreamCommit,
                   ) -> None:
        """Write a committed transaction: begin, its lines, commit."""
        first = changelines.begin(txn.lsn, txn.xid, message.commit_lsn, message.commit_time)
        last = changelines.commit(lsn, txn.xid, message.commit_lsn, message.end_lsn,
                              message.commit_time)
        self._emit(self._transaction_run(txn, first, last, message.commit_lsn,
                                         message.end_lsn), txn)

    def _prepared(self, lsn: int, txn: _Transaction, message: m.Prepare | m.StreamPrepare,
                  ) -> None:
        """Write a prepared transaction: begin_prepare, its lines, prepare."""
        first = changelines.begin_prepare(txn.lsn, txn.xid, message.gid,
                                      prepare_lsn=message.prepare_lsn,
                                      end_lsn=message.end_lsn,
                                      prepare_time=message.prepare_time)
        self._emit(self._transaction_run(txn, first, changelines.prepare(lsn, message),
                                         message.prepare_lsn, message.end_lsn), txn)

    def _prepare(self, lsn: int, message: m.Prepare) -> None:
        txn = self.current
        if txn is None or txn.gid is None:
            raise self._error(lsn, "Prepare without Begin Prepare")
        if (message.prepare_lsn, message.xid, message.gid) != (txn.final_lsn, txn.xid, txn.gid):
            raise self._error(lsn, f"Prepare of transaction {message.xid} ({message.gid!r}) "
                                   f"ends transaction {txn.xid} ({txn.gid!r})")
        self.current = None
        self._prepared(lsn, txn, message)

    def _commit_prepared(self, lsn: int, message: m.CommitPrepared) -> None:
        self._outside(lsn, "Commit Prepared")
        line = changelines.commit_prepared(lsn, message)
        self._emit(Run(message.commit_lsn, message.end_lsn, [], iter([(None, line)])))

    def _rollback_prepared(self, lsn: int, message: m.RollbackPrepared) -> None:
        self._outside(lsn, "Rollback Prepared")
        line = changelines.rollback_prepared(lsn, message)
        self._emit(Run(message.rollback_end_lsn, message.rollback_end_lsn, [],
                       iter([(None, line)])))

    def _origin(self, lsn: int, message: m.Origin) -> None:
        txn = self.streams.get(self.stream) if self.stream is not None else self.current
        if txn is None or txn.origin is not None or txn.buffer.count:
            raise self._error(lsn, "Origin not right after the start of a transaction")
        txn.origin = changelines.origin(lsn, txn.xid, message)

    # -- streamed transactions -------------------------------------------------------------
    def _stream_start(self, lsn: int, message: m.StreamStart) -> None:
        self._outside(lsn, "Stream Start")
        if message.first_segment:
            if message.xid in self.streams:
                raise self._error(lsn, f"transaction {message.xid} is streamed again from "
                                       "its first segment")
            self.streams[message.xid] = self._open(lsn, message.xid, streamed=True)
        elif message.xid not in self.streams:
            raise self._error(lsn, f"the stream of transaction {message.xid} continues, but "
                                   "its first segment never came")
        self.stream = message.xid

    def _stream_stop(self, lsn: int, message: m.StreamStop) -> None:
        self.stream = None

    def _streamed(self, lsn: int, xid: int, what: str) -> _Transaction:
        self._outside(lsn, what)
        txn = self.streams.pop(xid, None)
        if txn is None:
            raise self._error(lsn, f"{what} of transaction {xid}, which was never streamed")
        return txn

    def _stream_commit(self, lsn: int, message: m.StreamCommit) -> None:
        txn = self._streamed(lsn, message.xid, "Stream Commit")
        self.relations.end_stream(message.xid, committed=True)
        self._committed(lsn, txn, message)

    def _stream_prepare(self, lsn: int, message: m.StreamPrepare) -> None:
        txn = self._streamed(lsn, message.xid, "Stream Prepare")
        self.relations.end_stream(message.xid, committed=True)
        self._prepared(lsn, txn, message)

    def _stream_abort(self, lsn: int, message: m.StreamAbort) -> None:
        if message.subxid == message.xid:
            txn = self._streamed(lsn, message.xid, "Stream Abort")
            self.relations.end_stream(message.xid, committed=False)
            txn.buffer.discard()
            return
        self._outside(lsn, "Stream Abort")
        txn_or_none = self.streams.get(message.xid)
        if txn_or_none is None:
            raise self._error(lsn, f"Stream Abort of a subtransaction of {message.xid}, which "
                                   "was never streamed")
        mark = txn_or_none.subtransactions.pop(message.subxid, None)
        if mark is not None:  # else it streamed no change
            txn_or_none.buffer.truncate(mark)
            for subxid, other in list(txn_or_none.subtransactions.items()):
                if other[0] >= mark[0]:  # nested in it: its changes came after its first
                    del txn_or_none.subtransactions[subxid]

    # -- relations and changes -------------------------------------------------------------
    def _relation_message(self, lsn: int, message: m.Relation) -> None:
        self.relations.announce(message, lsn, self.stream)

    def _type_message(self, lsn: int, message: m.Type) -> None:
        self.relations.announce_type(message, self.stream)

    def _insert(self, lsn: int, message: m.Insert) -> None:
        txn = self._target(lsn, message.xid, "Insert")
        info = self._relation(lsn, message.relation_id)
        txn.add(info, changelines.insert(lsn, txn.xid, info, message))

    def _update(self, lsn: int, message: m.Update) -> None:
        txn = self._target(lsn, message.xid, "Update")
        info = self._relation(lsn, message.relation_id)
        txn.add(info, changelines.update(lsn, txn.xid, info, message))

    def _delete(self, lsn: int, message: m.Delete) -> None:
        txn = self._target(lsn, message.xid, "Delete")
        info = self._relation(lsn, message.relation_id)
        txn.add(info, changelines.delete(lsn, txn.xid, info, message))

    def _truncate(self, lsn: int, message: m.Truncate) -> None:
        txn = self._target(lsn, message.xid, "Truncate")
        tables = [self._relation(lsn, relation_id) for relation_id in message.relation_ids]
        for info in tables:  # no line: each table described, as it is now, before the truncate
            txn.add(info, b"")
        txn.add(None, changelines.truncate(lsn, txn.xid, tables, message))

    def _message(self, lsn: int, message: m.Message) -> None:
        if message.transactional:
            txn = self._target(lsn, message.xid, "a transactional Message")
            txn.add(None, changelines.message(message.lsn, txn.xid, message))
            return
        self._outside(lsn, "a non-transactional Message")
        line = changelines.message(message.lsn, None, message)
        self._emit(Run(message.lsn, message.lsn + 1, [], iter([(None, line)])))


Handler = Callable[["Assembler", int, Any], None]
_HANDLERS: dict[type, Handler] = {
    m.Begin: Assembler._begin, m.Commit: Assembler._commit, m.Origin: Assembler._origin,
    m.Relation: Assembler._relation_message, m.Type: Assembler._type_message,
    m.Insert: Assembler._insert, m.Update: Assembler._update, m.Delete: Assembler._delete,
    m.Truncate: Assembler._truncate, m.Message: Assembler._message,
    m.StreamStart: Assembler._stream_start, m.StreamStop: Assembler._stream_stop,
    m.StreamCommit: Assembler._stream_commit, m.StreamAbort: Assembler._stream_abort,
    m.BeginPrepare: Assembler._begin_prepare, m.Prepare: Assembler._prepare,
    m.CommitPrepared: Assembler._commit_prepared,
    m.RollbackPrepared: Assembler._rollback_prepared,
    m.StreamPrepare: Assembler._stream_prepare,
}
