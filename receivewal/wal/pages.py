"""The page headers of one WAL segment (pure): the checks xlogreader makes (PostgreSQL 15-18).

:func:`check_pages` reads every 8 kB page header of a segment's bytes and judges each with
:func:`receivewal.wal.pageheader.page_header_problem` (magic: a known major's on the first
page, the first page's on every other (:mod:`receivewal.wal.majors`); flag bits, timeline,
page address, and on the first page the long header: segment size, block size). It returns
a :class:`PageMap` that the record walk (:mod:`receivewal.wal.reader`) consults, and the
problems found. One pass over the data:
zeros that run to the end of the data (where WAL ends in a zero-padded file) are found once,
never per page.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from receivewal.wal import nativescan
from receivewal.wal.pageheader import (
    LONG_FIELDS,
    SHORT_HEADER,
    SIZE_OF_LONG_PHD,
    SIZE_OF_SHORT_PHD,
    XLOG_BLCKSZ,
    XLP_FIRST_IS_CONTRECORD,
    page_header_problem,
    segment_magic,
)

# (kind, LSN, detail): a problem before it is tied to a file
Finding = tuple[str, int, str]


def maxalign(n: int) -> int:
    """Round up to PostgreSQL's MAXALIGN (8 bytes)."""
    return (n + 7) & ~7


@dataclass
class PageMap:
    """Per page: whether its header is good, its flags and its continuation length."""

    page_ok: list[bool] = field(default_factory=list)
    flags: list[int] = field(default_factory=list)
    rems: list[int] = field(default_factory=list)
    page_tlis: list[tuple[int, int]] = field(default_factory=list)
    system_identifier: int | None = None
    magic: int | None = None  # the first page's, when a known major's (every page's then)
    zero_from: int | None = None  # offset where zeros run to the end of the data

    @property
    def n_pages(self) -> int:
        """Pages read (those before the zeros at the end)."""
        return len(self.page_ok)

    def record_start(self, p: int) -> int | None:
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


_ZERO_PAGE = bytes(XLOG_BLCKSZ)


def zero_tail_start(buf: bytes | bytearray, size: int) -> int:
    """The first page offset from which ``buf[:size]`` (whole pages) holds only zeros: one
    look at each page of the zero tail, from the end."""
    view = memoryview(buf)
    off = size - size % XLOG_BLCKSZ
    while off and view[off - XLOG_BLCKSZ:off] == _ZERO_PAGE:
        off -= XLOG_BLCKSZ
    return off


def record_bytes(data: bytes | bytearray, off: int, length: int) -> bytes | None:
    """The ``length`` bytes of the record at ``off`` in a segment's ``data``, without the page
    headers it runs over (the continuation headers are not checked: the scan judged them);
    None when the data ends first."""
    parts, need = [], length
    while need:
        if off >= len(data):
            return None
        if not off % XLOG_BLCKSZ:
            off += SIZE_OF_LONG_PHD if off == 0 else SIZE_OF_SHORT_PHD
        take = min(need, XLOG_BLCKSZ - off % XLOG_BLCKSZ, len(data) - off)
        parts.append(data[off:off + take])
        off += take
        need -= take
    return b"".join(parts)


def readable_pages(data_len: int, partial: bool) -> int:
    """Pages whose header lies within ``data_len`` bytes: a .partial's last page may be cut."""
    pages = data_len // XLOG_BLCKSZ
    rest = data_len % XLOG_BLCKSZ
    if partial and rest >= (SIZE_OF_LONG_PHD if pages == 0 else SIZE_OF_SHORT_PHD):
        pages += 1
    return pages


def check_pages(buf: bytes | bytearray, *, data_len: int, start_lsn: int, segment_size: int,
                timeline: int, partial: bool, first_page: int = 0,
                pages: PageMap | None = None) -> tuple[PageMap, list[Finding]]:
    """Check page headers from ``first_page`` on (the ones before it are in ``pages``)."""
    pmap = pages if pages is not None else PageMap()
    findings: list[Finding] = []
    if first_page == 0 and (data_len > segment_size
                            or (data_len != segment_size and not partial)):
        findings.append(("truncated_segment", start_lsn + data_len - data_len % XLOG_BLCKSZ,
                         f"segment holds {data_len} bytes, expected {segment_size}"))
    n = min(readable_pages(data_len, partial), segment_size // XLOG_BLCKSZ)
    zeros = zero_tail_start(buf, n * XLOG_BLCKSZ)
    if first_page == 0:
        pmap.magic = segment_magic(memoryview(buf)[:data_len])
    if nativescan.native is not None and first_page == 0:  # the leading pages with nothing to say
        first_page, pmap.system_identifier, pmap.page_tlis, pmap.flags, pmap.rems = (
            nativescan.native.check_pages(buf, min(n, zeros // XLOG_BLCKSZ), start_lsn, timeline,
                                     segment_size, pmap.magic or 0))
        pmap.page_ok = [True] * first_page
    prev_tli = pmap.page_tlis[-1][1] if pmap.page_tlis else 0
    for p in range(first_page, n):
        off = p * XLOG_BLCKSZ
        if off >= zeros:  # zeros to the end: WAL ends here
            pmap.zero_from = off
            break
        lsn = start_lsn + off
        magic, info, tli, addr, rem = SHORT_HEADER.unpack_from(buf, off)
        long_fields = LONG_FIELDS.unpack_from(buf, SIZE_OF_SHORT_PHD) if p == 0 else None
        bad = page_header_problem((magic, info, tli, addr), address=lsn, timeline=timeline,
                                  prev_tli=prev_tli, long_fields=long_fields,
                                  segment_size=segment_size, magic=pmap.magic)
        if bad:
            findings.append(("bad_page_header", lsn, bad))
        else:
            if long_fields is not None:
                pmap.system_identifier = long_fields[0]
            if tli != prev_tli:
                pmap.page_tlis.append((lsn, tli))
            prev_tli = tli
        pmap.page_ok.append(not bad)
        pmap.flags.append(info)
        pmap.rems.append(rem)
    return pmap, findings

