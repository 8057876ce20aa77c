"""Log sequence numbers and WAL segment arithmetic (pure)."""

from __future__ import annotations

import re

from receivewal.errors import ConfigurationError

LSN_RE = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")

MIN_SEGMENT_SIZE = 1 << 20
MAX_SEGMENT_SIZE = 1 << 30
DEFAULT_SEGMENT_SIZE = 16 << 20  # PostgreSQL's default wal_segment_size


def parse_lsn(text: str) -> int:
    """Parse ``X/X`` as PostgreSQL prints an LSN; raise ConfigurationError otherwise."""
    match = LSN_RE.match(text.strip())
    if match is None:
        raise ConfigurationError(f"invalid LSN {text!r}: expected the form X/X, e.g. 0/3000000")
    return (int(match.group(1), 16) << 32) | int(match.group(2), 16)


def format_lsn(lsn: int) -> str:
    """Print an LSN the way PostgreSQL does (``%X/%X``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def check_segment_size(size: int) -> int:
    """Return ``size`` when it is a valid wal_segment_size: a power of two, 1 MiB to 1 GiB."""
    if size & (size - 1) or not MIN_SEGMENT_SIZE <= size <= MAX_SEGMENT_SIZE:
        raise ConfigurationError(
            f"invalid WAL segment size {size} bytes: must be a power of two "
            "between 1 MB and 1 GB"
        )
    return size


def segment_of(lsn: int, segment_size: int) -> int:
    """The number of the segment that holds the byte at ``lsn``."""
    return lsn // segment_size


def segment_start(segno: int, segment_size: int) -> int:
    """The LSN of the first byte of segment ``segno``."""
    return segno * segment_size


def round_down_to_segment(lsn: int, segment_size: int) -> int:
    """The start of the segment that holds ``lsn``."""
    return lsn - lsn % segment_size
