"""The files the archive completes travel as typed events on the daemon's one stream: the
writer names each segment once it is durable under its final name, and the stream hands
every event to its subscribers in order, those posted from another thread first."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from receivewal.archive.compression import NO_COMPRESSION, CompressSpec
from receivewal.archive.directory import Archive
from receivewal.archive.writer import open_segment_writer
from receivewal.daemon.events import Event, EventStream, HistoryFileWritten, Tick

SEG = 1 << 20
FIRST, SECOND = "000000010000000000000000", "000000010000000000000001"


@pytest.mark.parametrize(("sync", "compress"), [
    (True, NO_COMPRESSION), (False, NO_COMPRESSION), (True, CompressSpec("gzip")),
])
def test_completed_segments_are_named_once_in_place(
        tmp_path: Path, sync: bool, compress: CompressSpec) -> None:
    """Each segment the writer completes is named once, in order, with the LSN it ends at, and
    only once it is under its final name (from the background syncer too); the open one is
    not."""
    archive = Archive(tmp_path, sync=sync)
    sink = open_segment_writer(archive, SEG, 1, 0, compress)
    suffix = ".gz" if compress.method else ""
    seen: list[tuple[str, int]] = []
    try:
        sink.write(0, b"x" * (2 * SEG + 100))
        assert sink.flush(wait=True) == sink.position == 2 * SEG + 100
        for name, end in sink.completed():
            assert (tmp_path / name).is_file(), f"{name} not yet in place"
            seen.append((name, end))
        assert sink.completed() == []
    finally:
        sink.close()
    assert seen == [(FIRST + suffix, SEG), (SECOND + suffix, 2 * SEG)]


def test_the_stream_hands_posted_events_over_first_and_unsubscribes() -> None:
    """Events posted from another thread reach the subscribers on the stream's thread, before
    the next event stated there; a subscriber placed before another gets each event first
    (before one not subscribed: last); an unsubscribed one hears nothing more."""
    order: list[tuple[str, Event]] = []

    def listener(event: Event) -> None:
        order.append(("listener", event))

    def stranger(event: Event) -> None:
        raise AssertionError(event)

    stream = EventStream(lambda event: order.append(("log", event)))
    drop_listener = stream.subscribe(listener)
    drop_monitor = stream.subscribe(lambda event: order.append(("monitor", event)),
                                    before=listener)
    drop_last = stream.subscribe(lambda event: order.append(("last", event)), before=stranger)
    posted = HistoryFileWritten("00000002.history", 2)
    thread = threading.Thread(target=stream.post, args=(posted,))
    thread.start()
    thread.join()
    assert order == []  # nothing is handed over on the posting thread
    tick = Tick(1.0)
    stream(tick)
    assert order == [(who, event) for event in (posted, tick)
                     for who in ("log", "monitor", "listener", "last")]
    for unsubscribe in (drop_listener, drop_monitor, drop_last):
        unsubscribe()
    order.clear()
    stream(tick)
    assert order == [("log", tick)]
