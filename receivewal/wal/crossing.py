"""Records that cross pages and segments (pure): gathering their pieces.

A record longer than what is left of its page continues on the next pages, after each page's
short header, whose ``xlp_rem_len`` must say how much of it is still to come. When it runs
past the end of the segment, it is a :class:`Pending` record that the first pages of the
following segment finish (:func:`continue_pending`), however many segments it spans.

A record is never held whole beyond its first segment: :class:`Pending` keeps the bytes that
lie in the segment where it starts (and at least the first page's worth, where the header
and block headers are) and runs the CRC-32C over the rest piece by piece, so a record of
PostgreSQL's maximum length (about 1 GB) costs a segment's worth of memory, not its length.
"""

from __future__ import annotations

from dataclasses import dataclass

from receivewal.wal.lsn import format_lsn
from receivewal.wal.nativescan import crc32c_function
from receivewal.wal.pageheader import (
    SHORT_HEADER,
    SIZE_OF_LONG_PHD,
    SIZE_OF_SHORT_PHD,
    XLOG_BLCKSZ,
    XLP_FIRST_IS_CONTRECORD,
    XLP_FIRST_IS_OVERWRITE_CONTRECORD,
    page_identity_problem,
)
from receivewal.wal.pages import Finding, PageMap
from receivewal.wal.records import MAX_RECORD_LENGTH, SIZE_OF_XLOG_RECORD

_PAGE_MASK = XLOG_BLCKSZ - 1

# (kind, detail, severity) of a record that cannot be gathered; its LSN is the record's
Refusal = tuple[str, str, str]


#: Bytes of a record kept from the segments after its first: the 24-byte header and the block
#: headers (at most 33 blocks of 27 bytes and a few ids: under 1 kB) lie within them.
HEAD_KEPT = XLOG_BLCKSZ


@dataclass
class Pending:
    """A record being gathered: its first bytes, and the CRC-32C of the rest so far."""

    lsn: int
    prev: int | None  # the start of the record before it, when known
    tot_len: int
    next_start: int  # LSN of the segment that must continue it
    head: bytearray  # the record's first bytes: header, block headers (see HEAD_KEPT)
    got: int = 0  # bytes of the record gathered so far
    crc: int = 0  # CRC-32C of the gathered bytes after the 24-byte header

    def add(self, piece: bytes | memoryview, *, keep: bool = False) -> None:
        """Gather the record's next ``piece``: kept in ``head`` when ``keep`` (the pieces in
        the record's own segment) or while the head is shorter than HEAD_KEPT, and in the
        running CRC from the record's 25th byte on."""
        if keep or len(self.head) < HEAD_KEPT:
            self.head += piece if keep else piece[:HEAD_KEPT - len(self.head)]
        skip = SIZE_OF_XLOG_RECORD - self.got
        self.crc = crc32c_function()(piece[skip:] if skip > 0 else piece, self.crc)
        self.got += len(piece)


def gather(data: bytes | bytearray, pages: PageMap, pos: int, tot_len: int, *, start_lsn: int,
           segment_size: int) -> tuple[Pending, int] | Pending | Refusal:
    """The record at ``pos`` gathered, and the offset where it ends, checking each
    continuation header; a :class:`Pending` record when the data ends first."""
    view = memoryview(data)
    rec = Pending(start_lsn + pos, None, tot_len, start_lsn + segment_size, bytearray())
    page_end = (pos | _PAGE_MASK) + 1
    if tot_len <= page_end - pos:
        rec.add(view[pos:pos + tot_len], keep=True)
        return rec, pos + tot_len
    rec.add(view[pos:page_end], keep=True)
    p = page_end >> 13
    end = page_end
    while rec.got < tot_len:
        if p >= pages.n_pages:
            return rec
        if not pages.page_ok[p]:
            return ("bad_record", "record continues into a damaged page", "error")
        if pages.flags[p] & XLP_FIRST_IS_OVERWRITE_CONTRECORD:
            return ("aborted_contrecord", "record was overwritten by XLOG_OVERWRITE_CONTRECORD",
                    "warning")
        need = tot_len - rec.got
        if not pages.flags[p] & XLP_FIRST_IS_CONTRECORD or pages.rems[p] != need:
            return ("bad_record", f"invalid contrecord length {pages.rems[p]} at "
                    f"{format_lsn(start_lsn + p * XLOG_BLCKSZ)}, expected {need}", "error")
        off = p * XLOG_BLCKSZ + SIZE_OF_SHORT_PHD
        take = min(XLOG_BLCKSZ - SIZE_OF_SHORT_PHD, need)
        rec.add(view[off:off + take], keep=True)
        end = off + take
        p += 1
    return rec, end


