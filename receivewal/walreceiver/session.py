"""One replication connection into the WAL archive: find the start, stream, follow timelines.

Per connection: where to start (:mod:`receivewal.walreceiver.startpoint`, pg_receivewal's
FindStreamingStart: IDENTIFY_SYSTEM, what the archive holds, the slot, the history), then for
each timeline TIMELINE_HISTORY (when missing) and START_REPLICATION PHYSICAL, and the COPY loop
(:mod:`receivewal.daemon.copyloop`, receivelog.c's HandleCopyStream) feeding the archive
(:class:`~receivewal.walreceiver.archivefeed.ArchiveFeed`). When a timeline ends the server says
which one comes next, and streaming goes on on the same connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from receivewal.archive.directory import Archive
from receivewal.archive.listing import Listing
from receivewal.daemon import events as ev
from receivewal.daemon.copyloop import CopyLoop
from receivewal.daemon.settings import Settings
from receivewal.errors import WalRemovedError
from receivewal.replication.commands import read_timeline_end
from receivewal.replication.link import COPY_DONE, ReplicationLink
from receivewal.replication.waiting import StopFlag
from receivewal.wal.lsn import format_lsn, round_down_to_segment
from receivewal.wal.names import wal_file_name
from receivewal.walreceiver.archivefeed import ArchiveFeed
from receivewal.walreceiver.startpoint import Start, fetch_history, find_start

if TYPE_CHECKING:  # loaded only with --upload-to
    from receivewal.walreceiver.uploader import Uploader


@dataclass(frozen=True)
class TimelineEnd:
    """The server finished a timeline; streaming continues on ``timeline`` at ``start``."""

    timeline: int
    start: int


class Session:
    """One open connection streamed into the archive: :meth:`prepare` finds where to start,
    :meth:`run` streams until stopped, at --endpos, or on an error, :meth:`close` ends it."""

    def __init__(self, conn: ReplicationLink, *, settings: Settings, archive: Archive,
                 events: ev.Listener, stop: StopFlag, clock: Callable[[], float] = time.monotonic,
                 uploads: Uploader | None = None, listing: Listing | None = None,
                 previous: tuple[int, int] | None = None) -> None:
        self.conn = conn
        self.listing = listing  # the start-up's listing of the archive (the lock took it)
        self.uploads = uploads
        self.settings = settings
        self.archive = archive
        self.events = events  # every fact the session reports goes there
        self.stop = stop
        self.loop = CopyLoop(conn, settings, events, stop, clock)
        self.start: Start | None = None
        self.feed: ArchiveFeed | None = None  # the timeline streamed now
        self.previous = previous  # (timeline, LSN): the WAL durable when the last one ended
        self.announced = False  # Connected said (after the first START, so that
        # the state file's fsynced write does not delay START_REPLICATION)

    @property
    def durable(self) -> tuple[int, int] | None:
        """(timeline, LSN) up to which the archive's WAL is durable, as the session's writer
        says (before it has one: as the last session or run did): what the next session's
        writer keeps."""
        if self.feed is None:
            return self.previous
        return self.feed.timeline, self.feed.durable

    def _stopping(self) -> bool:
        """Whether a stop signal came (what the uploads and the disk's waits give up on)."""
        return self.stop.requested

    def prepare(self) -> None:
        """Find where to start (:func:`~receivewal.walreceiver.startpoint.find_start`).

        The archive directory is listed once per connection: the first uses the listing the
        lock took at start-up."""
        listing, self.listing = self.listing or self.archive.listing(), None
        self.start = find_start(self.conn, self.archive, listing, self.settings,
                                events=self.events, stopping=self._stopping,
                                uploads=self.uploads)

    def run(self) -> str:
        """Stream from the start through timeline switches; return "stopped" or "endpos"."""
        assert self.start is not None
        timeline, lsn = self.start.point.timeline, self.start.point.lsn
        while True:
            if timeline > 1:
                fetch_history(self.conn, self.archive, timeline, self.events)
            outcome = self._stream_timeline(timeline, lsn)
            if isinstance(outcome, str):
                return outcome
            self.events(ev.TimelineSwitched(outcome.timeline, timeline, outcome.start))
            timeline, lsn = outcome.timeline, outcome.start

    def close(self) -> None:
        """The connection ends (the COPY loop's summary)."""
        self.loop.close()

    def _stream_timeline(self, timeline: int, lsn: int) -> TimelineEnd | str:
        assert self.start is not None
        info = self.start.info
        confirm: Callable[[int], int] | None = None  # with --confirm-after upload, the slot
        # keeps what is not uploaded (of this timeline)
        if self.uploads is not None and self.settings.confirm_after == "upload":
            confirm = partial(self.uploads.confirmable, timeline=timeline)
        kept = self.previous[1] if self.previous and self.previous[0] == timeline else 0
        self.feed = feed = ArchiveFeed.open(self.archive, info.segment_size, timeline, lsn,
                                            compress=self.settings.at_rest, events=self.events,
                                            kept=kept, stopping=self._stopping,
                                            confirm=confirm, sealing=self.start.sealing)
        slot = f"SLOT {self.settings.slot} " if self.settings.slot else ""
        try:
            self.loop.start(f"START_REPLICATION {slot}PHYSICAL {format_lsn(lsn)} "
                            f"TIMELINE {timeline}")
            if not self.announced:
                self.events(ev.Connected(self.conn.describe(), info.system_identifier,
                                         info.timeline, self.settings.slot, info.xlogpos))
                self.announced = True
            self.events(ev.StreamingStarted(timeline, lsn, self.settings.slot,
                                            self.conn.receive_path))
            outcome = self.loop.run(feed, timeline)
            if outcome is not COPY_DONE:
                assert isinstance(outcome, str)
                return outcome
            feed.close()  # the server ended the copy: a timeline switch, or a shutdown
            next_tli, next_start = read_timeline_end(self.conn, timeline, feed.position)
            return TimelineEnd(next_tli, round_down_to_segment(next_start, info.segment_size))
        except WalRemovedError as exc:
            missing = wal_file_name(timeline, feed.position // info.segment_size,
                                    info.segment_size)
            raise WalRemovedError(
                f"the archive needs WAL from {format_lsn(feed.position)} on timeline "
                f"{timeline} (segment {missing}), which the server has removed; not skipping "
                f"ahead: {exc}", sqlstate=exc.sqlstate,
            ) from exc
        finally:
            feed.close()
