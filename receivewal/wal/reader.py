"""Records of one WAL segment (pure): the checks PostgreSQL 15's xlogreader makes.

:class:`SegmentScanner` takes the bytes of one segment (already decompressed), checks every
page header (:mod:`receivewal.wal.pages`) and walks every record that starts in the segment:
8-byte alignment, ``xl_tot_len``, resource manager id, the ``xl_prev`` link, the CRC-32C
(computed as PostgreSQL does: over the data after the 24-byte header, then the header up to
``xl_crc``), the continuation length ``xlp_rem_len`` of every page a record runs into, and the
block headers, to count full-page-image bytes as ``pg_waldump --stats`` counts them.

A record that runs past the end of the segment is left pending (:mod:`.crossing`); the caller
hands over each segment it runs into (:meth:`SegmentScanner.continue_record`), however many.
Records are counted in the segment where they start. Nothing here opens a file.

The hot loop has two implementations with the same results: the compiled one in
``receivewal/wal/_scan.c`` walks every record it can accept without a finding, and stops where
something needs a closer look; the Python loop below goes on from there (and does all of the
work when the extension is absent, see :mod:`receivewal.wal.nativescan`).
"""

from __future__ import annotations

import struct

from receivewal.wal import nativescan
from receivewal.wal.crossing import Pending, bytes_needed, continue_pending, gather, tail_problem
from receivewal.wal.lsn import format_lsn
from receivewal.wal.nativescan import crc32c_function
from receivewal.wal.pageheader import (
    SIZE_OF_SHORT_PHD,
    XLOG_BLCKSZ,
    XLP_FIRST_IS_CONTRECORD,
)
from receivewal.wal.pages import PageMap, check_pages, maxalign
from receivewal.wal.records import (
    RECORD_HEADER,
    SIZE_OF_XLOG_RECORD,
    RmgrTotals,
    SegmentScan,
    WalProblem,
    block_references,
    fpi_bytes_of,
    group_totals,
    judge_record,
    record_length_problem,
    record_type,
)
from receivewal.wal.rmgr import RMGR_ID_VALID, is_switch_record

__all__ = ["RmgrTotals", "SegmentScan", "SegmentScanner", "WalProblem", "fpi_bytes_of",
           "maxalign", "record_type"]

# The header plus the first 22 bytes after it: block id, fork flags, data length of block 0,
# and the two bytes where short main data follows a block header without an image.
_RECORD_SHAPE = struct.Struct("<IIQBBxxIBBH16xBB")
_SIZE_OF_SHAPE = _RECORD_SHAPE.size
_U32 = struct.Struct("<I").unpack_from
_PAGE_MASK = XLOG_BLCKSZ - 1
_MAX_PROBLEMS = 50


