"""Prometheus metrics, served over HTTP with prometheus-client when ``--metrics-address`` is set.

:class:`Metrics` owns its own CollectorRegistry (never the global one, so tests and several
instances in one process do not collide) and is updated by the monitor; :meth:`Metrics.serve`
starts the HTTP endpoint. :func:`parse_address` is pure.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, start_http_server

# Re-exported (the monitor imports them from here).
from receivewal.addresses import Address as Address  # noqa: PLC0414
from receivewal.addresses import parse_address as parse_address  # noqa: PLC0414
from receivewal.errors import ConfigurationError

PREFIX = "receivewal"


class Metrics:
    """The daemon's metrics in their own registry; the monitor feeds them."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.registry = CollectorRegistry()
        self._clock = clock
        self._started = clock()
        self._last_contact: float | None = None
        self._received = 0
        self._flushed = 0
        self._server_wal_end = 0
        self._wire = 0
        self._wal = 0
        self._server: WSGIServer | None = None
        self._slot_active: dict[str, bool] = {}

        reg = self.registry

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(f"{PREFIX}_{name}", doc, labels, registry=reg)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(f"{PREFIX}_{name}", doc, labels, registry=reg)

        self.received_lsn = gauge("received_lsn", "End of the WAL received from the server (LSN)")
        self.written_lsn = gauge("written_lsn", "End of the WAL written to the archive (LSN)")
        self.flushed_lsn = gauge(
            "flushed_lsn", "End of the WAL fsynced in the archive (LSN); reported to the server"
        )
        self.server_wal_end = gauge(
            "server_wal_end_lsn", "The server's WAL end, from its keepalives and messages (LSN)"
        )
        self.lag_bytes = gauge(
            "lag_bytes", "Bytes between the server's WAL end and the flushed LSN"
        )
        self.lag_bytes.set_function(self._lag)
        self.last_message_age = gauge(
            "last_message_age_seconds",
            "Seconds since the last message from the server (since start when none yet)",
        )
        self.last_message_age.set_function(self._age)
        self.timeline = gauge("timeline", "Timeline being streamed")
        self.streaming = gauge("streaming", "1 while a replication stream is open, else 0")
        self.wire_bytes = counter(
            "wire_bytes", "Bytes of replication messages received on the wire (after compression)"
        )
        self.wal_bytes = counter("wal_bytes", "Bytes of WAL payload received (after decompression)")
        self.compression_ratio = gauge(
            "compression_ratio", "WAL bytes per wire byte since start (1 when uncompressed)"
        )
        self.compression_ratio.set_function(self._ratio)
        self.compression_info = Info(
            f"{PREFIX}_compression", "Compression of the current stream", registry=reg
        )
        self.compression_info.info({"algorithm": "none"})
        self.segments_completed = counter(
            "segments_completed", "WAL segments completed and renamed to their final name"
        )
        self.reconnects = counter("reconnects", "Reconnection attempts after a lost connection")
        self.errors = counter("errors", "Errors by kind (exception class or condition)", ("kind",))
        self.slot_restart_lsn = gauge(
            "slot_restart_lsn", "restart_lsn of the replication slot (LSN)", ("slot",)
        )
        self.slot_active = gauge(
            "slot_active", "1 while this daemon streams through the slot, else 0", ("slot",)
        )

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
        self.received_lsn.set(self._received)
        self._wire += wire_bytes
        self._wal += wal_bytes
        self.wire_bytes.inc(wire_bytes)
        self.wal_bytes.inc(wal_bytes)

    def set_written(self, lsn: int) -> None:
        """WAL up to ``lsn`` is written."""
        self.written_lsn.set(lsn)

    def set_flushed(self, lsn: int) -> None:
        """WAL up to ``lsn`` is durable."""
        self._flushed = lsn
        self.flushed_lsn.set(lsn)

    def set_server_wal_end(self, lsn: int) -> None:
        """The server says its WAL ends at ``lsn``."""
        self._server_wal_end = lsn
        self.server_wal_end.set(lsn)

    def set_streaming(self, timeline: int | None, streaming: bool) -> None:
        """A stream opened (on ``timeline``) or closed."""
        if timeline is not None:
            self.timeline.set(timeline)
        self.streaming.set(1 if streaming else 0)
        for slot in self._slot_active:
            self._slot_active[slot] = streaming
            self.slot_active.labels(slot=slot).set(1 if streaming else 0)

    def set_slot(self, slot: str, restart_lsn: int | None, active: bool) -> None:
        """The slot's restart_lsn (None: unknown or dropped) and whether we stream through it."""
        self._slot_active[slot] = active
        self.slot_active.labels(slot=slot).set(1 if active else 0)
        self.slot_restart_lsn.labels(slot=slot).set(
            math.nan if restart_lsn is None else restart_lsn
        )

    def set_compression(self, algorithm: str | None) -> None:
        """The compression of the current stream (None: uncompressed)."""
        self.compression_info.info({"algorithm": algorithm or "none"})

    # -- HTTP endpoint ----------------------------------------------------------------------

    def serve(self, address: Address) -> Address:
        """Serve ``/metrics`` on ``address`` from a daemon thread; return the bound address.

        Raise ConfigurationError when the address cannot be bound (in use, not local...).
        """
        try:
            server, _thread = start_http_server(address.port, address.host, self.registry)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {format_address(address)}: {exc.strerror or exc}"
            ) from exc
        self._server = server
        host, port = server.server_address[:2]
        return Address(str(host), int(port))

    def close(self) -> None:
        """Stop the HTTP endpoint, if any."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def format_address(address: Address) -> str:
    """``HOST:PORT``, with brackets around an IPv6 address."""
    host = f"[{address.host}]" if ":" in address.host else address.host
    return f"{host}:{address.port}"