def tail_problem(pages: PageMap, start_lsn: int) -> Finding | None:
    """The tail of a record from the previous segment opens the segment: the first page whose
    header does not continue it, as a finding (None when they all do)."""
    if not (pages.n_pages and pages.page_ok[0] and pages.flags[0] & XLP_FIRST_IS_CONTRECORD):
        return None
    need, p = pages.rems[0], 0
    while True:
        avail = XLOG_BLCKSZ - (SIZE_OF_LONG_PHD if p == 0 else SIZE_OF_SHORT_PHD)
        if need <= avail:
            return None
        need -= avail
        p += 1
        if p >= pages.n_pages or not pages.page_ok[p]:
            return None
        if not pages.flags[p] & XLP_FIRST_IS_CONTRECORD or pages.rems[p] != need:
            return ("bad_page_header", start_lsn + p * XLOG_BLCKSZ,
                    f"invalid contrecord length {pages.rems[p]}, expected {need}")


def followers_needed(segment_size: int) -> int:
    """How many segments after its own the longest record recovery reads can run into."""
    usable = (segment_size - segment_size // XLOG_BLCKSZ * SIZE_OF_SHORT_PHD
              - (SIZE_OF_LONG_PHD - SIZE_OF_SHORT_PHD))
    return MAX_RECORD_LENGTH // usable + 1


def bytes_needed(pend: Pending, segment_size: int) -> int:
    """How many bytes of the following segment finish ``pend``."""
    need = pend.tot_len - pend.got
    pages = (need + SIZE_OF_LONG_PHD) // (XLOG_BLCKSZ - SIZE_OF_SHORT_PHD) + 1
    return min(pages * XLOG_BLCKSZ, segment_size)


def continue_pending(pend: Pending, data: bytes, segment_size: int,
                     partial: bool = False) -> tuple[str, int, str]:
    """Add the pieces of ``pend`` that the first pages of ``data`` hold.

    Returns ``("done", end, "")`` with the offset in ``data`` where the record ends,
    ``("more", 0, "")`` when it runs on into the segment after that (``next_start`` moved on),
    ``("missing", 0, "")`` when ``data`` ends first (in a ``partial`` file, also where its
    zero padding begins), or ``("bad", offset, detail)`` with the offset in ``data`` of the
    page header that does not continue it (the damage is there) and what is wrong with it.
    """
    p = 0
    end = 0
    while pend.got < pend.tot_len:
        off = p * XLOG_BLCKSZ
        need = pend.tot_len - pend.got
        hdr = SIZE_OF_LONG_PHD if off == 0 else SIZE_OF_SHORT_PHD
        take = min(XLOG_BLCKSZ - hdr, need)
        if off + hdr + take > len(data):  # (a compressed .partial may end inside a page)
            if len(data) >= segment_size:  # runs on into the segment after that
                pend.next_start += segment_size
                return ("more", 0, "")
            return ("missing", 0, "")
        if partial and not any(data[off:off + hdr]):  # the .partial's WAL ends before here
            return ("missing", 0, "")
        wrong = _continuation_problem(SHORT_HEADER.unpack_from(data, off),
                                      pend.next_start + off, need)
        if wrong:
            return ("bad", off, wrong)
        pend.add(memoryview(data)[off + hdr:off + hdr + take])
        end = off + hdr + take
        p += 1
    return ("done", end, "")


def _continuation_problem(header: tuple[int, int, int, int, int], address: int, need: int,
                          ) -> str:
    """What is wrong with a page header that should continue a record ("" when nothing)."""
    magic, info, _tli, addr, rem = header
    wrong = page_identity_problem(magic, addr, address)
    if wrong:
        return wrong
    if not info & XLP_FIRST_IS_CONTRECORD:
        return "the contrecord flag is not set"
    if rem != need:
        return f"remaining length {rem}, expected {need}"
    return ""
