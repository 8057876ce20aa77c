"""Pages and records of one WAL segment (pure): the checks PostgreSQL 15's xlogreader makes.

:class:`SegmentScanner` takes the bytes of one segment (already decompressed) and

* checks every page header: magic ``0xD110``, flag bits, timeline, page address, the long
  header on the first page (system identifier, segment size, block size), and the
  continuation length ``xlp_rem_len`` of every page a record runs into;
* walks every record that starts in the segment: 8-byte alignment, ``xl_tot_len``,
  resource manager id, the ``xl_prev`` link, the CRC-32C (computed as PostgreSQL does: over the
  data after the 24-byte header, then the header up to ``xl_crc``), and the block headers, to
  count full-page-image bytes as ``pg_waldump --stats`` counts them.

A record that runs past the end of the segment is left pending; the caller hands the scanner
the first pages of the following segment (:meth:`SegmentScanner.continue_record`) to finish it.
Records are counted in the segment where they start. Nothing here opens a file.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import crc32c

from receivewal.wal.lsn import format_lsn
from receivewal.wal.pageheader import (
    LONG_FIELDS,
    SHORT_HEADER,
    SIZE_OF_LONG_PHD,
    SIZE_OF_SHORT_PHD,
    XLOG_BLCKSZ,
    XLOG_PAGE_MAGIC,
    XLP_ALL_FLAGS,
    XLP_FIRST_IS_CONTRECORD,
    XLP_FIRST_IS_OVERWRITE_CONTRECORD,
    XLP_LONG_HEADER,
)
from receivewal.wal.rmgr import RM_XACT_ID, is_switch_record, rmgr_id_is_valid

SIZE_OF_XLOG_RECORD = 24

_PAGE = SHORT_HEADER
_LONG = LONG_FIELDS
_RECORD = struct.Struct("<IIQBBxxI")  # xl_tot_len, xl_xid, xl_prev, xl_info, xl_rmid, xl_crc
# The header plus the first 22 bytes after it: block id, fork flags, data length of block 0,
# and the two bytes where short main data follows a block header without an image.
_RECORD_SHAPE = struct.Struct("<IIQBBxxIBBH16xBB")
_SIZE_OF_SHAPE = _RECORD_SHAPE.size
_U32 = struct.Struct("<I").unpack_from
_IMAGE = struct.Struct("<HHB").unpack_from  # bimg_len, hole_offset, bimg_info
_PAGE_MASK = XLOG_BLCKSZ - 1
_BKPIMAGE_HAS_HOLE = 0x01
_BKPIMAGE_COMPRESSED = 0x04 | 0x08 | 0x10  # pglz, lz4, zstd (PostgreSQL 15 flag values)
_MAX_PROBLEMS = 50


def record_type(key: int) -> int:
    """``rmid << 4 | xl_info >> 4`` reduced as pg_waldump --stats=record groups records:
    for Transaction records only the three opcode bits count (the fourth is a flag)."""
    return key & ~0x8 if key >> 4 == RM_XACT_ID else key


def maxalign(n: int) -> int:
    """Round up to PostgreSQL's MAXALIGN (8 bytes)."""
    return (n + 7) & ~7


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


