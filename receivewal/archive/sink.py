"""Where the receive loop's WAL goes: the :class:`SegmentSink` interface (as pg_receivewal's
walmethods.c puts its writes behind one), and the archive directory as its first implementation.

The receive loop (:mod:`receivewal.daemon.session`) only knows this interface:

* open: :func:`open_segment_sink` starts a timeline at an LSN; each segment is opened as its
  first byte arrives (a ``.partial``);
* write at an LSN: :meth:`SegmentSink.write`, which refuses a gap or an overlap before touching
  anything, and completes each segment whose last byte it writes;
* completed: :meth:`SegmentSink.completed` names the segments made durable under their final
  names since it was last asked (in the background, with a syncer);
* flush: :meth:`SegmentSink.flush` makes everything written durable and returns the flushed
  LSN (the one holder of that position, which the status update reports);
* close: :meth:`SegmentSink.close` leaves the open segment as ``.partial``, durable.

After a stop signal (``stopping``), the sink waits for the disk a bounded time only: flush then
returns what is durable, and close raises ArchiveNotDurable naming what is not.

The local directory's implementation is :mod:`receivewal.archive.writer`; another destination
(object storage) implements the same interface.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from receivewal.archive.compression import NO_COMPRESSION, CompressSpec
from receivewal.archive.directory import Archive
from receivewal.archive.writer import open_segment_writer


class SegmentSink(Protocol):
    """The writes of one timeline's WAL, one segment open at a time."""

    @property
    def timeline(self) -> int:
        """The timeline written."""

    @property
    def segment_size(self) -> int:
        """The size of the segments written."""

    @property
    def position(self) -> int:
        """The LSN the next byte must have (everything before it is written)."""

    @property
    def flushed(self) -> int:
        """The LSN up to which every byte is durable."""

    def write(self, lsn: int, data: bytes | memoryview | list[memoryview]) -> None:
        """Write WAL at ``lsn`` (which must be :attr:`position`), one buffer or pieces that
        follow on; a segment whose last byte it writes is completed."""

    def completed(self) -> list[tuple[str, int]]:
        """The segments complete and durable under their final names since the last call, each
        with the LSN it ends at, in order."""

    def flush(self, wait: bool = False) -> int:
        """Make what is written durable (``wait``: also what is being completed in the
        background); the new flushed LSN."""

    def close(self) -> None:
        """Flush and close; the open segment stays a ``.partial``."""


def open_segment_sink(archive: Archive, segment_size: int, timeline: int, start_lsn: int,
                      compress: CompressSpec = NO_COMPRESSION, *,
                      stopping: Callable[[], bool] | None = None) -> SegmentSink:
    """The archive directory as the sink of ``timeline`` from ``start_lsn``: plain segments,
    or compressed ones when ``compress`` names a method; ``stopping`` says whether a stop
    signal came."""
    return open_segment_writer(archive, segment_size, timeline, start_lsn, compress,
                               stopping=stopping)
