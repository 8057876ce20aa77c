"""The logical change log as the COPY loop's consumer: each message into the change log.

:class:`ChangeFeed` is a logical slot's :class:`~receivewal.daemon.copyloop.StreamConsumer`
over :class:`~receivewal.logical.consumer.ChangeLogConsumer`. Each XLogData message of a run
goes to the consumer alone, with its own walStart: a logical stream's walStarts are not byte
offsets that follow on (a Relation and the Insert after it share one, a transaction's messages
carry its changes' LSNs), and a run holds several messages only when each begins where the one
before ended (the compiled receive loop ends a run at any other start), so the start of each
is the one before's plus its length. The flush position is the consumer's (the end of the last
commit made durable, or a keepalive's walEnd while nothing is open), stated as
:class:`~receivewal.daemon.events.Flushed` when it moves; each change file completed is stated
as :class:`~receivewal.daemon.events.ChangeFileCompleted`.

A message the consumer cannot take (malformed, unknown, a relation never announced, beyond
what the server agreed to) is a :class:`~receivewal.errors.ChangeStreamError` naming its LSN:
the slot would send it again on every connection, so the daemon exits instead of retrying.
"""

from __future__ import annotations

from collections.abc import Iterator

from receivewal.daemon.events import ChangeFileCompleted, Flushed, Listener
from receivewal.errors import ChangeStreamError, ProtocolError
from receivewal.logical.consumer import ChangeLogConsumer
from receivewal.logical.store import ChangeLogStore
from receivewal.replication.link import WalRun


class ChangeFeed:
    """One connection's logical stream into ``store`` through ``consumer``; its facts go to
    ``events``."""

    def __init__(self, consumer: ChangeLogConsumer, store: ChangeLogStore,
                 events: Listener) -> None:
        self.consumer = consumer
        self.store = store
        self.events = events
        # the last message's walStart, or a keepalive's walEnd; at first, where the log ends
        self.received = store.written_through
        self._stated: int | None = None  # the position the last Flushed stated

    @property
    def position(self) -> int:
        """Where the stream has been received through: the status update's write position,
        and what --endpos is measured against."""
        return self.received

    def receive(self, run: WalRun) -> None:
        """Each message of the run into the change log, with its own walStart."""
        receive = self.consumer.receive
        pairs: Iterator[tuple[int, bytes | memoryview]]
        if run.starts is not None:  # a scattered run: each message's walStart listed
            pairs = zip(run.starts, run.payload, strict=True)
        else:  # each begins where the one before ended
            pairs = zip(_following(run), run.payload, strict=True)
        received = self.received
        try:
            for lsn, payload in pairs:
                receive(lsn, payload)
                if lsn > received:  # noqa: PLR1730 - per message: a comparison, not a call
                    received = lsn
        except ChangeStreamError:
            raise
        except ProtocolError as exc:
            raise ChangeStreamError(str(exc)) from exc
        finally:
            self.received = received  # through the last message taken

    def keepalive(self, wal_end: int) -> None:
        """The server's WAL end: with no transaction open, the slot may move up to it."""
        self.consumer.keepalive(wal_end)
        self.received = max(self.received, wal_end)

    def flush(self, wait: bool = False) -> int:
        """fsync what was written; the LSN the slot may be confirmed to (only commits that are
        durable, or a keepalive's walEnd while nothing was open)."""
        confirmed = self.consumer.flush()
        self._state_flushed(confirmed)
        return confirmed

    def report(self) -> bool:
        """State the change files completed since the last call; whether there was any."""
        completed = self.store.completed()
        for name in completed:
            self.events(ChangeFileCompleted(name, self.store.durable_through))
        if completed:
            self._state_flushed(max(self.consumer.confirmed, self.store.durable_through))
        return bool(completed)

    def close(self) -> None:
        """The stream ended: make what was written durable, drop the transactions still open
        (the slot sends them again), state what that completed."""
        try:
            self.flush()
        finally:
            self.consumer.close()
            self.report()

    def _state_flushed(self, lsn: int) -> None:
        if lsn != self._stated:
            self._stated = lsn
            self.events(Flushed(lsn))


def _following(run: WalRun) -> list[int]:
    """The walStarts of a run's messages that follow on: the first at ``run.wal_start``,
    each next one where the one before ended."""
    starts, lsn = [], run.wal_start
    for payload in run.payload:
        starts.append(lsn)
        lsn += len(payload)
    return starts
