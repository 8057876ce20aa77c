"""One logical replication connection into the change log: identify, check the slot, stream.

Per connection (``replication=database``): IDENTIFY_SYSTEM (the connection must name its
database), the slot read from pg_replication_slots (it must exist, be logical, of the
plugin asked for, in this database, and not invalidated: each is an error that retrying
cannot cure), the slot's ``confirmed_flush_lsn`` against what the change log holds (a slot
confirmed past the log's end would never send the transactions in between again: refused,
naming both LSNs, unless --accept-gap records the gap in the log; a new log begins at the
slot's position), then ``START_REPLICATION SLOT s LOGICAL <lsn> (options)`` at the change log's
``written_through`` (the server skips what committed before it; a run it sends again anyway
is skipped by its end LSN) and the COPY loop
(:mod:`receivewal.daemon.copyloop`) feeding the change log
(:class:`~receivewal.logicalreceiver.changefeed.ChangeFeed`). When the server ends the stream, its
error is read and said in its own words; one the slot meets again at the same position on
every start (``publication "p" does not exist``) is final: the daemon stays down.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable

from receivewal.daemon import events as ev
from receivewal.daemon.copyloop import CopyLoop
from receivewal.errors import (
    ConfigurationError,
    ConnectionLost,
    ReceivewalError,
    ServerError,
    SlotAheadOfLog,
    StreamRefused,
)
from receivewal.logical.consumer import ChangeLogConsumer
from receivewal.logical.store import ChangeLogStore
from receivewal.logicalreceiver.changefeed import ChangeFeed
from receivewal.logicalreceiver.logicalsettings import LogicalSettings
from receivewal.replication.commands import (
    DatabaseInfo,
    LogicalSlot,
    identify_database,
    read_logical_slot,
    start_logical_replication_command,
)
from receivewal.replication.link import COPY_DONE, ReplicationLink
from receivewal.replication.waiting import StopFlag
from receivewal.wal.lsn import format_lsn

#: The SQLSTATEs of a server error in the stream that the slot meets again at the same
#: position on every start: undefined_object (``publication "p" does not exist``, which
#: PostgreSQL 15 reads as of the slot's position, so creating it again does not help).
REFUSED_FOR_GOOD = frozenset({"42704"})


class LogicalSession:
    """One open connection streamed into the change log: :meth:`prepare` identifies the
    server and checks the slot, :meth:`run` streams until stopped, at --endpos, or on an
    error, :meth:`close` ends it."""

    def __init__(self, conn: ReplicationLink, *, settings: LogicalSettings,
                 store: Callable[[], ChangeLogStore], events: ev.Listener, stop: StopFlag,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.conn = conn
        self.settings = settings
        self.usable_store = store  # the change log, opened again after a failed write
        self.store: ChangeLogStore | None = None
        self.events = events
        self.loop = CopyLoop(conn, settings.base, events, stop, clock, scattered=True)
        self.info: DatabaseInfo | None = None

    def prepare(self) -> None:
        """The change log (opened again when a write failed in the last session), then
        IDENTIFY_SYSTEM and the slot; ConfigurationError for a slot that cannot stream."""
        self.store = self.usable_store()
        self.info = info = identify_database(self.conn)
        slot_name = self.settings.base.slot
        assert slot_name is not None
        slot = read_logical_slot(self.conn, slot_name)
        if slot.plugin != self.settings.plugin:
            raise ConfigurationError(f'replication slot "{slot_name}" uses plugin '
                                     f'"{slot.plugin}", not "{self.settings.plugin}" '
                                     "(--plugin)")
        if slot.database != info.database:
            raise ConfigurationError(f'replication slot "{slot_name}" belongs to database '
                                     f'"{slot.database}", not "{info.database}"')
        self.settings.start_options(info.version)  # a protocol the server lacks: exit now
        self._check_slot_against_log(self.store, slot_name, slot)

    def _check_slot_against_log(self, store: ChangeLogStore, name: str,
                                slot: LogicalSlot) -> None:
        """The slot's confirmed position against what the change log holds: a slot confirmed
        past it is a gap (SlotAheadOfLog: not retried, the daemon stays down) unless
        --accept-gap records it; a new log notes where it begins."""
        confirmed = slot.confirmed_flush or 0
        if store.new_log:
            store.mark_confirmed(confirmed)  # it begins at the slot: nothing before is its
            return
        held = store.held_through
        if confirmed <= held:
            return
        if not self.settings.accept_gap:
            raise SlotAheadOfLog(
                f'replication slot "{name}" was confirmed through {format_lsn(confirmed)}, but '
                f"the change log in {store.directory} holds transactions only up to "
                f"{format_lsn(held)}: what committed between {format_lsn(held)} and "
                f"{format_lsn(confirmed)} is not in the log and the slot will not send it "
                "again (change files damaged, removed or restored from an older copy, or the "
                "slot dropped and created again); nothing was written. Start once with "
                "--accept-gap to go on from the slot with the gap recorded in the log")
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        store.write_gap(held, confirmed, name, now)

    def run(self) -> str:
        """Stream from the change log's end; return "stopped" or "endpos"."""
        info, store = self.info, self.store
        assert info is not None
        assert store is not None
        slot = self.settings.base.slot
        assert slot is not None
        start = store.written_through
        consumer = ChangeLogConsumer(store, self.settings.plugin_settings(info.version))
        feed = ChangeFeed(consumer, store, self.events)
        command = start_logical_replication_command(slot, start,
                                                    self.settings.start_options(info.version))
        try:
            self.loop.start(command)
            self.events(ev.Connected(self.conn.describe(), info.system_identifier,
                                     info.timeline, slot, info.xlogpos))
            self.events(ev.StreamingStarted(info.timeline, start, slot,
                                            self.conn.receive_path))
            outcome = self.loop.run(feed, info.timeline)
            if outcome is COPY_DONE:
                raise self._stream_ended(feed.position)
            assert isinstance(outcome, str)
            return outcome
        finally:
            feed.close()

    def _stream_ended(self, position: int) -> ReceivewalError:
        """The server ended the COPY stream at ``position``: the error to end the session
        with, in the server's own words when it sent an error (a refusal that the slot meets
        again at the same position on every start is :class:`StreamRefused`, not retried);
        ConnectionLost when it sent none (a shutdown)."""
        try:
            while self.conn.next_result() is not None:
                pass
        except ServerError as exc:
            if exc.sqlstate in REFUSED_FOR_GOOD:
                return StreamRefused(
                    f"the server refuses replication slot \"{self.settings.base.slot}\"'s "
                    f"stream at {format_lsn(position)}: {exc}; the slot will meet this again "
                    "at the same position on every start (a publication dropped, even if "
                    "created again, is read as of the slot's position): not retried",
                    exc.sqlstate)
            return exc
        except ReceivewalError as exc:
            return exc
        return ConnectionLost("the server ended the logical replication stream at "
                              f"{format_lsn(position)} (server shut down?)")

    def close(self) -> None:
        """The connection ends (the COPY loop's summary)."""
        self.loop.close()
