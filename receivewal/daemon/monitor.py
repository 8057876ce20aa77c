"""The consumer of the session's events that tells the outside: :class:`Monitor`.

Subscribed to the :class:`~receivewal.daemon.events.EventStream`, it takes each event through
one of a handful of cheap methods (``received``, ``flushed``, ``segment_completed`` ...) and
fans them out to the side channels:

- systemd, through sd_notify (:mod:`receivewal.notify`): READY=1 once streaming has started,
  STATUS lines, WATCHDOG=1 pings, STOPPING=1;
- Prometheus metrics (:mod:`receivewal.metrics`) when a metrics address is given;
- the progress line on a terminal (:mod:`receivewal.daemon.progress`) with ``progress=True``;
- the state file ``.receivewal-state.json`` (:mod:`receivewal.state`) that ``receivewal status``
  reads, rewritten from :meth:`Monitor.tick` at most every ``state_interval`` seconds and at
  once on the events that change what status should say (connected, streaming, timeline switch,
  error, disconnect, stop).

No method raises because a side channel failed: the failure is logged (``notify_failed``,
``state_write_failed``) and streaming goes on. Only the constructor raises, with
ConfigurationError, when the metrics address cannot be parsed or bound. The monitor logs nothing
about streaming itself: :class:`~receivewal.daemon.events.EventLog` does.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from receivewal.daemon.events import ArchiveMeasured, Event
from receivewal.daemon.metrics import Address, Metrics, format_address, parse_address
from receivewal.daemon.notify import Notifier, watchdog_interval
from receivewal.daemon.state import (
    LastError,
    LocalCopyStatus,
    State,
    UploadStatus,
    write_state,
)
from receivewal.logs import get_logger
from receivewal.secrets import redacted
from receivewal.wal.lsn import format_lsn

if TYPE_CHECKING:
    from receivewal.daemon.progress import ProgressLine

log = get_logger(component="monitor")

class Monitor:
    """Receives the session's progress reports and keeps systemd, metrics and state in step.

    ``directory`` is the archive directory that gets the state file (None: no state file).
    ``metrics_address`` is ``HOST:PORT`` to serve Prometheus metrics on (None: not served).
    ``file_mode`` is the state file's mode. ``clock`` gives the time in seconds (the same clock
    the caller passes to :meth:`tick`). ``environ`` is where NOTIFY_SOCKET, WATCHDOG_USEC and
    WATCHDOG_PID are read from (default: the process environment; ``{}`` turns systemd off).
    ``progress``: keep a progress line on stderr while streaming, if stderr is a terminal (the
    caller makes sure the logs there are not JSON).
    ``receiver``: what the daemon receives, as the state file records it (``wal`` or
    ``logical``: status words its files as segments or as a change log).
    Use :meth:`null` for a monitor with no side channel at all.
    """

    def __init__(
        self,
        directory: Path | None,
        metrics_address: str | None = None,
        file_mode: int = 0o600,
        clock: Callable[[], float] = time.time,
        *,
        environ: Mapping[str, str] | None = None,
        state_interval: float = 5.0,
        progress: bool = False,
        receiver: str = "wal",
    ) -> None:
        env = os.environ if environ is None else environ
        self.directory = directory
        self.file_mode = file_mode
        self.state_interval = state_interval
        self._clock = clock
        now = clock()
        self._state = State(pid=os.getpid(), hostname=socket.gethostname(), started_at=now,
                            updated_at=now, receiver=receiver)
        # Values that change per message are kept apart and merged in snapshot().
        self._received: int | None = None
        self._written: int | None = None
        self._flushed: int | None = None  # what the last Flushed event said
        self._server_wal_end: int | None = None
        self._last_contact: float | None = None
        self._wire_bytes = 0  # since start
        self._wal_bytes = 0
        self._conn_wire_bytes = 0  # on the current connection (the same batches)
        self._conn_wal_bytes = 0

        self._notifier = Notifier.from_environment(env)
        self._watchdog = watchdog_interval(env, os.getpid())
        self._last_ping: float | None = None
        self._ready_sent = False
        self._last_status: str | None = None
        self._last_write: float | None = None
        self._write_failure: str | None = None

        self._progress: ProgressLine | None = None
        if progress:  # the progress line's module only for --progress (stream's start-up)
            from receivewal.daemon.progress import ProgressLine  # noqa: PLC0415

            self._progress = ProgressLine.for_terminal(
                "plain" if receiver == "logical" else "WAL")
        self._uploads: UploadStatus | None = None  # what the last UploadsChanged said
        self._local: LocalCopyStatus | None = None  # what the last LocalCopyChanged said
        self.metrics = Metrics(clock)
        self.metrics_address: Address | None = None
        if metrics_address is not None:
            self.metrics_address = self.metrics.serve(parse_address(metrics_address))
            log.info("metrics_serving", address=format_address(self.metrics_address))

    @classmethod
    def null(cls, clock: Callable[[], float] = time.time) -> Monitor:
        """A monitor with no side channel: no sd_notify, no metrics endpoint, no state file.

        It still keeps the state, so tests can look at :meth:`snapshot` and ``metrics``.
        """
        return cls(None, None, clock=clock, environ={})

    # -- what the session reports ------------------------------------------------------------
    def __call__(self, event: Event) -> None:
        """Take one event of the stream (it calls the method below that keeps it)."""
        event.tell(self)

    def connected(
        self, server: str, system_identifier: str, timeline: int, slot: str | None,
        server_wal_end: int | None = None,
    ) -> None:
        """Connected and identified the server (``server`` must not carry a password);
        ``server_wal_end`` is IDENTIFY_SYSTEM's xlogpos, the server's WAL end at connect."""
        self._state = replace(
            self._state, phase="connected", server=redacted(server),
            system_identifier=system_identifier, timeline=timeline, slot=slot,
        )
        self._conn_wire_bytes = self._conn_wal_bytes = 0
        self._server_wal_end = None  # another server may end elsewhere: this one says
        if server_wal_end is not None:
            self._server_end(server_wal_end)
        self._last_contact = self._clock()
        self.metrics.contact()
        self.metrics.set_streaming(timeline, streaming=False)
        if slot is not None:
            self.metrics.set_slot(slot, self._state.slot_restart_lsn, active=False)
        self._status(f"Connected to {self._state.server}, timeline {timeline}")
        self._write_now()

    def streaming_started(self, timeline: int, start_lsn: int) -> None:
        """START_REPLICATION succeeded: WAL flows from ``start_lsn`` on ``timeline``."""
        self._state = replace(self._state, phase="streaming", timeline=timeline)
        if self._received is None or self._received < start_lsn:
            self._received = start_lsn
        self.metrics.set_streaming(timeline, streaming=True)
        status = f"Streaming timeline {timeline} from {format_lsn(start_lsn)}"
        if not self._ready_sent:
            self._notifier.notify(READY="1", STATUS=status)
            self._ready_sent = True
            self._last_status = status
        else:
            self._status(status)
        self._write_now()

    def received(self, end_lsn: int, wire_bytes: int, wal_bytes: int,
                 server_wal_end: int | None = None) -> None:
        """A batch of messages arrived: WAL up to ``end_lsn``; bytes on the wire and of WAL;
        ``server_wal_end``: the walEnd of the batch's last XLogData (the server's WAL end)."""
        if self._received is None or end_lsn > self._received:
            self._received = end_lsn
        self._wire_bytes += wire_bytes
        self._wal_bytes += wal_bytes
        self._conn_wire_bytes += wire_bytes
        self._conn_wal_bytes += wal_bytes
        if server_wal_end is not None:
            self._server_end(server_wal_end)
        self._last_contact = self._clock()
        self.metrics.contact()
        self.metrics.set_received(end_lsn, wire_bytes, wal_bytes)

    def written(self, lsn: int) -> None:
        """WAL up to ``lsn`` is written to the archive (not yet durable)."""
        self._written = lsn
        self.metrics.set_written(lsn)

    def flushed(self, lsn: int) -> None:
        """WAL up to ``lsn`` is durable in the archive, as its one holder (the segment writer)
        says: kept as it is said."""
        self._flushed = lsn
        self.metrics.set_flushed(lsn)

    def flush_reported(self, lsn: int) -> None:
        """A standby status update told the server that WAL up to ``lsn`` is flushed (0: no
        flush position). The server sets a physical slot's restart_lsn to it, so that is what
        the slot holds from now on: the state and the metric say so."""
        slot = self._state.slot
        if slot is None or lsn == 0:
            return
        self._state = replace(self._state, slot_restart_lsn=lsn)
        self.metrics.set_slot(slot, lsn, active=self._state.phase == "streaming")

    def keepalive(self, server_wal_end: int) -> None:
        """A primary keepalive arrived, saying the server's WAL ends at ``server_wal_end``."""
        self._server_end(server_wal_end)
        self._last_contact = self._clock()
        self.metrics.contact()

    def segment_completed(self, name: str) -> None:
        """Segment ``name`` is complete and durable under its final name."""
        self._state = replace(
            self._state, segments_completed=self._state.segments_completed + 1, last_segment=name
        )
        self.metrics.segments_completed.inc()

    def timeline_switched(self, timeline: int) -> None:
        """Streaming continues on ``timeline``."""
        self._state = replace(self._state, timeline=timeline)
        self.metrics.set_streaming(timeline, streaming=self._state.phase == "streaming")
        self._status(self._streaming_status())
        self._write_now()

    def archive_warning(self, text: str | None) -> None:
        """What is wrong with the archive that streaming goes on despite (an older island
        before a hole), for ``status``; None: nothing. Written with the next state write (not
        now: nothing is written before START_REPLICATION)."""
        self._state = replace(self._state, archive_warning=text)

    def slot_state(self, slot: str | None, restart_lsn: int | None) -> None:
        """The replication slot's restart_lsn as the server reports it (None: unknown)."""
        self._state = replace(self._state, slot=slot, slot_restart_lsn=restart_lsn)
        if slot is not None:
            self.metrics.set_slot(slot, restart_lsn, active=self._state.phase == "streaming")

    def compression(self, algorithm: str | None) -> None:
        """The current stream's compression, known from its first XLogData (None: plain).

        State, metric and log events all spell a plain stream ``none``; the state says null
        only while no WAL has arrived yet. The byte counts come from :meth:`received` alone.
        """
        self._state = replace(self._state, compression=algorithm or "none")
        self.metrics.set_compression(algorithm)

    def error(self, kind: str, message: str) -> None:
        """An error of ``kind`` (exception class name, ``disk_full``, ``gap``...) happened."""
        message = redacted(message)
        error = LastError(kind=kind, message=message, at=self._clock())
        self._state = replace(self._state, last_error=error)
        self.metrics.errors.labels(kind=kind).inc()
        self._status(f"Error ({kind}): {message}")
        self._write_now()

    def disconnected(self, message: str) -> None:
        """The connection is gone (``message`` says why)."""
        self._state = replace(self._state, phase="disconnected")
        self.metrics.set_streaming(None, streaming=False)
        self._status(f"Disconnected: {redacted(message)}")
        self._write_now()

    def reconnecting(self, delay: float) -> None:
        """The supervisor will try to connect again in ``delay`` seconds."""
        self._state = replace(
            self._state, phase="reconnecting", reconnects=self._state.reconnects + 1
        )
        self.metrics.reconnects.inc()
        error = self._state.last_error
        reason = f" after {error.kind}: {error.message}" if error is not None else ""
        self._status(f"Reconnecting in {delay:.1f}s{reason}")
        self._write_now()

    def uploads_changed(self, status: UploadStatus) -> None:
        """The uploads' status changed (--upload-to), for the state file and the metrics."""
        self._uploads = status
        self.metrics.set_uploads(status)

    def local_copy_changed(self, status: LocalCopyStatus) -> None:
        """The local copy's rule was applied (--keep-local), for the state file and the
        metrics."""
        self._local = status
        self.metrics.set_local_copy(status)

    def archive_measured(self, measure: ArchiveMeasured) -> None:
        """The archive's size and oldest recoverable point, for the metrics."""
        self.metrics.set_archive(measure.wal_bytes, measure.backup_bytes, measure.backups,
                                 measure.oldest_lsn, measure.oldest_time)

    def waiting_for_server(self, message: str) -> None:
        """The first connection failed (``message``); the supervisor keeps trying."""
        self._state = replace(self._state, phase="waiting")
        self._status(f"Waiting for server: {redacted(message)}")
        self._write_now()

    def stopping(self) -> None:
        """Shutting down (SIGTERM, SIGINT or a fatal error)."""
        self._state = replace(self._state, phase="stopping")
        self.metrics.set_streaming(None, streaming=False)
        self._notifier.notify(STOPPING="1", STATUS="Stopping")
        self._last_status = "Stopping"
        self._write_now()

    def tick(self, now: float) -> None:
        """Called by the main loop at least once a second (``now`` from the monitor's clock).

        Pings the watchdog at half of WATCHDOG_USEC, refreshes the STATUS line while
        streaming, and rewrites the state file every ``state_interval`` seconds.
        """
        if self._watchdog is not None and (
            self._last_ping is None
            or now - self._last_ping >= self._watchdog
            or now < self._last_ping  # the clock went back: ping rather than wait
        ):
            self._notifier.notify(WATCHDOG="1")
            self._last_ping = now
        if self._state.phase == "streaming":
            self._status(self._streaming_status())
        if self._progress is not None:
            self._show_progress(now)
        if self.directory is not None and (
            self._last_write is None
            or now - self._last_write >= self.state_interval
            or now < self._last_write
        ):
            self._write(now)

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Record that the daemon stopped, stop the metrics endpoint, close the notify socket."""
        if self._state.phase != "stopped":
            self._state = replace(self._state, phase="stopped")
            self._write_now()
        self.metrics.close()
        self._notifier.close()
        if self._progress is not None:
            self._progress.close()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def snapshot(self) -> State:
        """The state as it would be written now."""
        uploads = {} if self._uploads is None else self._uploads.state_fields()
        local = {} if self._local is None else self._local.state_fields()
        return replace(
            self._state,
            **uploads,
            **local,
            updated_at=self._clock(),
            received_lsn=self._received,
            written_lsn=self._written,
            flushed_lsn=self._flushed,
            server_wal_end=self._server_wal_end,
            last_contact=self._last_contact,
            wire_bytes=self._wire_bytes,
            wal_bytes=self._wal_bytes,
            stream_wire_bytes=self._conn_wire_bytes,
            stream_wal_bytes=self._conn_wal_bytes,
        )

    # -- helpers ----------------------------------------------------------------------------

    def _show_progress(self, now: float) -> None:
        from receivewal.daemon.progress import Sample  # noqa: PLC0415 - loaded with the line

        assert self._progress is not None
        if self._state.phase != "streaming":
            self._progress.clear()  # the log says what happens instead
            return
        self._progress.update(now, Sample(now, self._received, self._server_wal_end,
                                          self._wire_bytes, self._wal_bytes))

    def _server_end(self, lsn: int) -> None:
        """The server's WAL end only moves on within a connection: a keepalive carries the
        sent position, which may be behind the walEnd of the XLogData before it."""
        if self._server_wal_end is None or lsn > self._server_wal_end:
            self._server_wal_end = lsn
            self.metrics.set_server_wal_end(lsn)

    def _streaming_status(self) -> str:
        flushed = "nothing yet" if self._flushed is None else format_lsn(self._flushed)
        return f"Streaming timeline {self._state.timeline}, flushed {flushed}"

    def _status(self, status: str) -> None:
        if status != self._last_status:
            self._notifier.notify(STATUS=status)
            self._last_status = status

    def _write_now(self) -> None:
        if self.directory is not None:
            self._write(self._clock())

    def _write(self, now: float) -> None:
        assert self.directory is not None
        self._last_write = now
        try:
            write_state(self.directory, self.snapshot(), self.file_mode)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if reason != self._write_failure:
                log.warning("state_write_failed", directory=str(self.directory), error=reason)
            self._write_failure = reason
            return
        if self._write_failure is not None:
            log.info("state_write_recovered", directory=str(self.directory))
            self._write_failure = None
