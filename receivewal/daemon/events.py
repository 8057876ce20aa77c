"""What a streaming session and its supervisor report, as typed events in one stream.

The session, the supervisor and the uploader state each fact once, as a frozen dataclass
(an :class:`Event`) handed to an :class:`EventStream`. This module holds the stream and the
facts of streaming (the COPY loop's, the session's, the archive feed's); the start-up's
findings are in :mod:`receivewal.walreceiver.startpoint`, the daemon's life (connections, slot
commands, failures, reconnects, the uploads, stopping) in :mod:`receivewal.daemon.lifecycle`.
The consumers subscribe to the stream: :class:`EventLog` (each event's structlog line: its
``name``, ``level`` and :meth:`Event.log_fields`), the monitor (each event's
:meth:`Event.tell` calls the matching :class:`SessionMonitor` method, which feeds the state
file, the metrics, systemd and the progress line), the uploader (the files completed,
:class:`SegmentCompleted` and :class:`HistoryFileWritten`) and the pg_receivewal drop-in's
messages. The LSNs travel as numbers: no consumer reads one back from
a log line. The stream is the main thread's: another thread (the uploader's) hands its events
over with :meth:`EventStream.post`.

The flushed position has one holder, the segment writer: a :class:`Flushed` event carries its
value, and the monitor keeps what the last one said.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol

from receivewal.daemon.state import LocalCopyStatus, UploadStatus
from receivewal.replication.streampack import StreampackStats
from receivewal.wal.lsn import format_lsn

TICK_SECONDS = 0.25  # how often the stream pulses (Tick: watchdog, state file, STATUS)


class SessionMonitor(Protocol):
    """What the events tell the monitor: :class:`Monitor` is the one implementation."""

    file_mode: int

    def connected(self, server: str, system_identifier: str, timeline: int,
                  slot: str | None, server_wal_end: int | None = None) -> None: ...
    def slot_state(self, slot: str | None, restart_lsn: int | None) -> None: ...
    def streaming_started(self, timeline: int, start_lsn: int) -> None: ...
    def received(self, end_lsn: int, wire_bytes: int, wal_bytes: int,
                 server_wal_end: int | None = None) -> None: ...
    def written(self, lsn: int) -> None: ...
    def flushed(self, lsn: int) -> None: ...
    def flush_reported(self, lsn: int) -> None: ...
    def keepalive(self, server_wal_end: int) -> None: ...
    def segment_completed(self, name: str) -> None: ...
    def timeline_switched(self, timeline: int) -> None: ...
    def archive_warning(self, text: str | None) -> None: ...
    def compression(self, algorithm: str | None) -> None: ...
    def tick(self, now: float) -> None: ...
    def error(self, kind: str, message: str) -> None: ...
    def disconnected(self, message: str) -> None: ...
    def uploads_changed(self, status: UploadStatus) -> None: ...
    def local_copy_changed(self, status: LocalCopyStatus) -> None: ...
    def archive_measured(self, measure: ArchiveMeasured) -> None: ...
    def reconnecting(self, delay: float) -> None: ...
    def waiting_for_server(self, message: str) -> None: ...
    def stopping(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Event:
    """A fact. ``name`` is its log event (None: not logged), ``level`` the log level."""

    name: ClassVar[str | None] = None
    level: ClassVar[str] = "info"
    lsns: ClassVar[tuple[str, ...]] = ()  # the fields that are LSNs, logged as 0/16B3F08
    unlogged: ClassVar[tuple[str, ...]] = ()  # the fields not in the log line

    def log_fields(self) -> dict[str, Any]:
        """The key/values of its log line: its fields in order, LSNs spelled as LSNs."""
        return {f.name: format_lsn(getattr(self, f.name)) if f.name in self.lsns
                else getattr(self, f.name) for f in fields(self) if f.name not in self.unlogged}

    def tell(self, monitor: SessionMonitor) -> None:
        """Hand the fact to the monitor (nothing, unless the monitor keeps it)."""


#: Something that takes the events: a subscriber, or the stream itself.
Listener = Callable[[Event], None]


class EventStream:
    """Hands every event to each subscriber, in the order they subscribed, on the thread that
    states the events (the main thread); events posted (:meth:`post`) from another thread are
    handed over first, before the next event stated."""

    def __init__(self, *subscribers: Listener) -> None:
        self._subscribers = list(subscribers)
        self._posted: queue.SimpleQueue[Event] = queue.SimpleQueue()

    def subscribe(self, subscriber: Listener, *, before: Listener | None = None,
                  ) -> Callable[[], None]:
        """Hand ``subscriber`` every event from now on: after the others, or just before
        ``before``; returns the call that unsubscribes it (main thread only)."""
        at = self._subscribers.index(before) if before in self._subscribers \
            else len(self._subscribers)
        self._subscribers.insert(at, subscriber)

        def unsubscribe() -> None:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)

        return unsubscribe

    def post(self, event: Event) -> None:
        """State ``event`` from another thread: it is handed to the subscribers on the
        stream's thread, before the next event stated there (the periodic :class:`Tick`
        comes at least once a second)."""
        self._posted.put(event)

    def __call__(self, event: Event) -> None:
        while not self._posted.empty():
            self._deliver(self._posted.get())
        self._deliver(event)

    def _deliver(self, event: Event) -> None:
        for subscriber in self._subscribers:
            subscriber(event)


class EventLog:
    """The consumer that logs: each event with a name as one structlog line."""

    def __init__(self, log: Any) -> None:
        self.log = log

    def __call__(self, event: Event) -> None:
        if event.name is not None:
            getattr(self.log, event.level)(event.name, **event.log_fields())


# -- the facts of streaming --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Connected(Event):
    """Connected to ``server`` (no password in it) and identified it."""

    server: str
    system_identifier: str
    timeline: int
    slot: str | None
    server_wal_end: int | None

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.connected(self.server, self.system_identifier, self.timeline, self.slot,
                          server_wal_end=self.server_wal_end)


@dataclass(frozen=True, slots=True)
class StreamingStarted(Event):
    """START_REPLICATION succeeded: WAL flows from ``start_lsn`` on ``timeline``."""

    name, lsns = "streaming_started", ("start_lsn",)
    timeline: int
    start_lsn: int
    slot: str | None
    receive_path: str = "python"  # the receive loop: "c" (compiled) or "python"

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.streaming_started(self.timeline, self.start_lsn)


@dataclass(frozen=True, slots=True)
class Received(Event):
    """WAL up to ``end_lsn`` arrived since the last report: bytes on the wire and of WAL
    (a logical stream's: of its XLogData messages as they are plain, headers included);
    ``server_wal_end`` is the walEnd of the last XLogData."""

    end_lsn: int
    wire_bytes: int
    wal_bytes: int
    server_wal_end: int | None

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.received(self.end_lsn, self.wire_bytes, self.wal_bytes, self.server_wal_end)


@dataclass(frozen=True, slots=True)
class Written(Event):
    """WAL up to ``lsn`` is written to the archive (not yet durable)."""

    lsn: int

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.written(self.lsn)


@dataclass(frozen=True, slots=True)
class Flushed(Event):
    """The segment writer's flushed position: WAL up to ``lsn`` is durable."""

    lsn: int

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.flushed(self.lsn)


@dataclass(frozen=True, slots=True)
class FlushReported(Event):
    """A standby status update went to the server: ``write_lsn``, ``flush_lsn`` (0: none)."""

    name, level, lsns = "status_sent", "debug", ("write", "flush")
    write: int
    flush: int

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.flush_reported(self.flush)


@dataclass(frozen=True, slots=True)
class Keepalive(Event):
    """A primary keepalive arrived, saying the server's WAL ends at ``server_wal_end``."""

    server_wal_end: int

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.keepalive(self.server_wal_end)


@dataclass(frozen=True, slots=True)
class SegmentCompleted(Event):
    """Segment ``segment`` is complete, ending at ``end_lsn``; the writer is at ``lsn``."""

    name, lsns, unlogged = "segment_completed", ("lsn",), ("end_lsn",)
    segment: str
    timeline: int
    lsn: int
    end_lsn: int

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.segment_completed(self.segment)


@dataclass(frozen=True, slots=True)
class ArchiveMeasured(Event):
    """What the archive holds, measured (the WAL receiver's meter thread posts it): the bytes
    of its WAL files and of its backups, its complete backups, and its oldest recoverable
    point (the start of the oldest complete backup whose WAL it holds; None: none)."""

    wal_bytes: int
    backup_bytes: int
    backups: int
    oldest_lsn: int | None
    oldest_time: float | None  # seconds since the epoch

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.archive_measured(self)


@dataclass(frozen=True, slots=True)
class ChangeFileCompleted(Event):
    """A logical change log file is complete and durable under its final name ``file``; the
    change log is durable through ``lsn`` (what status shows as its last file)."""

    name, lsns = "change_file_completed", ("lsn",)
    file: str
    lsn: int

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.segment_completed(self.file)


@dataclass(frozen=True, slots=True)
class HistoryFileWritten(Event):
    """The history file ``file`` of ``timeline``, fetched from the server, is durable in the
    archive."""

    name = "history_file_written"
    file: str
    timeline: int


@dataclass(frozen=True, slots=True)
class TimelineSwitched(Event):
    """Streaming continues on ``timeline`` at ``start_lsn``."""

    name, lsns = "timeline_switched", ("start_lsn",)
    timeline: int
    previous_timeline: int
    start_lsn: int

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.timeline_switched(self.timeline)


@dataclass(frozen=True, slots=True)
class CompressionKnown(Event):
    """The stream's compression, known from its first XLogData (None: plain); ``requested``
    is what was asked for, comma-separated (empty: nothing)."""

    name = "stream_compression"
    algorithm: str | None
    requested: str

    def log_fields(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm or "none", "requested": self.requested or "none"}

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.compression(self.algorithm)


@dataclass(frozen=True, slots=True)
class CompressionStats(Event):
    """The pg_streampack decoder's counts so far (with each completed segment)."""

    name, level = "compression_stats", "debug"
    stats: StreampackStats

    def log_fields(self) -> dict[str, Any]:
        return self.stats.as_dict()


@dataclass(frozen=True, slots=True)
class CompressionSummary(Event):
    """The pg_streampack decoder's counts for a whole connection: the receiver's side of the
    module's shutdown statistics."""

    name = "compression_summary"
    stats: StreampackStats

    def log_fields(self) -> dict[str, Any]:  # the algorithm spelled as stream_compression does
        return {**self.stats.as_dict(), "algorithm": self.stats.algorithm or "none"}


@dataclass(frozen=True, slots=True)
class ServerSilent(Event):
    """Nothing came from the server for ``seconds`` (half the receive timeout): a status
    update asks for a reply."""

    name = "server_silent"
    seconds: float


@dataclass(frozen=True, slots=True)
class EndposReached(Event):
    """Everything up to --endpos is received; the writer is at ``lsn``."""

    name, lsns = "endpos_reached", ("lsn", "endpos")
    lsn: int
    endpos: int
    timeline: int


@dataclass(frozen=True, slots=True)
class StopNoticed(Event):
    """The session saw the stop signal with the writer at ``lsn``."""

    name, lsns = "stop_requested", ("lsn",)
    lsn: int


@dataclass(frozen=True, slots=True)
class Tick(Event):
    """The periodic pulse (at least once a second): ``now`` is the wall clock."""

    now: float

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.tick(self.now)
