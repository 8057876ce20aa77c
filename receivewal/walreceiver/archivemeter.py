"""The archive measured now and then, for the metrics: a thread of the WAL receiver's, started
only when metrics are served, that posts :class:`~receivewal.daemon.events.ArchiveMeasured`
(the size of the WAL files and of the backups, the oldest recoverable point:
:func:`~receivewal.retention.summary.summarize`) at start and every
``RECEIVEWAL_ARCHIVE_MEASURE_SECONDS`` (60 by default), a
:class:`~receivewal.daemon.worker.Worker`. Off the main thread: listing a large
archive must not hold the COPY loop up.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from receivewal.daemon.events import ArchiveMeasured, EventStream
from receivewal.daemon.worker import Worker
from receivewal.errors import ReceivewalError
from receivewal.logs import get_logger
from receivewal.retention.summary import summarize

INTERVAL_ENV = "RECEIVEWAL_ARCHIVE_MEASURE_SECONDS"
DEFAULT_INTERVAL = 60.0

log = get_logger(component="archivemeter")


def measure_interval(environ: Mapping[str, str]) -> float:
    """The seconds between two measures (the default when the variable is unset or not a
    positive number)."""
    try:
        value = float(environ.get(INTERVAL_ENV, DEFAULT_INTERVAL))
    except ValueError:
        return DEFAULT_INTERVAL
    return value if value > 0 else DEFAULT_INTERVAL


class ArchiveMeter(Worker):
    """Measures ``directory`` every ``interval`` seconds and posts what it found on
    ``events``."""

    close_seconds = 5.0  # a measure under way ends first, a few seconds at most

    def __init__(self, directory: Path, events: EventStream, interval: float) -> None:
        super().__init__("archive-meter", events)
        self.directory = directory
        self.interval = interval
        self._failure: str | None = None

    def start(self) -> None:
        """Measure now, then every interval."""
        self.start_thread()

    def run(self) -> None:
        while self.await_due(self.interval):
            self.measure()

    def measure(self) -> None:
        """One measure, posted; a failure is logged once, until a measure succeeds."""
        try:
            summary = summarize(self.directory)
        except (ReceivewalError, OSError) as exc:
            if str(exc) != self._failure:
                log.warning("archive_measure_failed", directory=str(self.directory),
                            error=str(exc))
            self._failure = str(exc)
            return
        self._failure = None
        oldest = summary.oldest_time
        self.events.post(ArchiveMeasured(summary.wal_bytes, summary.backup_bytes, summary.backups,
                                   summary.oldest_lsn,
                                   None if oldest is None else oldest.timestamp()))
