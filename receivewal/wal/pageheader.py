"""WAL page headers (pure): the one place that knows their layout.

Every 8 kB page of a segment starts with a short header (magic, flags, timeline, page address,
continuation length); the first page of a segment has the long one, which adds the system
identifier, the segment size and the block size. Layouts are PostgreSQL 15's.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from receivewal.wal.lsn import format_lsn

XLOG_PAGE_MAGIC = 0xD110  # PostgreSQL 15
XLOG_BLCKSZ = 8192
SIZE_OF_SHORT_PHD = 24
SIZE_OF_LONG_PHD = 40
XLP_FIRST_IS_CONTRECORD = 0x0001
XLP_LONG_HEADER = 0x0002
XLP_FIRST_IS_OVERWRITE_CONTRECORD = 0x0008
XLP_ALL_FLAGS = 0x000F
MAX_SYSTEM_IDENTIFIER = 0xFFFFFFFFFFFFFFFF  # xlp_sysid is a uint64

SHORT_HEADER = struct.Struct("<HHIQI")  # xlp_magic, xlp_info, xlp_tli, xlp_pageaddr, xlp_rem_len
LONG_FIELDS = struct.Struct("<QII")  # xlp_sysid, xlp_seg_size, xlp_xlog_blcksz (at offset 24)


@dataclass(frozen=True)
class LongPageHeader:
    """The header of a segment's first page."""

    magic: int
    info: int
    timeline: int
    page_address: int
    rem_len: int
    system_identifier: int
    segment_size: int
    block_size: int


def parse_long_header(data: bytes | memoryview) -> LongPageHeader | None:
    """The long header at the start of ``data``; None when ``data`` is too short to hold one.

    Nothing is validated here: see :func:`first_page_problem`.
    """
    if len(data) < SIZE_OF_LONG_PHD:
        return None
    return LongPageHeader(*SHORT_HEADER.unpack_from(data), *LONG_FIELDS.unpack_from(
        data, SIZE_OF_SHORT_PHD))


def first_page_problem(  # noqa: PLR0911 - one return per check, as xlogreader reports
        header: LongPageHeader, *, timeline: int, page_address: int, segment_size: int,
        system_identifier: int | None = None) -> str | None:
    """Why ``header`` cannot start the segment its file name promises, or None."""
    if header.magic != XLOG_PAGE_MAGIC:
        return f"invalid magic number {header.magic:04X}, expected {XLOG_PAGE_MAGIC:04X}"
    if not header.info & XLP_LONG_HEADER or header.info & ~XLP_ALL_FLAGS:
        return f"invalid info bits {header.info:04X} on the first page"
    if header.page_address != page_address:
        return (f"page address {format_lsn(header.page_address)}, expected "
                f"{format_lsn(page_address)}")
    if header.timeline == 0 or header.timeline > timeline:
        return f"page timeline {header.timeline} does not belong in a timeline {timeline} file"
    if header.segment_size != segment_size:
        return f"segment size {header.segment_size} in page header, expected {segment_size}"
    if header.block_size != XLOG_BLCKSZ:
        return f"block size {header.block_size} in page header, expected {XLOG_BLCKSZ}"
    if system_identifier is not None and header.system_identifier != system_identifier:
        return (f"system identifier {header.system_identifier}, expected "
                f"{system_identifier}")
    return None
