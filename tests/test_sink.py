"""The receive loop's writes go through the SegmentSink interface, and the files it completes
come out as FileCompleted events to the archive's subscribers (issue 19 §1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from receivewal.archive.completions import FileCompleted, FileKind
from receivewal.archive.compression import NO_COMPRESSION, CompressSpec
from receivewal.archive.directory import Archive
from receivewal.archive.sink import SegmentSink, open_segment_sink

SEG = 1 << 20
FIRST, SECOND = "000000010000000000000000", "000000010000000000000001"


def durable_names(archive: Archive, seen: list[FileCompleted]) -> None:
    """Subscribe a listener that records each event with the file already in place."""

    def listen(event: FileCompleted) -> None:
        assert (archive.directory / event.name).is_file(), f"{event.name} not yet in place"
        seen.append(event)

    archive.completions.subscribe(listen)


@pytest.mark.parametrize(("sync", "compress"), [
    (True, NO_COMPRESSION), (False, NO_COMPRESSION), (True, CompressSpec("gzip")),
])
def test_completed_segments_come_out_as_events_once_in_place(
        tmp_path: Path, sync: bool, compress: CompressSpec) -> None:
    """Each segment the sink completes is told to every subscriber, in order, once it is
    under its final name (from the background syncer too); the open one is not."""
    archive = Archive(tmp_path, sync=sync)
    first: list[FileCompleted] = []
    second: list[FileCompleted] = []
    durable_names(archive, first)
    archive.completions.subscribe(second.append)
    sink: SegmentSink = open_segment_sink(archive, SEG, 1, 0, compress)
    try:
        sink.write(0, b"x" * (2 * SEG + 100))
        assert sink.flush(wait=True) == sink.position == 2 * SEG + 100
        completed = sink.completed()
    finally:
        sink.close()
    suffix = ".gz" if compress.method else ""
    expected = [FileCompleted(FIRST + suffix, FileKind.SEGMENT),
                FileCompleted(SECOND + suffix, FileKind.SEGMENT)]
    assert completed == [(e.name, end) for e, end in zip(expected, [SEG, 2 * SEG],
                                                           strict=True)]
    assert first == second == expected


def test_history_files_come_out_as_events(tmp_path: Path) -> None:
    """A history file written through the archive is told once durable; an unsubscribed
    listener hears nothing more."""
    archive = Archive(tmp_path)
    seen: list[FileCompleted] = []
    durable_names(archive, seen)
    gone: list[FileCompleted] = []
    unsubscribe = archive.completions.subscribe(gone.append)
    archive.write_history("00000002.history", b"1\t0/3000000\tno recovery target\n")
    unsubscribe()
    archive.write_history("00000003.history", b"2\t0/5000000\tno recovery target\n")
    assert seen == [FileCompleted("00000002.history", FileKind.HISTORY),
                    FileCompleted("00000003.history", FileKind.HISTORY)]
    assert gone == [FileCompleted("00000002.history", FileKind.HISTORY)]
