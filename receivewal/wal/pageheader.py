"""WAL page headers (pure): the one place that knows their layout.

Every 8 kB page of a segment starts with a short header (magic, flags, timeline, page address,
continuation length); the first page of a segment has the long one, which adds the system
identifier, the segment size and the block size. The layouts are the same from PostgreSQL 15
to 18; the magic is each major's own (:mod:`receivewal.wal.majors`): a segment's first page
carries a known major's, every other page the first page's.
"""

from __future__ import annotations

import struct

from receivewal.errors import ConfigurationError
from receivewal.wal.lsn import DEFAULT_SEGMENT_SIZE, check_segment_size, format_lsn
from receivewal.wal.majors import MAJOR_OF_MAGIC, magic_problem

TYPE_CHECKING = False  # restore's lean path loads no typing (~10 ms): see receivewal.restore
if TYPE_CHECKING:
    from collections.abc import Iterable

XLOG_BLCKSZ = 8192
SIZE_OF_SHORT_PHD = 24
SIZE_OF_LONG_PHD = 40
XLP_FIRST_IS_CONTRECORD = 0x0001
XLP_LONG_HEADER = 0x0002
XLP_FIRST_IS_OVERWRITE_CONTRECORD = 0x0008
XLP_ALL_FLAGS = 0x000F
MAX_SYSTEM_IDENTIFIER = 0xFFFFFFFFFFFFFFFF  # xlp_sysid is a uint64
AGREEING_HEADERS = 3  # headers that settle an archive's segment size (analyze reads remotely)

SHORT_HEADER = struct.Struct("<HHIQI")  # xlp_magic, xlp_info, xlp_tli, xlp_pageaddr, xlp_rem_len
LONG_FIELDS = struct.Struct("<QII")  # xlp_sysid, xlp_seg_size, xlp_xlog_blcksz (at offset 24)


class LongPageHeader:
    """The header of a segment's first page (a plain class, read-only by convention: this
    module is on the restore_command call's path, where ``dataclasses`` costs ~15 ms)."""

    __slots__ = ("block_size", "info", "magic", "page_address", "rem_len", "segment_size",
                 "system_identifier", "timeline")

    def __init__(  # noqa: PLR0917 - the header's eight fields, in their order
            self, magic: int, info: int, timeline: int, page_address: int, rem_len: int,
            system_identifier: int, segment_size: int, block_size: int) -> None:
        self.magic, self.info, self.timeline, self.page_address = (magic, info, timeline,
                                                                   page_address)
        self.rem_len, self.system_identifier = rem_len, system_identifier
        self.segment_size, self.block_size = segment_size, block_size


def parse_long_header(data: bytes | memoryview) -> LongPageHeader | None:
    """The long header at the start of ``data``; None when ``data`` is too short to hold one.

    Nothing is validated here: see :func:`first_page_problem`.
    """
    if len(data) < SIZE_OF_LONG_PHD:
        return None
    return LongPageHeader(*SHORT_HEADER.unpack_from(data), *LONG_FIELDS.unpack_from(
        data, SIZE_OF_SHORT_PHD))


def header_segment_size(head: bytes | memoryview) -> int:
    """The segment size a segment's first bytes record in their long page header, valid as a
    wal_segment_size (a power of two, 1 MiB to 1 GiB): the one rule by which verify and
    restore take a segment size from a header. ConfigurationError saying why not."""
    header = parse_long_header(head)
    if header is None:
        raise ConfigurationError("too short to hold a WAL page header")
    return check_segment_size(header.segment_size)


def archive_segment_size(recorded: int | None,
                         heads: Iterable[tuple[str, bytes | memoryview]]) -> int | None:
    """An archive's segment size: the one rule of verify, analyze and restore.

    The size the archive's identity record states (``recorded``) when it has one. Else the
    size most segment files' own first page headers state: ``heads`` gives each file's name
    and first bytes (read lazily: reading stops once AGREEING_HEADERS agree), and a header
    counts only when its size is a valid wal_segment_size and its page address is where its
    file name puts the segment at that size, so that one damaged header decides nothing; a
    tie goes to PostgreSQL's default. None when nothing decides (the callers then take
    DEFAULT_SEGMENT_SIZE, verify first saying why no file could be read).
    """
    if recorded is not None:
        return check_segment_size(recorded)
    from receivewal.wal.names import parse_segment_file_name  # noqa: PLC0415 - off restore's lean path
    sizes: dict[int, int] = {}
    for name, head in heads:
        try:
            size = header_segment_size(head)
        except ConfigurationError:
            continue
        parsed = parse_segment_file_name(name, size)
        if parsed is None or parsed.start_lsn(size) != SHORT_HEADER.unpack_from(head)[3]:
            continue
        sizes[size] = sizes.get(size, 0) + 1
        if sizes[size] == AGREEING_HEADERS:
            break
    if not sizes:
        return None
    return max(sizes.items(), key=lambda kv: (kv[1], kv[0] == DEFAULT_SEGMENT_SIZE))[0]


