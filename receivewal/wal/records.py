"""Records of one WAL segment (pure): what the scan finds, and the block-header decoding.

The result types of a segment scan (:class:`SegmentScan`, :class:`WalProblem`,
:class:`RmgrTotals`) and :func:`block_references`, which decodes a record's block references
as PostgreSQL 15's DecodeXLogRecord does: the full-page-image bytes the way
``pg_waldump --stats`` counts them (:func:`fpi_bytes_of`), and where the main data lies
(:func:`main_data_of`, for what reads a record's contents).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from receivewal.wal.lsn import format_lsn
from receivewal.wal.nativescan import crc32c_function
from receivewal.wal.pageheader import XLOG_BLCKSZ
from receivewal.wal.pages import maxalign, record_bytes
from receivewal.wal.rmgr import RM_XACT_ID, rmgr_id_is_valid

__all__ = ["MAX_RECORD_LENGTH", "RECORD_HEADER", "RmgrTotals", "SegmentScan", "WalProblem",
           "block_references", "fpi_bytes_of", "group_totals", "judge_record", "main_data_of",
           "maxalign", "record_length_problem", "record_type"]

SIZE_OF_XLOG_RECORD = 24
# The longest record PostgreSQL 15's recovery reads: its xlogreader (allocate_recordbuf)
# allocates xl_tot_len rounded up past the next 8 kB boundary, and refuses ("record length
# too long") what exceeds MaxAllocSize (0x3FFFFFFF) then: 1 GiB - 8 kB - 1. (PostgreSQL 16's
# XLogRecordMaxSize, 1020 MiB, is below it and bounds what newer servers write.)
MAX_RECORD_LENGTH = 0x3FFFDFFF
#: xl_tot_len, xl_xid, xl_prev, xl_info, xl_rmid, (2 bytes padding), xl_crc
RECORD_HEADER = struct.Struct("<IIQBBxxI")
_RMID_AT = struct.calcsize("<IIQB")  # xl_rmid's offset in the header
_U32 = struct.Struct("<I").unpack_from
_IMAGE = struct.Struct("<HHB").unpack_from  # bimg_len, hole_offset, bimg_info
_BKPIMAGE_HAS_HOLE = 0x01
_BKPIMAGE_COMPRESSED = 0x04 | 0x08 | 0x10  # pglz, lz4, zstd (PostgreSQL 15 flag values)


def record_length_problem(tot_len: int) -> str:
    """Why ``xl_tot_len`` cannot be a record's length ("" when it can)."""
    if tot_len < SIZE_OF_XLOG_RECORD:
        return f"invalid record length {tot_len}"
    if tot_len > MAX_RECORD_LENGTH:
        return f"record length {tot_len} too long"
    return ""


def judge_record(head: bytes | bytearray, crc: int, prev: int | None) -> tuple[str, str, int]:
    """Whether a gathered record is accepted, as PostgreSQL 15's xlogreader accepts one:
    ``(kind, detail, fpi_bytes)``, kind "" when it is.

    ``head`` holds the record from its first byte (its header and block headers), ``crc``
    the CRC-32C of its bytes after the header, ``prev`` the start of the record before it
    (None: not known). The checks, in order: the resource manager id, the xl_prev link, the
    CRC (xl_crc covers the data, then the header up to xl_crc), the block references. The
    scanner's fast path (reader.py) and the C scanner (_scan.c, walk) accept exactly the
    records this accepts; tests/test_scanner_paths.py compares them on damaged segments.
    """
    tot_len, _xid, prev_link, _info, rmid, stored = RECORD_HEADER.unpack_from(head)
    if not rmgr_id_is_valid(rmid):
        return "bad_record", f"invalid resource manager id {rmid}", 0
    if prev is not None and prev_link != prev:
        return ("bad_record", f"record with incorrect prev-link {format_lsn(prev_link)}, "
                f"expected {format_lsn(prev)}", 0)
    if crc32c_function()(memoryview(head)[:20], crc) != stored:
        return "crc_mismatch", "incorrect resource manager data checksum", 0
    fpi = fpi_bytes_of(head, SIZE_OF_XLOG_RECORD, tot_len)
    if fpi < 0:
        return "bad_record", "invalid block references in record", 0
    return "", "", fpi


