"""Synthetic WAL segments that the WAL reader accepts, for tests that need many valid segments
of any name, timeline, system identifier or size without a server.

Each segment holds XLOG_NOOP records (resource manager 0, one block of main data) of random
lengths and bytes, chained by ``xl_prev``, with their CRC-32C, crossing pages as PostgreSQL
writes them (each continuation page's ``XLP_FIRST_IS_CONTRECORD`` and ``xlp_rem_len``), and
ends with an XLOG_SWITCH record and zeros, so every segment stands alone and a run of them
reads as one stream. The bytes are a function of the arguments (a seeded generator): two
calls give the same segment. Real servers' WAL is in ``tests/data/wal`` and the PITR tests.
"""

from __future__ import annotations

import functools
import random
import struct

from receivewal.wal.majors import PAGE_MAGICS
from receivewal.wal.nativescan import crc32c_function
from receivewal.wal.pageheader import (
    LONG_FIELDS,
    SHORT_HEADER,
    SIZE_OF_LONG_PHD,
    SIZE_OF_SHORT_PHD,
    XLOG_BLCKSZ,
    XLP_FIRST_IS_CONTRECORD,
    XLP_LONG_HEADER,
)
from receivewal.wal.records import RECORD_HEADER

SEGMENT = 16 << 20
SYSID = 7311231231231231231
_XLOG_NOOP, _XLOG_SWITCH = 0x20, 0x40
_DATA_LONG = struct.Struct("<BI")  # XLR_BLOCK_ID_DATA_LONG and the data's length
_SWITCH_SPACE = 64  # room kept at the end of a segment for the switch record


def name_of(segno: int, timeline: int = 1, segment_size: int = SEGMENT) -> str:
    """The file name of segment ``segno``."""
    per_id = 0x1_0000_0000 // segment_size
    return f"{timeline:08X}{segno // per_id:08X}{segno % per_id:08X}"


def _record(body: bytes, prev: int, info: int) -> bytes:
    """One record: header (xl_crc over the body, then the header up to xl_crc) and body."""
    crc = crc32c_function()
    head = bytearray(RECORD_HEADER.pack(24 + len(body), 0, prev, info, 0, 0))
    value = crc(head[:20], crc(body))
    struct.pack_into("<I", head, 20, value)
    return bytes(head) + body


@functools.lru_cache(maxsize=32)
def wal_segment(segno: int, timeline: int = 1, system_identifier: int = SYSID,
                segment_size: int = SEGMENT, seed: int = 0, *,
                magic: int = PAGE_MAGICS[15]) -> bytes:
    """Segment ``segno`` of ``timeline``: valid WAL from its first record to an XLOG_SWITCH
    near its end, zeros after it; ``magic`` on every page (PostgreSQL 15's by default)."""
    rng = random.Random(  # noqa: S311 - reproducible test data, not a secret
        f"{segno}/{timeline}/{system_identifier}/{segment_size}/{seed}")
    start = segno * segment_size
    out = bytearray(segment_size)
    pos = 0  # offset in the segment where the next byte goes
    prev = start  # the first record's xl_prev is not checked (nothing before it is read)

    def put(data: bytes) -> None:
        """Write a record's bytes from ``pos``, page headers where pages begin."""
        nonlocal pos
        view, left = memoryview(data), len(data)
        while left:
            if pos % XLOG_BLCKSZ == 0:
                flags = XLP_FIRST_IS_CONTRECORD if left < len(data) else 0
                SHORT_HEADER.pack_into(out, pos, magic, flags, timeline,
                                       start + pos, left if flags else 0)
                pos += SIZE_OF_SHORT_PHD
            take = min(left, XLOG_BLCKSZ - pos % XLOG_BLCKSZ)
            out[pos:pos + take] = view[len(data) - left:len(data) - left + take]
            pos += take
            left -= take
        pos = (pos + 7) & ~7

    SHORT_HEADER.pack_into(out, 0, magic, XLP_LONG_HEADER, timeline, start, 0)
    LONG_FIELDS.pack_into(out, SIZE_OF_SHORT_PHD, system_identifier, segment_size, XLOG_BLCKSZ)
    pos = SIZE_OF_LONG_PHD
    while True:
        length = rng.randrange(40, 24000)
        # room for the record, the page headers it crosses, and the switch record after it
        if pos + length + 24 + (length // XLOG_BLCKSZ + 2) * SIZE_OF_SHORT_PHD \
                > segment_size - _SWITCH_SPACE:
            break
        body = _DATA_LONG.pack(254, length) + rng.randbytes(length)
        lsn = start + pos if pos % XLOG_BLCKSZ else start + pos + SIZE_OF_SHORT_PHD
        put(_record(body, prev, _XLOG_NOOP))
        prev = lsn
    put(_record(b"", prev, _XLOG_SWITCH))
    return bytes(out)


def record_offsets(data: bytes, segment_size: int = SEGMENT) -> list[int]:
    """Offsets of the records of a segment from :func:`wal_segment` that lie on one page
    (header and body): flipping a byte in one of them breaks exactly that record's CRC."""
    found = []
    pos = SIZE_OF_LONG_PHD
    while pos < segment_size:
        if pos % XLOG_BLCKSZ == 0:
            pos += SIZE_OF_SHORT_PHD
        tot_len = struct.unpack_from("<I", data, pos)[0]
        if tot_len == 0:
            break
        end = pos + tot_len
        if end <= (pos | (XLOG_BLCKSZ - 1)) + 1:
            found.append(pos)
        # skip the page headers the record crosses
        left, at = tot_len, pos
        while left:
            take = min(left, XLOG_BLCKSZ - at % XLOG_BLCKSZ)
            at += take
            left -= take
            if left and at % XLOG_BLCKSZ == 0:
                at += SIZE_OF_SHORT_PHD
        pos = (at + 7) & ~7
    return found
