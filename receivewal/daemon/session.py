"""One replication connection: find the start, stream, follow timelines.

Per connection: where to start (:mod:`receivewal.daemon.startpoint`: IDENTIFY_SYSTEM, what the
archive holds, the slot, the history), then for each timeline TIMELINE_HISTORY (when missing)
and START_REPLICATION PHYSICAL followed by the COPY BOTH loop. When a timeline ends the server
says which one comes next, and streaming goes on on the same connection. The commands are
:mod:`receivewal.replication.commands`; the COPY loop (:meth:`Session._copy_loop`) follows
receivelog.c's HandleCopyStream.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from receivewal.archive.directory import Archive
from receivewal.archive.layout import StartPoint
from receivewal.archive.listing import Listing
from receivewal.archive.sink import SegmentSink, open_segment_sink
from receivewal.daemon import events as ev
from receivewal.daemon.settings import Settings
from receivewal.daemon.startpoint import fetch_history, find_start
from receivewal.errors import ConnectionLost, WalRemovedError
from receivewal.replication.commands import ServerInfo, read_timeline_end
from receivewal.replication.copystream import CopyStream
from receivewal.replication.link import CopyDone, ReplicationLink, WalRun
from receivewal.replication.messages import PrimaryKeepalive
from receivewal.replication.waiting import StopFlag
from receivewal.wal.lsn import format_lsn, round_down_to_segment
from receivewal.wal.names import wal_file_name

if TYPE_CHECKING:  # loaded only with --upload-to
    from receivewal.daemon.uploader import Uploader

STOP_DRAIN_SECONDS = 10.0
TICK_SECONDS = 0.25  # how often the monitor gets a pulse (watchdog, state file, STATUS)


@dataclass(frozen=True)
class TimelineEnd:
    """The server finished a timeline; streaming continues on ``timeline`` at ``start``."""

    timeline: int
    start: int


class Session:
    """Streams from one open connection until stopped, at endpos, or on an error."""

    def __init__(self, conn: ReplicationLink, *, settings: Settings, archive: Archive,
                 events: ev.Listener, stop: StopFlag, clock: Callable[[], float] = time.monotonic,
                 uploads: Uploader | None = None, listing: Listing | None = None) -> None:
        self.conn = conn
        self.listing = listing  # the start-up's listing of the archive (the lock took it)
        self.uploads = uploads
        self.settings = settings
        self.archive = archive
        self.events = events  # every fact the session reports goes there
        self.stop = stop
        self.clock = clock
        self.stream = CopyStream(conn, settings.compression)  # its decoder lives as long
        self.info: ServerInfo | None = None
        self.writer: SegmentSink | None = None
        self.last_received = clock()
        self.pinged = False
        self.first_frame = True
        self.pending_wire = self.pending_wal = 0
        self.server_wal_end: int | None = None  # walEnd of the last XLogData, for Received
        self.reported_algorithm: str | None = None
        self.announced = False  # Connected said (after the first START, so that
        # the state file's fsynced write does not delay START_REPLICATION)

    def _stopping(self) -> bool:
        """Whether a stop signal came (what the uploads and the disk's waits give up on)."""
        return self.stop.requested

    # -- setup -------------------------------------------------------------------------------
    def prepare(self) -> StartPoint:
        """Find where to start (:func:`~receivewal.daemon.startpoint.find_start`).

        The archive directory is listed once per connection: the first uses the listing the
        lock took at start-up."""
        listing, self.listing = self.listing or self.archive.listing(), None
        start = find_start(self.conn, self.archive, listing, self.settings,
                           events=self.events, stopping=self._stopping, uploads=self.uploads)
        self.info = start.info
        return start.point

    # -- streaming ---------------------------------------------------------------------------
    def run(self, start: StartPoint) -> str:
        """Stream from ``start`` through timeline switches; return "stopped" or "endpos"."""
        timeline, lsn = start.timeline, start.lsn
        while True:
            if timeline > 1:
                fetch_history(self.conn, self.archive, timeline, self.events)
            outcome = self._stream_timeline(timeline, lsn)
            if isinstance(outcome, str):
                return outcome
            self.events(ev.TimelineSwitched(outcome.timeline, timeline, outcome.start))
            timeline, lsn = outcome.timeline, outcome.start

    def _stream_timeline(self, timeline: int, lsn: int) -> TimelineEnd | str:
        assert self.info is not None
        slot = f"SLOT {self.settings.slot} " if self.settings.slot else ""
        self.writer = writer = open_segment_sink(self.archive, self.info.segment_size, timeline,
                                                 lsn, self.settings.at_rest,
                                                 stopping=self._stopping)
        try:
            self.stream.start(
                f"START_REPLICATION {slot}PHYSICAL {format_lsn(lsn)} TIMELINE {timeline}"
            )
            self.last_received, self.pinged = self.clock(), False
            if not self.announced:
                self.events(ev.Connected(self.conn.describe(), self.info.system_identifier,
                                         self.info.timeline, self.settings.slot,
                                         self.info.xlogpos))
                self.announced = True
            self.events(ev.StreamingStarted(timeline, lsn, self.settings.slot,
                                            self.conn.receive_path))
            return self._copy_loop(writer)
        except WalRemovedError as exc:
            segsize = self.info.segment_size
            missing = wal_file_name(timeline, writer.position // segsize, segsize)
            raise WalRemovedError(
                f"the archive needs WAL from {format_lsn(writer.position)} on timeline "
                f"{timeline} (segment {missing}), which the server has removed; not skipping "
                f"ahead: {exc}", sqlstate=exc.sqlstate,
            ) from exc
        finally:
            self._close(writer)

    def _copy_loop(self, writer: SegmentSink) -> TimelineEnd | str:
        """receivelog.c's HandleCopyStream, the hot loop. Take what has arrived; when nothing
        has, do the periodic work (endpos, synchronous flush, liveness, status, monitor tick)
        and let the next read wait, on the socket and the stop signal, until the next status
        is due."""
        interval = self.settings.status_interval
        next_status = self.clock()  # pg_receivewal reports once right away
        next_tick = next_status
        wait = 0.0  # how long the next read may wait for a message: after one, not at all
        while True:
            if self.stop.requested:
                self._settle(writer)
                self.events(ev.StopNoticed(writer.position))
                self._finish(writer)
                return "stopped"
            message = self.stream.read(wait, self.settings.endpos)
            now = self.clock()
            match message:
                case None:
                    if self.stop.requested:  # the signal ended the wait
                        continue
                    if self._at_endpos(writer):  # e.g. started exactly at --endpos
                        return "endpos"
                    next_status = self._idle(writer, now, next_status)
                    next_tick = now + TICK_SECONDS
                    wait = (min(TICK_SECONDS, max(0.0, next_status - now)) if interval > 0
                            else TICK_SECONDS)
                    continue
                case WalRun():
                    self._process_xlogdata(message, writer)
                case PrimaryKeepalive():
                    self._process_keepalive(message, writer)
                case CopyDone.COPY_DONE:
                    self._tick(writer)
                    return self._end_of_copy(writer)
            wait = 0.0
            self.last_received, self.pinged = now, False
            if self._at_endpos(writer):
                return "endpos"
            if interval > 0 and now >= next_status:
                self.send_status(writer)
                next_status = now + interval
            if now >= next_tick:  # the watchdog and state file need a pulse under load too
                self._tick(writer)
                next_tick = now + TICK_SECONDS

    def _idle(self, writer: SegmentSink, now: float, next_status: float) -> float:
        """The periodic work once nothing more has arrived: the synchronous flush, liveness,
        a status update when due, the monitor's tick. Returns when the next status is due."""
        if self.settings.synchronous and writer.flushed < writer.position:
            self.send_status(writer)
        self._check_liveness(writer, now)
        interval = self.settings.status_interval
        if interval > 0 and now >= next_status:
            self.send_status(writer)
            next_status = now + interval
        self._tick(writer)
        return next_status

    def _at_endpos(self, writer: SegmentSink) -> bool:
        """Stop (and say so) once everything up to --endpos is received."""
        endpos = self.settings.endpos
        if endpos is None or writer.position < endpos:
            return False
        self._settle(writer)
        self.events(ev.EndposReached(writer.position, endpos, writer.timeline))
        self._finish(writer)
        return True

    def _settle(self, writer: SegmentSink) -> None:
        """Before saying it stops: wait for the segments being completed (a bounded time after
        a stop signal) and say which are done, as pg_receivewal's "finished segment" lines all
        come before it stops."""
        writer.flush(wait=True)
        self._tick(writer)

    def _tick(self, writer: SegmentSink) -> None:
        """Report the segments completed and what arrived since the last tick, then the tick
        (the monitor's periodic work)."""
        self._report_completed(writer)
        if self.pending_wire:
            self.events(ev.Received(writer.position, self.pending_wire, self.pending_wal,
                                    self.server_wal_end))
            self.events(ev.Written(writer.position))
            self.pending_wire = self.pending_wal = 0
        self.events(ev.Tick(time.time()))

    def _report_compression(self) -> None:
        """Say which stream we got: pg_streampack with an algorithm, or plain."""
        self.first_frame = False
        self.reported_algorithm = self.stream.algorithm
        self.events(ev.CompressionKnown(self.stream.algorithm,
                                        ",".join(self.settings.compression)))

    def close(self) -> None:
        """The connection ends: say the receiver-side counterpart of the module's shutdown
        statistics."""
        stats = self.stream.stats()
        if stats.frames:
            self.events(ev.CompressionSummary(stats))

    def _check_liveness(self, writer: SegmentSink, now: float) -> None:
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
            self.send_status(writer, reply_requested=True)
            self.pinged = True

    def _process_xlogdata(self, run: WalRun, writer: SegmentSink) -> None:
        if self.stream.algorithm != self.reported_algorithm or self.first_frame:
            self._report_compression()
        writer.write(run.wal_start, run.payload)
        self.pending_wire += run.wire
        self.pending_wal += run.end - run.wal_start
        self.server_wal_end = run.wal_end
        if self._report_completed(writer):
            self._tick(writer)

    def _report_completed(self, writer: SegmentSink) -> bool:
        """Say which segments are complete and durable under their final names since the last
        call (as pg_receivewal says "finished segment" after the file's close), and the flushed
        position they moved; whether there was any."""
        completed = writer.completed()
        for name, end in completed:
            self.events(ev.SegmentCompleted(name, writer.timeline, writer.position, end))
            self.events(ev.CompressionStats(self.stream.stats()))
        if completed:
            self.events(ev.Flushed(writer.flushed))
        return bool(completed)

    def _process_keepalive(self, keepalive: PrimaryKeepalive, writer: SegmentSink) -> None:
        self.events(ev.Keepalive(keepalive.wal_end))
        if keepalive.reply_requested:
            self.send_status(writer)

    def send_status(self, writer: SegmentSink, reply_requested: bool = False) -> None:
        """Send ``r`` (and ``h`` unless disabled); fsync first when flush is reported."""
        flush = 0
        if self.settings.report_flush:
            flush = writer.flush(wait=self.settings.synchronous)
            self.events(ev.Flushed(flush))
            if self.uploads is not None and self.settings.confirm_after == "upload":
                flush = self.uploads.confirmable(flush)  # the slot keeps what is not uploaded
        self.stream.send_status(writer.position, flush, reply_requested=reply_requested,
                                feedback=self.settings.hot_standby_feedback)
        self.events(ev.FlushReported(writer.position, flush))

    def _finish(self, writer: SegmentSink) -> None:
        """Stop on our side: fsync, report, end the copy, and let the server finish."""
        self._tick(writer)  # Received: the monitor's counters get the last batch too
        writer.flush(wait=True)
        self.send_status(writer)
        self.stream.end(STOP_DRAIN_SECONDS, self.clock)

    def _close(self, writer: SegmentSink) -> None:
        """Close ``writer`` and say which segments that completed."""
        try:
            writer.close()
        finally:
            self._report_completed(writer)

    def _end_of_copy(self, writer: SegmentSink) -> TimelineEnd:
        """The server ended the copy: a timeline switch, or a shutdown."""
        self._close(writer)
        next_tli, next_start = read_timeline_end(self.conn, writer.timeline, writer.position)
        assert self.info is not None
        return TimelineEnd(next_tli, round_down_to_segment(next_start, self.info.segment_size))