def record_type(key: int) -> int:
    """``rmid << 4 | xl_info >> 4`` reduced as pg_waldump --stats=record groups records:
    for Transaction records only the three opcode bits count (the fourth is a flag)."""
    return key & ~0x8 if key >> 4 == RM_XACT_ID else key


@dataclass(frozen=True)
class WalProblem:
    """Something wrong in the archive, with the file and the LSN where it was found."""

    kind: str
    file: str
    lsn: int
    detail: str
    severity: str = "error"  # "error" breaks recovery; "warning" does not

    def describe(self) -> str:
        """One line for people: file, LSN, kind and detail."""
        return f"{self.severity}: {self.file} at {format_lsn(self.lsn)}: {self.kind}: {self.detail}"


@dataclass(frozen=True)
class RmgrTotals:
    """Statistics of one resource manager, as ``pg_waldump --stats`` sums them."""

    records: int
    record_bytes: int  # xl_tot_len minus full-page-image bytes
    fpi_bytes: int


@dataclass(frozen=True)
class SegmentScan:
    """What one segment holds and what is wrong with it."""

    file: str
    timeline: int
    segno: int
    start_lsn: int
    partial: bool
    data_bytes: int  # length after decompression
    system_identifier: int | None
    page_tlis: tuple[tuple[int, int], ...]  # (LSN of a page, its timeline) where it changes
    rmgr: Mapping[int, RmgrTotals]
    record_types: Mapping[int, RmgrTotals]  # by rmid << 4 | record type, see record_type()
    first_record_lsn: int | None
    first_record_prev: int | None
    last_record_lsn: int | None
    end_lsn: int  # where the record after the last one found would start
    valid_end: int  # recovery can read this segment's WAL up to here
    switched: bool  # an XLOG_SWITCH record ended the segment
    incomplete_tail: bool  # the last record continues into WAL that was not available
    record_lsns: tuple[int, ...]
    problems: tuple[WalProblem, ...]
    unlisted_problems: int = 0  # found past the ones listed in ``problems``, only counted

    @property
    def records(self) -> int:
        """Records that start in this segment."""
        return sum(t.records for t in self.rmgr.values())

    @property
    def record_bytes(self) -> int:
        """Bytes of those records, full-page images excluded."""
        return sum(t.record_bytes for t in self.rmgr.values())

    @property
    def fpi_bytes(self) -> int:
        """Bytes of full-page images in those records."""
        return sum(t.fpi_bytes for t in self.rmgr.values())


def fpi_bytes_of(rec: bytes | bytearray | memoryview, off: int, end: int) -> int:
    """Full-page-image bytes of a record whose block headers are ``rec[off:end]``; -1 when
    they are malformed (see :func:`block_references`)."""
    return block_references(rec, off, end)[0]


def main_data_of(data: bytes | bytearray, start_lsn: int, record_lsns: Iterable[int],
                 rmids: Collection[int]) -> Iterator[tuple[int, int, int, bytes]]:
    """``(LSN, xl_rmid, xl_info, main data)`` of each record at ``record_lsns`` (records that
    start in ``data``, a segment's bytes from ``start_lsn``) whose resource manager is one of
    ``rmids``: its bytes gathered across the page headers, its block headers decoded as
    DecodeXLogRecord decodes them. A record that the end of ``data`` cuts off, or whose block
    headers do not parse, is skipped."""
    size = len(data)
    for lsn in record_lsns:
        off = lsn - start_lsn
        if not 0 <= off < size:
            continue
        if off % XLOG_BLCKSZ <= XLOG_BLCKSZ - SIZE_OF_XLOG_RECORD \
                and off + SIZE_OF_XLOG_RECORD <= size and data[off + _RMID_AT] not in rmids:
            continue  # the common case, decided without gathering the header
        head = record_bytes(data, off, SIZE_OF_XLOG_RECORD)
        if head is None:
            continue
        tot_len, _xid, _prev, info, rmid, _crc = RECORD_HEADER.unpack(head)
        if rmid not in rmids:
            continue
        rec = record_bytes(data, off, tot_len)
        if rec is None:
            continue
        fpi, main_len = block_references(rec, SIZE_OF_XLOG_RECORD, tot_len)
        if fpi >= 0:
            yield lsn, rmid, info, rec[tot_len - main_len:]


