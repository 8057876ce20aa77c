"""The COPY loop: receivelog.c's HandleCopyStream, feeding a consumer.

One START_REPLICATION's stream goes into a :class:`StreamConsumer`. The loop reads what
arrives (:class:`~receivewal.replication.copystream.CopyStream`: a run of XLogData messages, a
keepalive or the end of the stream), hands the data to the consumer, answers keepalives, and
does the periodic work of a receiver: standby status updates (the flush position is the
consumer's), the receive timeout, --endpos, the stop signal, and the monitor's pulse. It
states the stream's facts (received, written, compression, endpos, stop...) on the event
stream; the consumer states its own (what it made durable, the files it completed). Nothing
here knows what the stream carries: the WAL archive is one consumer
(:class:`~receivewal.walreceiver.archivefeed.ArchiveFeed`), a logical change log another.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, Protocol

from receivewal.daemon import events as ev
from receivewal.daemon.events import TICK_SECONDS
from receivewal.errors import ConnectionLost
from receivewal.replication.copystream import CopyStream
from receivewal.replication.link import COPY_DONE, CopyDone, ReplicationLink, WalRun
from receivewal.replication.messages import PrimaryKeepalive
from receivewal.replication.streampack import DEFAULT_MIN_SIZE, XLOGDATA_HEADER_SIZE
from receivewal.replication.waiting import StopFlag

STOP_DRAIN_SECONDS = 10.0  # how long the server gets to end the stream after we stopped
STOPPED: Final = "stopped"  # a stop signal came
ENDPOS: Final = "endpos"  # everything up to --endpos arrived
Outcome = str | CopyDone  # STOPPED, ENDPOS, or COPY_DONE: the server ended the stream


class StreamConsumer(Protocol):
    """What one START_REPLICATION's stream goes into.

    The loop hands it every run of messages as it arrives, asks it for the position the
    server may be told is flushed, lets it state on the event stream what it made durable
    (at each of its pulses), and closes it when the stream ends."""

    @property
    def position(self) -> int:
        """The LSN the stream has been received through: the write position of a status
        update, and what --endpos is measured against."""

    def receive(self, run: WalRun) -> None:
        """Take a run of XLogData messages: ``run.payload`` holds one piece per message, each
        beginning where the one before ended (the first at ``run.wal_start``), or, in a
        scattered run (a logical stream's), at its own ``run.starts``. Raises the project's
        errors, naming the LSN, for what it cannot take."""

    def keepalive(self, wal_end: int) -> None:
        """The server says that its WAL ends at ``wal_end`` (a primary keepalive)."""

    def flush(self, wait: bool = False) -> int:
        """Make what was received durable (``wait``: also what is being made durable in the
        background) and return the LSN the server may be told is flushed."""

    def report(self) -> bool:
        """State on the event stream what became durable since the last call; whether that
        completed a file."""

    def close(self) -> None:
        """The stream ended: leave what was received durable, and state what that made
        durable (also when it raises)."""


class LoopSettings(Protocol):
    """What the loop reads of the settings (:class:`~receivewal.daemon.settings.Settings`)."""

    @property
    def status_interval(self) -> float:
        """Seconds between standby status updates (0: only when the server asks)."""

    @property
    def synchronous(self) -> bool:
        """Flush and report as soon as nothing more has arrived."""

    @property
    def receive_timeout(self) -> float:
        """Seconds of silence after which the server counts as gone (0: never)."""

    @property
    def endpos(self) -> int | None:
        """Stop once everything up to this LSN arrived (None: never)."""

    @property
    def hot_standby_feedback(self) -> bool:
        """Send hot standby feedback with each status update."""

    @property
    def compression(self) -> tuple[str, ...]:
        """The pg_streampack algorithms asked for."""

    @property
    def report_flush(self) -> bool:
        """Whether status updates carry a flush position."""


class CopyLoop:
    """The COPY loop of one connection (``link``): made once per connection, run once per
    START_REPLICATION (:meth:`start`, then :meth:`run`), closed with the connection."""

    def __init__(self, link: ReplicationLink, settings: LoopSettings, events: ev.Listener,
                 stop: StopFlag, clock: Callable[[], float] = time.monotonic, *,
                 scattered: bool = False) -> None:
        self.settings = settings
        # scattered: a logical stream, whose runs may hold messages whatever their walStarts
        self.stream = CopyStream(link, settings.compression, scattered=scattered)
        # what a message counts as received: its payload (WAL); a logical stream's small
        # messages, their whole plain XLogData, header included (so that its compression
        # ratio reads 1 when plain, as WAL's does)
        self.message_overhead = XLOGDATA_HEADER_SIZE if scattered else 0
        self.events = events
        self.stop = stop
        self.clock = clock
        self.last_received = clock()
        self.pinged = False
        self.first_frame = True
        self.reported_algorithm: str | None = None
        self.pending_wire = self.pending_wal = 0
        self.server_wal_end: int | None = None  # walEnd of the last XLogData, for Received
        self.unflushed = False  # received since the last status update that flushed

    def start(self, command: str) -> None:
        """Send START_REPLICATION ``command``: the stream is open."""
        self.stream.start(command)
        self.last_received, self.pinged = self.clock(), False

    def run(self, consumer: StreamConsumer, timeline: int) -> Outcome:
        """Feed ``consumer`` until stopped, at --endpos or at the end of the server's stream
        (``timeline`` is the one streamed, for the events that name it). Take what has
        arrived; when nothing has, do the periodic work (endpos, synchronous flush, liveness,
        status, pulse) and let the next read wait, on the socket and the stop signal, until
        the next status is due."""
        interval = self.settings.status_interval
        next_status = self.clock()  # pg_receivewal reports once right away
        next_tick = next_status
        wait = 0.0  # how long the next read may wait for a message: after one, not at all
        while True:
            if self.stop.requested:
                self._settle(consumer)
                self.events(ev.StopNoticed(consumer.position))
                self._finish(consumer)
                return STOPPED
            message = self.stream.read(wait, self.settings.endpos)
            now = self.clock()
            match message:
                case None:
                    if self.stop.requested:  # the signal ended the wait
                        continue
                    if self._at_endpos(consumer, timeline):  # e.g. started exactly there
                        return ENDPOS
                    next_status = self._idle(consumer, now, next_status)
                    next_tick = now + TICK_SECONDS
                    wait = (min(TICK_SECONDS, max(0.0, next_status - now)) if interval > 0
                            else TICK_SECONDS)
                    continue
                case WalRun():
                    self._receive(message, consumer)
                case PrimaryKeepalive():
                    self._keepalive(message, consumer)
                case CopyDone.COPY_DONE:
                    self._tick(consumer)
                    return COPY_DONE
            wait = 0.0
            self.last_received, self.pinged = now, False
            if self._at_endpos(consumer, timeline):
                return ENDPOS
            if interval > 0 and now >= next_status:
                self._send_status(consumer)
                next_status = now + interval
            if now >= next_tick:  # the watchdog and state file need a pulse under load too
                self._tick(consumer)
                next_tick = now + TICK_SECONDS

    def close(self) -> None:
        """The connection ends: state the receiver-side counterpart of pg_streampack's
        shutdown statistics."""
        stats = self.stream.stats()
        if stats.frames:
            self.events(ev.CompressionSummary(stats))

    # -- what arrives ------------------------------------------------------------------------
    def _receive(self, run: WalRun, consumer: StreamConsumer) -> None:
        if self.stream.algorithm != self.reported_algorithm or (
                self.first_frame and self._surely_plain(run)):
            self._report_compression()
        consumer.receive(run)
        self.unflushed = True
        self.pending_wire += run.wire
        self.pending_wal += run.size + self.message_overhead * len(run.payload)
        self.server_wal_end = run.wal_end
        if self._report(consumer):
            self._tick(consumer)

    def _keepalive(self, keepalive: PrimaryKeepalive, consumer: StreamConsumer) -> None:
        self.events(ev.Keepalive(keepalive.wal_end))
        consumer.keepalive(keepalive.wal_end)
        if keepalive.reply_requested:
            self._send_status(consumer)

    def _surely_plain(self, run: WalRun) -> bool:
        """Whether a run of plain frames shows the stream plain: nothing was asked, or a
        message is long enough that pg_streampack would have compressed it (at its default
        min_size; a logical stream begins with shorter ones, a Begin, sent plain)."""
        return not self.settings.compression or any(
            len(payload) >= DEFAULT_MIN_SIZE for payload in run.payload)

    def _report_compression(self) -> None:
        """Say which stream we got: pg_streampack with an algorithm, or plain."""
        self.first_frame = False
        self.reported_algorithm = self.stream.algorithm
        self.events(ev.CompressionKnown(self.stream.algorithm,
                                        ",".join(self.settings.compression)))

    # -- the periodic work -------------------------------------------------------------------
    def _idle(self, consumer: StreamConsumer, now: float, next_status: float) -> float:
        """The periodic work once nothing more has arrived: the synchronous flush, liveness,
        a status update when due, the pulse. Returns when the next status is due."""
        if self.settings.synchronous and self.unflushed:
            self._send_status(consumer)
        self._check_liveness(consumer, now)
        interval = self.settings.status_interval
        if interval > 0 and now >= next_status:
            self._send_status(consumer)
            next_status = now + interval
        self._tick(consumer)
        return next_status

    def _report(self, consumer: StreamConsumer) -> bool:
        """Have the consumer state what it made durable; the decoder's counts with each file
        it completed."""
        completed = consumer.report()
        if completed:
            self.events(ev.CompressionStats(self.stream.stats()))
        return completed

    def _tick(self, consumer: StreamConsumer) -> None:
        """Report what became durable and what arrived since the last pulse, then the pulse
        (the monitor's periodic work)."""
        self._report(consumer)
        if self.pending_wire:
            self.events(ev.Received(consumer.position, self.pending_wire, self.pending_wal,
                                    self.server_wal_end))
            self.events(ev.Written(consumer.position))
            self.pending_wire = self.pending_wal = 0
        self.events(ev.Tick(time.time()))

    def _check_liveness(self, consumer: StreamConsumer, now: float) -> None:
        """Like wal_receiver_timeout: ping at half the timeout, give up at the full one."""
        timeout = self.settings.receive_timeout
        if timeout <= 0:
            return
        silent = now - self.last_received
        if silent >= timeout:
            raise ConnectionLost(f"terminating connection: no message from the server for "
                                 f"{silent:.1f} seconds (receive timeout {timeout:g}s)")
        if silent >= timeout / 2 and not self.pinged:
            self.events(ev.ServerSilent(round(silent, 1)))
            self._send_status(consumer, reply_requested=True)
            self.pinged = True

    def _send_status(self, consumer: StreamConsumer, reply_requested: bool = False) -> None:
        """Send ``r`` (and ``h`` unless disabled); flush first when flush is reported."""
        flush = 0
        if self.settings.report_flush:
            flush = consumer.flush(wait=self.settings.synchronous)
            self.unflushed = False
        self.stream.send_status(consumer.position, flush, reply_requested=reply_requested,
                                feedback=self.settings.hot_standby_feedback)
        self.events(ev.FlushReported(consumer.position, flush))

    # -- the end -----------------------------------------------------------------------------
    def _at_endpos(self, consumer: StreamConsumer, timeline: int) -> bool:
        """Stop (and say so) once everything up to --endpos is received."""
        endpos = self.settings.endpos
        if endpos is None or consumer.position < endpos:
            return False
        self._settle(consumer)
        self.events(ev.EndposReached(consumer.position, endpos, timeline))
        self._finish(consumer)
        return True

    def _settle(self, consumer: StreamConsumer) -> None:
        """Before saying it stops: make what arrived durable (waiting a bounded time after a
        stop signal) and state it, with the last batch's counts, as pg_receivewal's
        "finished segment" lines all come before it stops."""
        consumer.flush(wait=True)
        self._tick(consumer)

    def _finish(self, consumer: StreamConsumer) -> None:
        """Stop on our side (once settled): report, end the copy, let the server finish."""
        self._send_status(consumer)
        self.stream.end(STOP_DRAIN_SECONDS, self.clock)
