"""What the relay counts about the clients it admits and refuses, and how often it says so.

:class:`RelayStats` holds plain numbers that :class:`~receivewal.relay.server.Relay` updates
on its event loop and a scrape reads (``--metrics-address``: :meth:`RelayStats.collect` is a
prometheus-client collector, imported only when metrics are served). :class:`LogThrottle`
keeps a flood of refused or silent connections from flooding the log: one line per event per
:data:`LOG_INTERVAL` seconds, carrying how many it stands for. Pure: no sockets, no clock of
its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

PREFIX = "receivewal_relay"
LOG_INTERVAL = 10.0  # seconds between two log lines of one throttled event
#: Why a connection was refused (the ``reason`` label of receivewal_relay_refused_total).
REFUSAL_REASONS = ("outside_allow", "too_many_connections", "tls_required",
                   "client_certificate_required", "overloaded")


@dataclass(eq=False)  # hashable by identity: prometheus-client keeps collectors in a dict
class RelayStats:
    """The relay's counts since it started, and its clients now."""

    clock: Callable[[], float] = time.time
    started: float = field(init=False)
    serving: int = 0
    """Clients past their startup packet, being served now."""
    negotiating: int = 0
    """Connections accepted that have not sent their startup packet yet."""
    accepted: int = 0
    served: int = 0
    startup_timeouts: int = 0
    evicted: int = 0
    """Connections still negotiating closed to make room for a newer one."""
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REFUSAL_REASONS, 0))

    def __post_init__(self) -> None:
        self.started = self.clock()

    def collect(self) -> Iterator[Metric]:
        """Every metric as prometheus-client families (the collector protocol)."""
        from prometheus_client.core import (  # noqa: PLC0415 - only when serving metrics
            CounterMetricFamily,
            GaugeMetricFamily,
        )

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value,
                                       created=self.started)

        yield GaugeMetricFamily(f"{PREFIX}_clients", "Clients being served now (past their "
                                "startup packet; --max-connections caps them)", value=self.serving)
        yield GaugeMetricFamily(f"{PREFIX}_negotiating", "Connections accepted that have not "
                                "sent their startup packet yet", value=self.negotiating)
        yield counter("connections", "Connections accepted", self.accepted)
        yield counter("clients_served", "Clients let through to the upstream", self.served)
        yield counter("startup_timeouts", "Connections closed at --startup-timeout",
                      self.startup_timeouts)
        yield counter("startup_evicted", "Connections still negotiating closed to make room "
                      "for a newer one", self.evicted)
        refused = CounterMetricFamily(f"{PREFIX}_refused", "Connections refused, by reason",
                                      labels=("reason",))
        for reason, count in self.refused.items():
            refused.add_metric((reason,), count, created=self.started)
        yield refused


@dataclass
class LogThrottle:
    """At most one log line per event per ``interval`` seconds; the ones held back are
    counted and reported with the next line that goes out (``suppressed``)."""

    interval: float = LOG_INTERVAL
    clock: Callable[[], float] = time.monotonic
    _last: dict[str, float] = field(default_factory=dict)
    _held: dict[str, int] = field(default_factory=dict)

    def admit(self, event: str) -> dict[str, int] | None:
        """None when this occurrence of ``event`` is not to be logged (it is counted);
        otherwise the fields to add to its line: ``suppressed`` when some were held back."""
        now = self.clock()
        last = self._last.get(event)
        if last is not None and now - last < self.interval:
            self._held[event] = self._held.get(event, 0) + 1
            return None
        self._last[event] = now
        held = self._held.pop(event, 0)
        return {"suppressed": held} if held else {}
