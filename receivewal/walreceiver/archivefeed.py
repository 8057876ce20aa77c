"""The WAL archive as the COPY loop's consumer: one timeline's WAL into segment files.

:class:`ArchiveFeed` is physical streaming's
:class:`~receivewal.daemon.copyloop.StreamConsumer`. The runs of WAL go to the segment writer
(:mod:`receivewal.archive.writer`), the one holder of the flushed position; the feed states
the writer's facts on the event stream: each segment once it is complete and durable under its
final name (:class:`~receivewal.daemon.events.SegmentCompleted`, the uploader follows them),
and the WAL durable in the archive each time that moves
(:class:`~receivewal.daemon.events.Flushed`: what the monitor, the state file and the metrics
show as flushed). With --confirm-after upload, the flush position the server is told stops at
the end of the last segment uploaded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from receivewal.archive.compression import CompressSpec
from receivewal.archive.directory import Archive
from receivewal.archive.sealed import Sealing
from receivewal.archive.writer import SegmentWriter, open_segment_writer
from receivewal.daemon.events import Flushed, Listener, SegmentCompleted
from receivewal.replication.link import WalRun


class ArchiveFeed:
    """``writer``'s timeline fed by the COPY loop; its facts go to ``events``; ``confirm``
    caps the flush position reported (None: the writer's)."""

    def __init__(self, writer: SegmentWriter, events: Listener,
                 confirm: Callable[[int], int] | None = None) -> None:
        self.writer = writer
        self.events = events
        self.confirm = confirm
        self._stated: int | None = None  # the durable position the last Flushed stated

    @classmethod
    def open(cls, archive: Archive, segment_size: int, timeline: int, start_lsn: int, *,
             compress: CompressSpec, events: Listener, kept: int = 0,
             stopping: Callable[[], bool] | None = None,
             confirm: Callable[[int], int] | None = None,
             sealing: Sealing | None = None) -> ArchiveFeed:
        """A feed of ``timeline`` from ``start_lsn`` into ``archive``, in the at-rest form
        ``compress`` says; ``kept``: the LSN up to which the last run made this timeline's
        WAL durable (a plain ``.partial`` restreamed keeps it); ``stopping`` says whether a
        stop signal came (the disk's waits are bounded after one); ``sealing``
        (``--encrypt-to``): each completed segment is sealed."""
        writer = open_segment_writer(archive, segment_size, timeline, start_lsn, compress,
                                     kept=kept, stopping=stopping, sealing=sealing)
        return cls(writer, events, confirm)

    @property
    def position(self) -> int:
        """The LSN the next byte of WAL must have."""
        return self.writer.position

    @property
    def timeline(self) -> int:
        """The timeline fed."""
        return self.writer.timeline

    @property
    def durable(self) -> int:
        """The LSN up to which this timeline's WAL is durable in the archive."""
        return self.writer.durable

    def receive(self, run: WalRun) -> None:
        """Write the run's WAL (a gap or an overlap raises before anything is written)."""
        # a physical stream's runs follow on: views of libpq's buffers (only a scattered run,
        # a logical stream's, is handed over as bytes)
        self.writer.write(run.wal_start, cast("list[memoryview]", run.payload))

    def keepalive(self, wal_end: int) -> None:
        """Nothing to do: the server's WAL end is the monitor's to show."""

    def flush(self, wait: bool = False) -> int:
        """fsync what is written (``wait``: also the segments completing in the background);
        the flush position to report."""
        flush = self.writer.flush(wait)
        self._state_flushed()
        return flush if self.confirm is None else self.confirm(flush)

    def report(self) -> bool:
        """State the segments completed and durable since the last call, and the flushed
        (durable) position they moved; whether there was any."""
        completed = self.writer.completed()
        for name, end in completed:
            self.events(SegmentCompleted(name, self.writer.timeline, self.writer.position, end))
        if completed:
            self._state_flushed()
        return bool(completed)

    def close(self) -> None:
        """fsync and close (the open segment stays ``.partial``); state what that completed."""
        try:
            self.writer.close()
        finally:
            self.report()

    def _state_flushed(self) -> None:
        """State the WAL durable in the archive (the writer's) when it moved since the last
        time."""
        durable = self.writer.durable
        if durable != self._stated:
            self._stated = durable
            self.events(Flushed(durable))