def fpi_bytes_of(rec: bytes | memoryview, off: int, end: int) -> int:  # noqa: PLR0912, PLR0915 - one loop, as DecodeXLogRecord
    """Full-page-image bytes of a record whose block headers are ``rec[off:end]``.

    Decodes the block references like PostgreSQL's DecodeXLogRecord and returns -1 when they
    are malformed (out-of-order block ids, lengths that do not add up to ``xl_tot_len``).
    """
    remaining = end - off
    datatotal = 0
    fpi = 0
    max_block = -1
    have_rel = False
    try:
        while remaining > datatotal:
            bid = rec[off]
            if bid == 255:  # XLR_BLOCK_ID_DATA_SHORT
                datatotal += rec[off + 1]
                remaining -= 2
                break
            if bid == 254:  # XLR_BLOCK_ID_DATA_LONG
                datatotal += _U32(rec, off + 1)[0]
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
                return -1
            max_block = bid
            fork_flags = rec[off + 1]
            data_len = rec[off + 2] | rec[off + 3] << 8
            off += 4
            remaining -= 4
            if (fork_flags & 0x20 == 0) != (data_len == 0):  # BKPBLOCK_HAS_DATA
                return -1
            datatotal += data_len
            if fork_flags & 0x10:  # BKPBLOCK_HAS_IMAGE
                bimg_len, _hole, bimg_info = _IMAGE(rec, off)
                off += 5
                remaining -= 5
                if bimg_info & _BKPIMAGE_COMPRESSED and bimg_info & _BKPIMAGE_HAS_HOLE:
                    off += 2
                    remaining -= 2
                if bimg_len == 0 or bimg_len > XLOG_BLCKSZ:
                    return -1
                datatotal += bimg_len
                fpi += bimg_len
            if fork_flags & 0x80:  # BKPBLOCK_SAME_REL
                if not have_rel:
                    return -1
            else:
                have_rel = True
                off += 12
                remaining -= 12
            off += 4
            remaining -= 4
    except (IndexError, struct.error):
        return -1
    return fpi if remaining == datatotal else -1


@dataclass
class _Pending:
    """A record that runs past the end of the data scanned so far."""

    lsn: int
    prev: int | None  # the start of the record before it, when known
    tot_len: int
    parts: list[bytes]
    got: int
    next_start: int  # LSN of the segment that must continue it


