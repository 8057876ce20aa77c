"""The change log as a consumer of one logical replication connection's stream.

The interface a session drives (the physical archive writer is the other implementation of
the same idea, issue 26):

``receive(wal_start, payload)``
    One XLogData message's walStart and payload (streampack already decoded; a memoryview
    is copied before it is kept). Decodes it with the slot's plugin, assembles
    transactions, and appends every transaction that commits (or is prepared) to the
    change log. Raises :class:`~receivewal.errors.ProtocolError` naming the LSN for a
    message that is wrong in any way; nothing of it, nor of its transaction, is written.
``keepalive(wal_end)``
    A primary keepalive's walEnd. When no transaction is open, every transaction that
    committed before it has been received, so the slot may be confirmed up to it once what
    was received is durable (the slot moves on while the published tables are quiet).
``flush() -> int``
    fsyncs what was written and returns the LSN the slot may be confirmed to (the ``flush``
    and ``apply`` fields of the standby status update): the end of the last durable run,
    or a keepalive's walEnd as above (recorded durably first in the store's
    ``.confirmed-through``, which the start-up check of the slot reads); never less than
    before.
``close()``
    The connection ended: transactions still open are dropped (the server sends them
    again from the slot) and their spool files removed. The store stays open for the next
    connection; :meth:`~receivewal.logical.store.ChangeLogStore.close` ends it.

The START_REPLICATION position for a connection is the store's ``written_through`` (the
server skips what committed before it; what it sends again anyway is skipped by end LSN).
"""

from __future__ import annotations

from dataclasses import dataclass

from receivewal.logical.assembly import MEMORY_LIMIT, Assembler
from receivewal.logical.pglogical import PglogicalDecoder
from receivewal.logical.pgoutput import PgoutputDecoder, PgoutputOptions
from receivewal.logical.rowlines import RowLines
from receivewal.logical.store import ChangeLogStore

PLUGINS = ("pgoutput", "pglogical_output")


@dataclass(frozen=True)
class PluginSettings:
    """The slot's output plugin and what was asked of it (``pgoutput`` for pgoutput's)."""

    plugin: str = "pgoutput"
    pgoutput: PgoutputOptions | None = None

    def decoder(self) -> PgoutputDecoder | PglogicalDecoder:
        """A new decoder for one connection."""
        if self.plugin == "pglogical_output":
            return PglogicalDecoder()
        if self.plugin != "pgoutput" or self.pgoutput is None:
            raise ValueError(f"no decoder for plugin {self.plugin!r} with {self.pgoutput!r}")
        return PgoutputDecoder(self.pgoutput)


class ChangeLogConsumer:
    """One connection's stream into the change log ``store``."""

    def __init__(self, store: ChangeLogStore, plugin: PluginSettings,
                 memory_limit: int = MEMORY_LIMIT) -> None:
        self.store = store
        self.decoder = plugin.decoder()
        self.assembler = Assembler(store, store.spool, memory_limit)
        # pgoutput's plain row changes go straight to their lines; the rest, the reference way
        self.rows = RowLines(self.decoder, self.assembler) \
            if isinstance(self.decoder, PgoutputDecoder) else None
        self.confirmed = store.durable_through
        self._idle = 0  # a keepalive's walEnd received while no transaction was open

    def receive(self, wal_start: int, payload: bytes | memoryview) -> None:
        """Take one XLogData message (see the module's docstring)."""
        data = bytes(payload)
        if data and self.rows is not None and self.rows.take(wal_start, data):
            return
        self.assembler.feed(wal_start, self.decoder.decode(wal_start, data))

    def keepalive(self, wal_end: int) -> None:
        """Note a keepalive's walEnd (see the module's docstring)."""
        assembler = self.assembler
        if assembler.current is None and not assembler.streams and assembler.stream is None:
            self._idle = max(self._idle, wal_end)

    def flush(self) -> int:
        """Make what was written durable; the LSN the slot may be confirmed to (a keepalive's
        walEnd beyond the last run recorded durably first: the start-up check of the slot
        counts the log as holding it)."""
        durable = self.store.flush()
        if self._idle > max(durable, self.confirmed):
            self.store.mark_confirmed(self._idle)
        self.confirmed = max(self.confirmed, durable, self._idle)
        return self.confirmed

    def close(self) -> None:
        """Drop the transactions still open (the store stays open)."""
        self.assembler.discard()