def block_references(rec: bytes | bytearray | memoryview, off: int, end: int,  # noqa: PLR0912, PLR0915 - one loop, as DecodeXLogRecord
                     ) -> tuple[int, int]:
    """``(full-page-image bytes, main data length)`` of a record whose block headers are
    ``rec[off:end]`` (its main data is its last bytes).

    Decodes the block references like PostgreSQL's DecodeXLogRecord and returns ``(-1, 0)``
    when they are malformed (out-of-order block ids, lengths that do not add up to
    ``xl_tot_len``).

    A documented hot loop (over 60 lines on purpose): the pure-Python scanner runs it for every
    record that carries block references, and splitting it into calls costs measurably per
    record. The C scanner (``_scan.c``) has its own copy of the same walk.
    """
    remaining = end - off
    datatotal = 0
    fpi = 0
    main_len = 0
    max_block = -1
    have_rel = False
    try:
        while remaining > datatotal:
            bid = rec[off]
            if bid == 255:  # XLR_BLOCK_ID_DATA_SHORT
                main_len = rec[off + 1]
                datatotal += main_len
                remaining -= 2
                break
            if bid == 254:  # XLR_BLOCK_ID_DATA_LONG
                main_len = _U32(rec, off + 1)[0]
                datatotal += main_len
                remaining -= 5
                break
            if bid == 253:  # XLR_BLOCK_ID_ORIGIN
                off += 3
                remaining -= 3
                continue
            if bid == 252:  # XLR_BLOCK_ID_TOPLEVEL_XID
                off += 5
                remaining -= 5
                continue
            if bid > 32 or bid <= max_block:
                return -1, 0
            max_block = bid
            fork_flags = rec[off + 1]
            data_len = rec[off + 2] | rec[off + 3] << 8
            off += 4
            remaining -= 4
            if (fork_flags & 0x20 == 0) != (data_len == 0):  # BKPBLOCK_HAS_DATA
                return -1, 0
            datatotal += data_len
            if fork_flags & 0x10:  # BKPBLOCK_HAS_IMAGE
                bimg_len, _hole, bimg_info = _IMAGE(rec, off)
                off += 5
                remaining -= 5
                if bimg_info & _BKPIMAGE_COMPRESSED and bimg_info & _BKPIMAGE_HAS_HOLE:
                    off += 2
                    remaining -= 2
                if bimg_len == 0 or bimg_len > XLOG_BLCKSZ:
                    return -1, 0
                datatotal += bimg_len
                fpi += bimg_len
            if fork_flags & 0x80:  # BKPBLOCK_SAME_REL
                if not have_rel:
                    return -1, 0
            else:
                have_rel = True
                off += 12
                remaining -= 12
            off += 4
            remaining -= 4
    except (IndexError, struct.error):
        return -1, 0
    return (fpi, main_len) if remaining == datatotal else (-1, 0)


def group_totals(counts: Sequence[int], rec_bytes: Sequence[int], fpi_bytes: Sequence[int],
                 group: Callable[[int], int]) -> dict[int, RmgrTotals]:
    """Per-key sums (key: ``rmid << 4 | xl_info >> 4``) added up by ``group(key)``."""
    acc: dict[int, list[int]] = {}
    for key, n in enumerate(counts):
        if n:
            t = acc.setdefault(group(key), [0, 0, 0])
            t[0] += n
            t[1] += rec_bytes[key]
            t[2] += fpi_bytes[key]
    return {k: RmgrTotals(*v) for k, v in sorted(acc.items())}
