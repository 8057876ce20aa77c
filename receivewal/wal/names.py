"""The archive's naming rules (pure): WAL segment, `.partial`, compressed and history file names.

A segment file is named ``TTTTTTTTXXXXXXXXYYYYYYYY``: timeline, then the segment number split
into a "log" part and a "seg" part, each eight upper-case hex digits, as PostgreSQL names the
files in ``pg_wal``. An archive may also hold the same name with a compression suffix (``.gz``
and ``.lz4`` as pg_receivewal 15 writes them, ``.zst`` which receivewal adds) and with a
``.partial`` suffix for a segment that is still being received.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from receivewal.wal.lsn import segment_start

PARTIAL_SUFFIX = ".partial"
COMPRESSION_SUFFIXES = {"": "", "gzip": ".gz", "lz4": ".lz4", "zstd": ".zst"}
_SUFFIX_TO_METHOD = {suffix: method for method, suffix in COMPRESSION_SUFFIXES.items()}

_SEGMENT_RE = re.compile(
    r"^([0-9A-F]{8})([0-9A-F]{8})([0-9A-F]{8})(\.gz|\.lz4|\.zst)?(\.partial)?$"
)
_HISTORY_RE = re.compile(r"^([0-9A-F]{8})\.history$")


def segments_per_xlogid(segment_size: int) -> int:
    """How many segments share one "log" number in a file name."""
    return 0x100000000 // segment_size


@dataclass(frozen=True, order=True)
class SegmentFile:
    """A parsed segment file name. Orders by segment number, then timeline."""

    segno: int
    timeline: int
    compression: str = ""  # "", "gzip", "lz4" or "zstd"
    partial: bool = False

    def wal_name(self, segment_size: int) -> str:
        """The bare WAL file name, without compression or `.partial` suffix."""
        return wal_file_name(self.timeline, self.segno, segment_size)

    def file_name(self, segment_size: int) -> str:
        """The name of this file as it stands in the archive."""
        suffix = COMPRESSION_SUFFIXES[self.compression]
        return self.wal_name(segment_size) + suffix + (PARTIAL_SUFFIX if self.partial else "")

    def start_lsn(self, segment_size: int) -> int:
        """The LSN of the segment's first byte."""
        return segment_start(self.segno, segment_size)


def wal_file_name(timeline: int, segno: int, segment_size: int) -> str:
    """The name PostgreSQL gives segment ``segno`` of ``timeline``."""
    per_id = segments_per_xlogid(segment_size)
    return f"{timeline:08X}{segno // per_id:08X}{segno % per_id:08X}"


def parse_segment_file_name(name: str, segment_size: int) -> SegmentFile | None:
    """Parse an archive file name; None when the name is not a segment file's."""
    match = _SEGMENT_RE.match(name)
    if match is None:
        return None
    timeline = int(match.group(1), 16)
    log, seg = int(match.group(2), 16), int(match.group(3), 16)
    per_id = segments_per_xlogid(segment_size)
    if timeline == 0 or seg >= per_id:
        return None
    return SegmentFile(
        segno=log * per_id + seg,
        timeline=timeline,
        compression=_SUFFIX_TO_METHOD[match.group(4) or ""],
        partial=match.group(5) is not None,
    )


def history_file_name(timeline: int) -> str:
    """The name of the history file that describes how ``timeline`` began."""
    return f"{timeline:08X}.history"


def parse_history_file_name(name: str) -> int | None:
    """The timeline a history file name is for; None when it is not one."""
    match = _HISTORY_RE.match(name)
    return int(match.group(1), 16) if match else None
