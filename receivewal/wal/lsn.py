"""Log sequence numbers and WAL segment arithmetic (pure)."""

from __future__ import annotations

from receivewal.errors import ConfigurationError

TYPE_CHECKING = False  # restore's lean path loads no typing (~10 ms): see receivewal.restore
if TYPE_CHECKING:
    import re

LSN_PATTERN = r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$"
# sscanf("%X/%X"): white space, a sign and 0x may lead each number; anything may follow
_HEX = r"[ \t\n\v\f\r]*[+-]?(?:0[xX])?([0-9A-Fa-f]+)"
_SCANF_PATTERN = _HEX + "/" + _HEX

MIN_SEGMENT_SIZE = 1 << 20
MAX_SEGMENT_SIZE = 1 << 30
DEFAULT_SEGMENT_SIZE = 16 << 20  # PostgreSQL's default wal_segment_size


def parse_lsn(text: str) -> int:
    """Parse ``X/X`` as PostgreSQL prints an LSN; raise ConfigurationError otherwise."""
    match = _compiled(LSN_PATTERN).match(text.strip())
    if match is None:
        raise ConfigurationError(f"invalid LSN {text!r}: expected the form X/X, e.g. 0/3000000")
    return join_lsn(int(match.group(1), 16), int(match.group(2), 16))


def scan_lsn(text: str) -> int | None:
    """Read an LSN as PostgreSQL's programs do with ``sscanf("%X/%X")`` (pg_receivewal's
    ``--endpos``): each number may have leading white space, a sign and ``0x``, only its low
    32 bits count, and anything may follow. None when the text does not start so."""
    match = _compiled(_SCANF_PATTERN).match(text)
    if match is None:
        return None
    return join_lsn(int(match.group(1), 16) & 0xFFFFFFFF, int(match.group(2), 16) & 0xFFFFFFFF)


def _compiled(pattern: str) -> re.Pattern[str]:
    """``pattern`` compiled; ``re`` is imported on first use, not by a restore_command call
    that only needs the segment arithmetic."""
    import re  # noqa: PLC0415

    return re.compile(pattern)  # re caches compiled patterns


def join_lsn(high: int, low: int) -> int:
    """The LSN whose halves (``%X/%X``) are ``high`` and ``low``."""
    return high << 32 | low


def lsn_halves(lsn: int) -> tuple[int, int]:
    """The two 32-bit halves PostgreSQL prints as %X/%X (for a line built as one format)."""
    return lsn >> 32, lsn & 0xFFFFFFFF


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