def first_page_problem(
        header: LongPageHeader, *, timeline: int, page_address: int, segment_size: int,
        system_identifier: int | None = None) -> str | None:
    """Why ``header`` cannot start the segment its file name promises, or None."""
    return page_header_problem(
        (header.magic, header.info, header.timeline, header.page_address),
        address=page_address, timeline=timeline,
        long_fields=(header.system_identifier, header.segment_size, header.block_size),
        segment_size=segment_size, system_identifier=system_identifier) or None


def segment_magic(head: bytes | memoryview) -> int | None:
    """The magic a segment's pages carry: its first page's, when that is a known major's
    (None when it is not, or ``head`` is too short to hold it)."""
    if len(head) < SIZE_OF_SHORT_PHD:
        return None
    magic: int = SHORT_HEADER.unpack_from(head)[0]
    return magic if magic in MAJOR_OF_MAGIC else None


def page_identity_problem(magic: int, page_address: int, address: int,
                          expected: int | None = None) -> str:
    """Whether a page header is a WAL page header at all, and the one for ``address``:
    what is wrong with its magic number or page address ("" when nothing). ``expected`` is
    the magic of the segment's first page (None: any known major's)."""
    wrong = magic_problem(magic, expected)
    if wrong:
        return wrong
    if page_address != address:
        return f"page address {format_lsn(page_address)}, expected {format_lsn(address)}"
    return ""


def page_header_problem(  # noqa: PLR0911 - one return per check, as xlogreader reports
        header: tuple[int, int, int, int], *, address: int, timeline: int, prev_tli: int = 0,
        long_fields: tuple[int, int, int] | None = None, segment_size: int = 0,
        system_identifier: int | None = None, magic: int | None = None) -> str:
    """Why a page header cannot be read where it stands ("" when nothing): the checks of
    XLogReaderValidatePageHeader (the same in PostgreSQL 15 to 18), the one definition of
    them here.

    ``header`` is (xlp_magic, xlp_info, xlp_tli, xlp_pageaddr); ``address`` the LSN where the
    page stands; ``timeline`` the file's; ``prev_tli`` the timeline of the page before it.
    ``long_fields`` is (xlp_sysid, xlp_seg_size, xlp_xlog_blcksz) for a segment's first page
    and None for the others; ``system_identifier`` is compared when given. ``magic`` is the
    magic of the segment's first page (:func:`segment_magic`); None: the page's own must be a
    known major's. The C scanner (``_scan.c``, check_pages) makes the same checks in the same
    order, handed the same magic.
    """
    page_magic, info, tli, page_address = header
    wrong = magic_problem(page_magic, magic)
    if wrong:
        return wrong
    if info & ~XLP_ALL_FLAGS:
        return f"invalid info bits {info:04X}"
    if page_address != address:
        return page_identity_problem(page_magic, page_address, address)
    if tli == 0 or tli > timeline:
        return f"page timeline {tli} does not belong in a timeline {timeline} file"
    if tli < prev_tli:
        return f"out-of-sequence timeline {tli} after {prev_tli}"
    if long_fields is None:
        return ("long header on a page that does not start the segment"
                if info & XLP_LONG_HEADER else "")
    if not info & XLP_LONG_HEADER:
        return "first page of the segment lacks the long header"
    sysid, seg_size, blcksz = long_fields
    if seg_size != segment_size:
        return f"segment size {seg_size} in page header, expected {segment_size}"
    if blcksz != XLOG_BLCKSZ:
        return f"block size {blcksz} in page header, expected {XLOG_BLCKSZ}"
    if system_identifier is not None and sysid != system_identifier:
        return f"system identifier {sysid}, expected {system_identifier}"
    return ""