class SegmentScanner:
    """Checks one segment's pages and records; a small stateful object without IO."""

    def __init__(self, data: bytes, file: str, *, start_lsn: int, segment_size: int,
                 timeline: int, segno: int, partial: bool = False,
                 collect_lsns: bool = False) -> None:
        self.data = data
        self.file = file
        self.start_lsn = start_lsn
        self.segment_size = segment_size
        self.timeline = timeline
        self.segno = segno
        self.partial = partial
        self.problems: list[WalProblem] = []
        # Indexed by rmid << 4 | xl_info >> 4: per resource manager and record type.
        self.counts = [0] * 4096
        self.rec_bytes = [0] * 4096
        self.fpi_bytes = [0] * 4096
        self.lsns: list[int] | None = [] if collect_lsns else None
        self.system_identifier: int | None = None
        self.page_tlis: list[tuple[int, int]] = []
        self.first_record_lsn: int | None = None
        self.first_record_prev: int | None = None
        self.last_record_lsn: int | None = None
        self.end_lsn = start_lsn
        self.first_error: int | None = None
        self.switched = False
        self.incomplete_tail = False
        self.pending: _Pending | None = None
        self.n_pages = 0
        self.zero_from: int | None = None  # offset where zeros run to the end of the data
        self.page_ok: list[bool] = []
        self.flags: list[int] = []
        self.rems: list[int] = []
        self._scanned = False

    # -- problems ----------------------------------------------------------------------------
    def _problem(self, kind: str, lsn: int, detail: str, severity: str = "error") -> None:
        if severity == "error" and (self.first_error is None or lsn < self.first_error):
            self.first_error = lsn
        if len(self.problems) < _MAX_PROBLEMS:
            self.problems.append(WalProblem(kind, self.file, lsn, detail, severity))

    # -- pages -------------------------------------------------------------------------------
    def _check_pages(self) -> None:
        buf = self.data
        size = len(buf)
        if size % XLOG_BLCKSZ or (size != self.segment_size and not self.partial):
            self._problem("truncated_segment", self.start_lsn + size - size % XLOG_BLCKSZ,
                          f"segment holds {size} bytes, expected {self.segment_size}")
        prev_tli = 0
        for p in range(size // XLOG_BLCKSZ):
            off = p * XLOG_BLCKSZ
            lsn = self.start_lsn + off
            magic, info, tli, addr, rem = _PAGE.unpack_from(buf, off)
            if (magic == 0 and info == 0 and addr == 0 and not any(buf[off:off + 24])
                    and buf.count(0, off) == size - off):  # zeros to the end: WAL ends here
                self.zero_from = off
                break
            bad = self._page_header_problem(p, (magic, info, tli, addr), lsn, prev_tli)
            if bad:
                self._problem("bad_page_header", lsn, bad)
            else:
                if tli != prev_tli:
                    self.page_tlis.append((lsn, tli))
                prev_tli = tli
            self.page_ok.append(not bad)
            self.flags.append(info)
            self.rems.append(rem)
        self.n_pages = len(self.page_ok)

    def _page_header_problem(  # noqa: PLR0911 - one return per check, as xlogreader reports
            self, p: int, header: tuple[int, int, int, int], lsn: int, prev_tli: int) -> str:
        magic, info, tli, addr = header
        if magic != XLOG_PAGE_MAGIC:
            return f"invalid magic number {magic:04X}, expected {XLOG_PAGE_MAGIC:04X}"
        if info & ~XLP_ALL_FLAGS:
            return f"invalid info bits {info:04X}"
        if addr != lsn:
            return f"unexpected page address {format_lsn(addr)}"
        if tli == 0 or tli > self.timeline:
            return f"page timeline {tli} does not belong in a timeline {self.timeline} file"
        if tli < prev_tli:
            return f"out-of-sequence timeline {tli} after {prev_tli}"
        if p == 0:
            if not info & XLP_LONG_HEADER:
                return "first page of the segment lacks the long header"
            sysid, seg_size, blcksz = _LONG.unpack_from(self.data, SIZE_OF_SHORT_PHD)
            if seg_size != self.segment_size:
                return f"segment size {seg_size} in page header, expected {self.segment_size}"
            if blcksz != XLOG_BLCKSZ:
                return f"block size {blcksz} in page header, expected {XLOG_BLCKSZ}"
            self.system_identifier = sysid
        elif info & XLP_LONG_HEADER:
            return "long header on a page that does not start the segment"
        return ""

    def _page_start(self, p: int) -> int | None:
        """Offset of the first record that starts on page ``p`` or later; None if none."""
        while p < self.n_pages:
            if self.page_ok[p]:
                off = p * XLOG_BLCKSZ + (SIZE_OF_LONG_PHD if p == 0 else SIZE_OF_SHORT_PHD)
                if self.flags[p] & XLP_FIRST_IS_CONTRECORD:
                    off += maxalign(self.rems[p])
                if off < (p + 1) * XLOG_BLCKSZ:
                    return off
            p += 1
        return None

    # -- records -----------------------------------------------------------------------------
    def scan(self) -> None:
        """Check the pages, then walk the records that start in this segment."""
        if self._scanned:
            return
        self._scanned = True
        self._check_pages()
        if self.n_pages and self.page_ok[0] and self.flags[0] & XLP_FIRST_IS_CONTRECORD:
            self._check_leading_continuation()
        pos = self._page_start(0)
        if pos is None:
            self.end_lsn = self.start_lsn + self.n_pages * XLOG_BLCKSZ
        else:
            self._walk(pos)
        # PostgreSQL leaves the pages after an XLOG_SWITCH record zero; anywhere else in a
        # complete segment, zeros to the end mean the file lost its tail.
        if self.zero_from is not None and not self.partial and not (
                self.switched and self.end_lsn - self.start_lsn <= self.zero_from):
            size = len(self.data)
            self._problem("zeroed_tail", self.start_lsn + self.zero_from,
                          f"{size - self.zero_from} bytes of zeros at the end of a complete "
                          "segment")

    def _check_leading_continuation(self) -> None:
        """The tail of a record from the previous segment: check the pages it covers."""
        need = self.rems[0]
        p = 0
        while True:
            avail = XLOG_BLCKSZ - (SIZE_OF_LONG_PHD if p == 0 else SIZE_OF_SHORT_PHD)
            if need <= avail:
                return
            need -= avail
            p += 1
            if p >= self.n_pages or not self.page_ok[p]:
                return
            if not self.flags[p] & XLP_FIRST_IS_CONTRECORD or self.rems[p] != need:
                self._problem("bad_page_header", self.start_lsn + p * XLOG_BLCKSZ,
                              f"invalid contrecord length {self.rems[p]}, expected {need}")
                return

    def _walk(self, pos: int) -> None:  # noqa: PLR0912, PLR0915 - the hot loop stays in one piece
        buf = self.data
        start = self.start_lsn
        end_data = self.n_pages * XLOG_BLCKSZ
        page_ok, flags = self.page_ok, self.flags
        counts, rec_bytes, fpi_bytes, lsns = self.counts, self.rec_bytes, self.fpi_bytes, self.lsns
        unpack = _RECORD_SHAPE.unpack_from
        crc = crc32c.crc32c
        prev: int | None = None
        last = self.last_record_lsn
        first = True
        while pos < end_data:
            if not pos & _PAGE_MASK:  # a record boundary falls on a page boundary
                p = pos >> 13
                if not page_ok[p]:
                    nxt = self._page_start(p + 1)
                    if nxt is None:
                        break
                    pos, prev = nxt, None
                    continue
                if flags[p] & XLP_FIRST_IS_CONTRECORD:
                    self._problem("bad_page_header", start + pos,
                                  "contrecord flag set where a new record starts")
                pos += SIZE_OF_SHORT_PHD
            page_end = (pos | _PAGE_MASK) + 1
            while page_end - pos >= _SIZE_OF_SHAPE:  # records on this page, fast path
                # The record header and the bytes that tell the common shapes, in one call.
                (tot_len, _xid, prev_link, info, rmid, stored,
                 bid, bflags, dlen, b20, b21) = unpack(buf, pos)
                rec_end = pos + tot_len
                if not (rec_end <= page_end and tot_len >= SIZE_OF_XLOG_RECORD
                        and (prev_link == prev or prev is None)
                        and (rmid <= 21 or rmid >= 128)
                        and crc(buf[pos + 24:rec_end] + buf[pos:pos + 20]) == stored):
                    break
                # Nearly every record has one of two shapes: one block with data and no
                # image followed by short main data, or short main data alone. Anything
                # else is decoded in full.
                if (bid == 0 and bflags & 0xB0 == 0x20 and b20 == 255
                        and 0 < dlen == tot_len - 46 - b21) or (
                        bid == 255 and bflags + 26 == tot_len):
                    fpi = 0
                else:
                    fpi = fpi_bytes_of(buf, pos + 24, rec_end)
                    if fpi < 0:
                        break
                lsn = start + pos
                key = rmid << 4 | info >> 4
                counts[key] += 1
                if fpi:
                    rec_bytes[key] += tot_len - fpi
                    fpi_bytes[key] += fpi
                else:
                    rec_bytes[key] += tot_len
                if lsns is not None:
                    lsns.append(lsn)
                if first:
                    first = False
                    self.first_record_lsn, self.first_record_prev = lsn, prev_link
                prev = last = lsn
                pos = (rec_end + 7) & ~7
                if rmid == 0 and info & 0xF0 == 0x40:  # XLOG_SWITCH
                    self.switched = True
                    break
            if self.switched:
                break
            if pos == page_end:
                continue
            self.last_record_lsn = last
            step = self._slow_record(pos, prev)
            last = self.last_record_lsn
            if step is None:
                break
            pos, prev = step
            if first and last is not None:
                first = False
            if self.switched:
                break
        self.last_record_lsn = last
        self.end_lsn = start + min(pos, end_data) if not self.switched else start + pos

    def _slow_record(self, pos: int, prev: int | None) -> tuple[int, int | None] | None:
        """A record the fast path did not accept: split header, page crossing, or damage."""
        lsn = self.start_lsn + pos
        tot_len = _U32(self.data, pos)[0]
        if tot_len == 0:
            if not self.partial:
                self._problem("truncated_segment", lsn,
                              "WAL ends (record length 0) inside a complete segment")
            return None
        if tot_len < SIZE_OF_XLOG_RECORD:
            self._problem("bad_record", lsn, f"invalid record length {tot_len}")
            return self._resync(pos)
        gathered = self._gather(pos, tot_len)
        if gathered is None:
            return self._resync(pos)
        if isinstance(gathered, _Pending):
            gathered.prev = prev
            self.pending = gathered
            if self.partial or self.n_pages * XLOG_BLCKSZ < self.segment_size:
                self.incomplete_tail = True  # WAL ends inside this record
                self.pending = None
            return None
        rec, next_pos = gathered
        if not self._accept(rec, lsn, prev):
            return (next_pos, None)
        return (next_pos, lsn)

    def _accept(self, rec: bytes, lsn: int, prev: int | None) -> bool:
        """Check a whole record's header, CRC and blocks; count it when good."""
        tot_len, _xid, prev_link, info, rmid, stored = _RECORD.unpack_from(rec)
        if not rmgr_id_is_valid(rmid):
            self._problem("bad_record", lsn, f"invalid resource manager id {rmid}")
            return False
        if prev is not None and prev_link != prev:
            self._problem("bad_record", lsn, f"record with incorrect prev-link "
                          f"{format_lsn(prev_link)}, expected {format_lsn(prev)}")
            return False
        mv = memoryview(rec)
        if crc32c.crc32c(mv[:20], crc32c.crc32c(mv[24:tot_len])) != stored:
            self._problem("crc_mismatch", lsn, "incorrect resource manager data checksum")
            return False
        fpi = fpi_bytes_of(rec, 24, tot_len)
        if fpi < 0:
            self._problem("bad_record", lsn, "invalid block references in record")
            return False
        key = rmid << 4 | info >> 4
        self.counts[key] += 1
        self.rec_bytes[key] += tot_len - fpi
        self.fpi_bytes[key] += fpi
        if self.lsns is not None:
            self.lsns.append(lsn)
        if self.first_record_lsn is None:
            self.first_record_lsn, self.first_record_prev = lsn, prev_link
        self.last_record_lsn = lsn
        if is_switch_record(rmid, info):
            self.switched = True
        return True

    def _resync(self, pos: int) -> tuple[int, int | None] | None:
        nxt = self._page_start((pos >> 13) + 1)
        return None if nxt is None else (nxt, None)

    def _gather(self, pos: int, tot_len: int) -> tuple[bytes, int] | _Pending | None:
        """The bytes of a record that crosses pages, checking each continuation header."""
        lsn = self.start_lsn + pos
        page_end = (pos | _PAGE_MASK) + 1
        if tot_len <= page_end - pos:
            return self.data[pos:pos + tot_len], maxalign(pos + tot_len)
        parts = [self.data[pos:page_end]]
        got = page_end - pos
        p = page_end >> 13
        end = page_end
        while got < tot_len:
            if p >= self.n_pages:
                return _Pending(lsn, None, tot_len, parts, got,
                                self.start_lsn + self.segment_size)
            if not self.page_ok[p]:
                self._problem("bad_record", lsn, "record continues into a damaged page")
                return None
            if self.flags[p] & XLP_FIRST_IS_OVERWRITE_CONTRECORD:
                self._problem("aborted_contrecord", lsn,
                              "record was overwritten by XLOG_OVERWRITE_CONTRECORD", "warning")
                return None
            if not self.flags[p] & XLP_FIRST_IS_CONTRECORD or self.rems[p] != tot_len - got:
                self._problem("bad_record", lsn, f"invalid contrecord length {self.rems[p]} "
                              f"at {format_lsn(self.start_lsn + p * XLOG_BLCKSZ)}, "
                              f"expected {tot_len - got}")
                return None
            off = p * XLOG_BLCKSZ + SIZE_OF_SHORT_PHD
            take = min(XLOG_BLCKSZ - SIZE_OF_SHORT_PHD, tot_len - got)
            parts.append(self.data[off:off + take])
            got += take
            end = off + take
            p += 1
        return b"".join(parts), maxalign(end)

    # -- the next segment --------------------------------------------------------------------
    def next_bytes_needed(self) -> int:
        """How many bytes of the following segment finish the pending record (0: none)."""
        if self.pending is None:
            return 0
        need = self.pending.tot_len - self.pending.got
        pages = (need + SIZE_OF_LONG_PHD) // (XLOG_BLCKSZ - SIZE_OF_SHORT_PHD) + 1
        return min(pages * XLOG_BLCKSZ, self.segment_size)

    def pending_next_start(self) -> int | None:
        """LSN of the segment that continues the pending record, if there is one."""
        return None if self.pending is None else self.pending.next_start

    def continue_record(self, data: bytes, file: str) -> None:
        """Finish the pending record from the first pages of the segment that follows."""
        pend = self.pending
        if pend is None:
            return
        p = 0
        end = 0
        while pend.got < pend.tot_len:
            off = p * XLOG_BLCKSZ
            if off + XLOG_BLCKSZ > len(data):
                if len(data) >= self.segment_size:  # runs on into the segment after that
                    pend.next_start += self.segment_size
                    return
                self.next_missing()
                return
            magic, info, _tli, addr, rem = _PAGE.unpack_from(data, off)
            need = pend.tot_len - pend.got
            if (magic != XLOG_PAGE_MAGIC or addr != pend.next_start + off
                    or not info & XLP_FIRST_IS_CONTRECORD or rem != need):
                self._problem("bad_record", pend.lsn, f"record continues into {file} at "
                              f"{format_lsn(pend.next_start + off)}, whose page header does "
                              f"not continue it (remaining length {rem}, expected {need})")
                self.pending = None
                return
            hdr = SIZE_OF_LONG_PHD if off == 0 else SIZE_OF_SHORT_PHD
            take = min(XLOG_BLCKSZ - hdr, need)
            pend.parts.append(data[off + hdr:off + hdr + take])
            pend.got += take
            end = off + hdr + take
            p += 1
        self.pending = None
        if self._accept(b"".join(pend.parts), pend.lsn, pend.prev):
            self.end_lsn = pend.next_start + maxalign(end)
            if self.switched:
                self.end_lsn = pend.next_start

    def next_missing(self) -> None:
        """The following segment is not available: the pending record stays unfinished."""
        if self.pending is not None:
            self.incomplete_tail = True
            self.pending = None

    # -- result ------------------------------------------------------------------------------
    def _totals(self, group: Callable[[int], int]) -> dict[int, RmgrTotals]:
        acc: dict[int, list[int]] = {}
        for key, n in enumerate(self.counts):
            if n:
                t = acc.setdefault(group(key), [0, 0, 0])
                t[0] += n
                t[1] += self.rec_bytes[key]
                t[2] += self.fpi_bytes[key]
        return {k: RmgrTotals(*v) for k, v in sorted(acc.items())}

    def result(self) -> SegmentScan:
        """The scan's findings (call after :meth:`scan` and any continuation)."""
        self.scan()
        self.next_missing()
        valid_end = self.start_lsn + self.segment_size
        if self.incomplete_tail or (self.partial and not self.switched):
            valid_end = self.end_lsn
        if self.first_error is not None:
            valid_end = min(valid_end, self.first_error)
        return SegmentScan(
            file=self.file, timeline=self.timeline, segno=self.segno, start_lsn=self.start_lsn,
            partial=self.partial, data_bytes=len(self.data),
            system_identifier=self.system_identifier, page_tlis=tuple(self.page_tlis),
            rmgr=self._totals(lambda key: key >> 4),
            record_types=self._totals(record_type),
            first_record_lsn=self.first_record_lsn, first_record_prev=self.first_record_prev,
            last_record_lsn=self.last_record_lsn, end_lsn=self.end_lsn, valid_end=valid_end,
            switched=self.switched, incomplete_tail=self.incomplete_tail,
            record_lsns=tuple(self.lsns or ()), problems=tuple(self.problems),
        )
