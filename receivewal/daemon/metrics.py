"""Prometheus metrics, served over HTTP with prometheus-client when ``--metrics-address`` is set.

:class:`Metrics` keeps every value as a plain number, updated by the monitor; :meth:`Metrics.serve`
imports prometheus-client, registers a collector that reads those numbers at scrape time in a
registry of its own (never the global one, so tests and several instances in one process do not
collide) and starts the HTTP endpoint (:mod:`receivewal.daemon.endpoint`, bounded in connections
and time, so that no client can take the daemon's file descriptors). Without an address,
prometheus-client (and the HTTP server modules it pulls in) is never imported: the daemon starts
sooner. :func:`parse_address` is pure.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

# Re-exported (the monitor imports them from here).
from receivewal.addresses import Address as Address  # noqa: PLC0414
from receivewal.addresses import format_address as format_address  # noqa: PLC0414
from receivewal.addresses import parse_address as parse_address  # noqa: PLC0414

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
    from prometheus_client.metrics_core import Metric

    from receivewal.daemon.state import LocalCopyStatus, UploadStatus

PREFIX = "receivewal"


class Count:
    """A counter that only goes up (prometheus-client's ``inc`` without the library)."""

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class CountByKind:
    """Counters per ``kind`` label value, created on first use (as ``Counter.labels``)."""

    def __init__(self) -> None:
        self.counts: dict[str, Count] = {}

    def labels(self, *, kind: str) -> Count:
        return self.counts.setdefault(kind, Count())


class Metrics:
    """The daemon's metrics as plain numbers; the monitor feeds them, a scrape reads them."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._started = clock()
        self._last_contact: float | None = None
        self._received = 0
        self._written = 0
        self._flushed = 0
        self._server_wal_end = 0
        self._wire = 0
        self._wal = 0
        self._timeline = 0
        self._streaming = False
        self._algorithm = "none"
        self._slots: dict[str, tuple[float, bool]] = {}  # slot: (restart_lsn or nan, active)
        self._server: WSGIServer | None = None
        self._uploads: UploadStatus | None = None  # with --upload-to only
        self._local: LocalCopyStatus | None = None  # with --keep-local only
        # once measured: WAL bytes, backup bytes, backups, oldest recoverable LSN and time
        self._archive: tuple[int, int, int, float, float] | None = None
        self.segments_completed = Count()
        self.reconnects = Count()
        self.errors = CountByKind()

    # -- derived values, computed at scrape time ------------------------------------------

    def _lag(self) -> float:
        end = max(self._server_wal_end, self._received)
        return float(max(end - self._flushed, 0))

    def _age(self) -> float:
        since = self._started if self._last_contact is None else self._last_contact
        return max(self._clock() - since, 0.0)

    def _ratio(self) -> float:
        return self._wal / self._wire if self._wire else math.nan

    # -- updates ----------------------------------------------------------------------------

    def contact(self) -> None:
        """A message arrived from the server."""
        self._last_contact = self._clock()

    def set_received(self, lsn: int, wire_bytes: int, wal_bytes: int) -> None:
        """WAL up to ``lsn`` arrived, costing ``wire_bytes`` on the wire for ``wal_bytes``."""
        self._received = max(self._received, lsn)
        self._wire += wire_bytes
        self._wal += wal_bytes

    def set_written(self, lsn: int) -> None:
        """WAL up to ``lsn`` is written."""
        self._written = lsn

    def set_flushed(self, lsn: int) -> None:
        """WAL up to ``lsn`` is durable."""
        self._flushed = lsn

    def set_server_wal_end(self, lsn: int) -> None:
        """The server says its WAL ends at ``lsn``."""
        self._server_wal_end = lsn

    def set_streaming(self, timeline: int | None, streaming: bool) -> None:
        """A stream opened (on ``timeline``) or closed."""
        if timeline is not None:
            self._timeline = timeline
        self._streaming = streaming
        self._slots = {slot: (lsn, streaming) for slot, (lsn, _) in self._slots.items()}

    def set_slot(self, slot: str, restart_lsn: int | None, active: bool) -> None:
        """The slot's restart_lsn (None: unknown or dropped) and whether we stream through it."""
        lsn = math.nan if restart_lsn is None else float(restart_lsn)
        self._slots = {**self._slots, slot: (lsn, active)}

    def set_uploads(self, status: UploadStatus) -> None:
        """The uploader's backlog and last error (--upload-to)."""
        self._uploads = status

    def set_local_copy(self, status: LocalCopyStatus) -> None:
        """What the local copy's rule left and removed (--keep-local)."""
        self._local = status

    def set_archive(self, wal_bytes: int, backup_bytes: int, backups: int,
                    oldest_lsn: int | None, oldest_time: float | None) -> None:
        """The archive's size and oldest recoverable point (None: no backup to recover)."""
        self._archive = (wal_bytes, backup_bytes, backups,
                         math.nan if oldest_lsn is None else float(oldest_lsn),
                         math.nan if oldest_time is None else oldest_time)

    def set_compression(self, algorithm: str | None) -> None:
        """The compression of the current stream (None: uncompressed)."""
        self._algorithm = algorithm or "none"

    # -- scrape -----------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """Every metric as prometheus-client families (the collector protocol)."""
        from prometheus_client.core import (  # noqa: PLC0415 - only when serving
            CounterMetricFamily,
            GaugeMetricFamily,
            InfoMetricFamily,
        )

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value,
                                       created=self._started)

        yield gauge("received_lsn", "End of the WAL (or of a logical slot's messages) received "
                    "from the server (LSN)", self._received)
        yield gauge("written_lsn", "End of the WAL written to the archive (LSN); for a logical "
                    "receiver, of what the slot sent that the change log has taken", self._written)
        yield gauge("flushed_lsn",
                    "End of the WAL fsynced in the archive (LSN); for a logical receiver, the "
                    "position the slot is confirmed to (its durable commits); reported to the "
                    "server", self._flushed)
        yield gauge("server_wal_end_lsn",
                    "The server's WAL end: IDENTIFY_SYSTEM's, then the walEnd of every "
                    "XLogData and keepalive (LSN)",
                    self._server_wal_end)
        yield gauge("lag_bytes", "Bytes between the server's WAL end and the flushed LSN",
                    self._lag())
        yield gauge("last_message_age_seconds",
                    "Seconds since the last message from the server (since start when none yet)",
                    self._age())
        yield gauge("timeline", "Timeline being streamed", self._timeline)
        yield gauge("streaming", "1 while a replication stream is open, else 0",
                    1 if self._streaming else 0)
        yield counter("wire_bytes",
                      "Bytes of replication messages received on the wire (after compression)",
                      self._wire)
        yield counter("wal_bytes", "Bytes of WAL payload received (after decompression); for a "
                      "logical receiver, of its replication messages as sent plain (headers "
                      "included)", self._wal)
        yield gauge("compression_ratio", "wal_bytes per wire byte since start (1 when "
                    "uncompressed)", self._ratio())
        yield InfoMetricFamily(f"{PREFIX}_compression", "Compression of the current stream",
                               value={"algorithm": self._algorithm})
        yield counter("segments_completed",
                      "Files completed under their final name: WAL segments, or a logical "
                      "receiver's change log files", self.segments_completed.value)
        yield counter("reconnects", "Reconnection attempts after a lost connection",
                      self.reconnects.value)
        yield from self._labelled(CounterMetricFamily, GaugeMetricFamily)
        if self._uploads is not None:
            yield from self._upload_metrics(self._uploads, gauge, counter, InfoMetricFamily)
        if self._local is not None:
            yield gauge("local_bytes", "Bytes of the files the archive directory holds, as the "
                        "local copy's rule (--keep-local) last left it", self._local.held_bytes)
            yield counter("local_removed_files", "Uploaded segment files the local copy's "
                          "rule removed since start", self._local.removed_files)
            yield counter("local_removed_bytes", "Bytes the local copy's rule removed since "
                          "start", self._local.removed_bytes)
        if self._archive is not None:
            wal_bytes, backup_bytes, backups, oldest_lsn, oldest_time = self._archive
            yield gauge("archive_wal_bytes", "Bytes of the archive's WAL files (segments, "
                        ".partial and history files), as last measured", wal_bytes)
            yield gauge("archive_backup_bytes", "Bytes of the archive's base backups, as last "
                        "measured", backup_bytes)
            yield gauge("archive_backups", "Complete base backups in the archive", backups)
            yield gauge("oldest_recoverable_lsn", "Start (LSN) of the oldest complete backup "
                        "whose WAL the archive holds (NaN: none)", oldest_lsn)
            yield gauge("oldest_recoverable_timestamp_seconds", "Start time of that backup "
                        "(seconds since the epoch; NaN: none)", oldest_time)

    def _upload_metrics(self, status: UploadStatus, gauge: Callable[[str, str, float], Metric],
                        counter: Callable[[str, str, float], Metric],
                        info_family: type[InfoMetricFamily]) -> Iterator[Metric]:
        oldest = status.oldest_pending
        yield gauge("upload_pending_files", "Completed files waiting for their upload",
                    status.pending_files)
        yield gauge("upload_pending_bytes", "Bytes of the completed files waiting for upload",
                    status.pending_bytes)
        yield gauge("upload_oldest_pending_age_seconds", "Seconds since the oldest file "
                    "waiting for upload was completed (0 when none waits)",
                    0.0 if oldest is None else max(self._clock() - oldest, 0.0))
        yield counter("uploaded_files", "Files uploaded since start", status.uploaded_files)
        yield counter("uploaded_bytes", "Bytes uploaded since start", status.uploaded_bytes)
        yield gauge("upload_failing", "1 while the last upload try failed, else 0",
                    0 if status.failing_since is None else 1)
        error = status.last_error
        yield gauge("upload_last_error_timestamp_seconds", "When the last upload try failed "
                    "(seconds since the epoch; 0: never)", 0.0 if error is None else error.at)
        yield info_family(f"{PREFIX}_upload_last_error", "Kind of the last failed upload try",
                          value={"kind": "none" if error is None else error.kind})
        stopped = status.stopped
        yield gauge("upload_stopped", "1 while the uploads are stopped at an object by an error "
                    "that waiting does not cure (a different object at its key, a refused "
                    "request, an identity object of another cluster or unreadable), else 0",
                    0 if stopped is None else 1)
        yield info_family(f"{PREFIX}_upload_stopped_object", "The object the uploads are "
                          "stopped at, and the kind of error (none: not stopped)",
                          value={"kind": "none" if stopped is None else stopped.kind,
                                 "object": status.stopped_object or ""})

    def _labelled(self, counter_family: type[CounterMetricFamily],
                  gauge_family: type[GaugeMetricFamily]) -> Iterator[Metric]:
        errors = counter_family(f"{PREFIX}_errors",
                                "Errors by kind (exception class or condition)", labels=("kind",))
        for kind, count in list(self.errors.counts.items()):
            errors.add_metric((kind,), count.value, created=self._started)
        yield errors
        slots = self._slots
        restart = gauge_family(f"{PREFIX}_slot_restart_lsn",
                               "restart_lsn of the replication slot (LSN): read at connect, "
                               "then the flush position last reported to the server (a "
                               "logical slot: the position confirmed to it)",
                               labels=("slot",))
        active = gauge_family(f"{PREFIX}_slot_active",
                              "1 while this daemon streams through the slot, else 0",
                              labels=("slot",))
        for slot, (lsn, is_active) in slots.items():
            restart.add_metric((slot,), lsn)
            active.add_metric((slot,), 1 if is_active else 0)
        yield restart
        yield active

    # -- HTTP endpoint ----------------------------------------------------------------------

    def serve(self, address: Address) -> Address:
        """Serve ``/metrics`` on ``address`` from a daemon thread; return the bound address.

        Raise ConfigurationError when the address cannot be bound (in use, not local...).
        """
        from receivewal.daemon.endpoint import serve_collector  # noqa: PLC0415 - only then

        server = serve_collector(address, self)
        self._server = server
        host, port = server.server_address[:2]
        return Address(str(host), int(port))

    def close(self) -> None:
        """Stop the HTTP endpoint, if any."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