class SegmentScanner:
    """Checks one segment's pages and records; a small stateful object without IO."""

    def __init__(self, data: bytes | bytearray, file: str, *, start_lsn: int, segment_size: int,
                 timeline: int, segno: int, partial: bool = False,
                 collect_lsns: bool = False) -> None:
        self.data_len = len(data)
        if partial and len(data) % XLOG_BLCKSZ:  # a compressed .partial ends mid-page
            data += bytes(XLOG_BLCKSZ - len(data) % XLOG_BLCKSZ)
        self.data = data
        self.file = file
        self.start_lsn = start_lsn
        self.segment_size = segment_size
        self.timeline = timeline
        self.segno = segno
        self.partial = partial
        self.problems: list[WalProblem] = []
        self.unlisted_problems = 0
        # Indexed by rmid << 4 | xl_info >> 4: per resource manager and record type.
        self.counts = [0] * 4096
        self.rec_bytes = [0] * 4096
        self.fpi_bytes = [0] * 4096
        self.lsns: list[int] | None = [] if collect_lsns else None
        self.first_record_lsn: int | None = None
        self.first_record_prev: int | None = None
        self.last_record_lsn: int | None = None
        self.end_lsn = start_lsn
        self.first_error: int | None = None
        self.switched = False
        self.incomplete_tail = False
        self.pending: Pending | None = None
        self.pages = PageMap()
        self.n_pages = 0
        self.page_ok: list[bool] = []
        self.flags: list[int] = []
        self.rems: list[int] = []
        self._scanned = False

    # -- problems ----------------------------------------------------------------------------
    def _problem(self, kind: str, lsn: int, detail: str, severity: str = "error", *,
                 file: str | None = None, breaks_at: int | None = None) -> None:
        """A problem at ``lsn`` of ``file`` (default: this one); an error ends the valid WAL
        at ``breaks_at`` (default ``lsn``). Past _MAX_PROBLEMS, problems are only counted."""
        stop = lsn if breaks_at is None else breaks_at
        if severity == "error" and (self.first_error is None or stop < self.first_error):
            self.first_error = stop
        if len(self.problems) < _MAX_PROBLEMS:
            self.problems.append(WalProblem(kind, file or self.file, lsn, detail, severity))
        else:
            self.unlisted_problems += 1

    # -- pages -------------------------------------------------------------------------------
    def _check_pages(self) -> None:
        pages, findings = check_pages(
            self.data, data_len=self.data_len, start_lsn=self.start_lsn,
            segment_size=self.segment_size, timeline=self.timeline, partial=self.partial)
        for kind, lsn, detail in findings:
            self._problem(kind, lsn, detail)
        self.pages = pages
        self.page_ok, self.flags, self.rems = pages.page_ok, pages.flags, pages.rems
        self.n_pages = pages.n_pages

    def _page_start(self, p: int) -> int | None:
        """Offset of the first record that starts on page ``p`` or later; None if none."""
        return self.pages.record_start(p)

    # -- records -----------------------------------------------------------------------------
    def scan(self) -> None:
        """Check the pages, then walk the records that start in this segment."""
        if self._scanned:
            return
        self._scanned = True
        self._check_pages()
        leading = tail_problem(self.pages, self.start_lsn)
        if leading is not None:
            self._problem(*leading)
        pos = self._page_start(0)
        if pos is None:
            self.end_lsn = self.start_lsn + self.n_pages * XLOG_BLCKSZ
        else:
            self._walk(pos)
        # PostgreSQL leaves the pages after an XLOG_SWITCH record zero; anywhere else in a
        # complete segment, zeros to the end mean the file lost its tail.
        zero_from = self.pages.zero_from
        if zero_from is not None and not self.partial and not (
                self.switched and self.end_lsn - self.start_lsn <= zero_from):
            size = len(self.data)
            self._problem("zeroed_tail", self.start_lsn + zero_from,
                          f"{size - zero_from} bytes of zeros at the end of a complete "
                          "segment")

    def _walk(self, pos: int) -> None:  # noqa: PLR0912, PLR0915 - the hot loop stays in one piece
        """Walk the records from ``pos`` to the end of the segment's valid pages.

        The scanner's documented hot loop (over 60 lines on purpose): it runs once per record,
        so it keeps its state in locals and makes no calls on the common path; it hands a run
        of pages to the C scanner when that is built and takes over where C stops.
        """
        buf = self.data
        start = self.start_lsn
        end_data = self.n_pages * XLOG_BLCKSZ
        page_ok, flags = self.page_ok, self.flags
        counts, rec_bytes, fpi_bytes, lsns = self.counts, self.rec_bytes, self.fpi_bytes, self.lsns
        unpack = _RECORD_SHAPE.unpack_from
        crc = crc32c_function()
        valid_rmid = RMGR_ID_VALID
        prev: int | None = None
        last = self.last_record_lsn
        first = True
        if nativescan.native is not None:  # the compiled loop takes every record it accepts
            pos, prev, last, first_lsn, first_prev, switched = nativescan.native.walk(
                buf, pos, end_data, bytes(page_ok), start, False, 0, self.data_len,
                self.partial, counts, rec_bytes, fpi_bytes, lsns)
            if first_lsn is not None:
                first = False
                self.first_record_lsn, self.first_record_prev = first_lsn, first_prev
            if switched:
                self.switched = True
                self.last_record_lsn = last
                self.end_lsn = start + pos
                return
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
            limit = min(page_end, self.data_len)  # a .partial may end inside this page
            while page_end - pos >= _SIZE_OF_SHAPE:  # records on this page, fast path
                # The record header and the bytes that tell the common shapes, in one call.
                # The checks are records.judge_record's, inlined (no call per record); a
                # record they refuse goes to _slow_record, which judges it there.
                (tot_len, _xid, prev_link, info, rmid, stored,
                 bid, bflags, dlen, b20, b21) = unpack(buf, pos)
                rec_end = pos + tot_len
                if not (rec_end <= limit and tot_len >= SIZE_OF_XLOG_RECORD
                        and (prev_link == prev or prev is None)
                        and valid_rmid[rmid]
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
                    fpi = block_references(buf, pos + 24, rec_end)[0]
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

    def _slow_record(  # noqa: PLR0911 - one return per way a record ends the fast path
            self, pos: int, prev: int | None) -> tuple[int, int | None] | None:
        """A record the fast path did not accept: split header, page crossing, or damage."""
        lsn = self.start_lsn + pos
        tot_len = _U32(self.data, pos)[0]
        if tot_len == 0:
            if not self.partial:
                self._problem("truncated_segment", lsn,
                              "WAL ends (record length 0) inside a complete segment")
            return None
        wrong = record_length_problem(tot_len)
        if wrong:
            self._problem("bad_record", lsn, wrong)
            return self._resync(pos)
        gathered = self._gather(pos, tot_len)
        if gathered is None:
            return self._resync(pos)
        if isinstance(gathered, Pending):
            gathered.prev = prev
            self.pending = gathered
            if self.partial or self.n_pages * XLOG_BLCKSZ < self.segment_size:
                self.incomplete_tail = True  # WAL ends inside this record
                self.pending = None
            return None
        rec, end = gathered
        rec.prev = prev
        if end > self.data_len:  # a .partial cut inside this record: WAL ends here
            self.incomplete_tail = True
            return None
        next_pos = maxalign(end)
        if not self._accept(rec):
            return (next_pos, None)
        return (next_pos, lsn)

    def _accept(self, rec: Pending, continued_in: str = "") -> bool:
        """Check a gathered record's header, CRC and blocks; count it when good. A record that
        ran on into another file names the last one (``continued_in``) when its CRC fails."""
        lsn, head = rec.lsn, rec.head
        tot_len, _xid, prev_link, info, rmid, _crc = RECORD_HEADER.unpack_from(head)
        kind, detail, fpi = judge_record(head, rec.crc, rec.prev)
        if kind:
            if kind == "crc_mismatch" and continued_in:
                detail += (f" (the record runs on into {continued_in}: the damage is in one "
                           "of the files it spans)")
            self._problem(kind, lsn, detail)
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

    def _gather(self, pos: int, tot_len: int) -> tuple[Pending, int] | Pending | None:
        """A record gathered and the offset where it ends; Pending when the segment ends
        first; None (after reporting why) when it cannot be read."""
        got = gather(self.data, self.pages, pos, tot_len, start_lsn=self.start_lsn,
                     segment_size=self.segment_size)
        if isinstance(got, tuple) and isinstance(got[0], str):
            kind, detail, severity = got
            self._problem(kind, self.start_lsn + pos, str(detail), str(severity))
            return None
        return got

    # -- the next segment --------------------------------------------------------------------
    def next_bytes_needed(self) -> int:
        """How many bytes of the following segment finish the pending record (0: none)."""
        return 0 if self.pending is None else bytes_needed(self.pending, self.segment_size)

    def pending_next_start(self) -> int | None:
        """LSN of the segment that continues the pending record, if there is one."""
        return None if self.pending is None else self.pending.next_start

    def continue_record(self, data: bytes, file: str, *, partial: bool = False) -> None:
        """Finish the pending record from the next segment's first pages (``partial``: WAL
        may end in them)."""
        pend = self.pending
        if pend is None:
            return
        state, end, detail = continue_pending(pend, data, self.segment_size, partial)
        if state == "more":
            return
        if state == "missing":
            self.next_missing()
            return
        self.pending = None
        if state == "bad":  # the damage is in ``file``, at the page that should continue it
            self._problem("bad_record", pend.next_start + end, f"the record at "
                          f"{format_lsn(pend.lsn)} in {self.file} continues here, but this page "
                          f"header: {detail}", file=file, breaks_at=pend.lsn)
            return
        if self._accept(pend, file):
            self.end_lsn = pend.next_start + maxalign(end)
            if self.switched:
                self.end_lsn = pend.next_start

    def next_missing(self) -> None:
        """The following segment is not available: the pending record stays unfinished."""
        if self.pending is not None:
            self.incomplete_tail = True
            self.pending = None

    # -- result ------------------------------------------------------------------------------
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
            partial=self.partial, data_bytes=self.data_len,
            system_identifier=self.pages.system_identifier,
            page_tlis=tuple(self.pages.page_tlis),
            rmgr=group_totals(self.counts, self.rec_bytes, self.fpi_bytes, lambda key: key >> 4),
            record_types=group_totals(self.counts, self.rec_bytes, self.fpi_bytes, record_type),
            first_record_lsn=self.first_record_lsn, first_record_prev=self.first_record_prev,
            last_record_lsn=self.last_record_lsn, end_lsn=self.end_lsn, valid_end=valid_end,
            switched=self.switched, incomplete_tail=self.incomplete_tail,
            record_lsns=tuple(self.lsns or ()), problems=tuple(self.problems),
            unlisted_problems=self.unlisted_problems,
        )
