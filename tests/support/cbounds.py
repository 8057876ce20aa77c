"""Hand the C scanner short and odd buffers directly (no Python padding), in a child process.

``python -m support.cbounds SEGMENT_FILE`` calls ``receivewal.wal._scan.check_pages`` and
``walk`` on prefixes of a real segment of every awkward length, each in a buffer whose bytes
end at an unreadable page (:mod:`support.guarded`), with page lists that promise more pages
than the buffer holds, and with out-of-range arguments. An out-of-bounds read is a SIGSEGV
(the child's exit status); otherwise each call's answer is checked against the buffer's
bounds, and the last line printed is ``ok N`` with the number of calls made.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import zstandard

from receivewal.wal import nativescan
from receivewal.wal.pageheader import XLOG_BLCKSZ
from receivewal.wal.pages import check_pages
from support.guarded import guarded

SEG = 1 << 20
#: prefix lengths: inside the long header, inside a record, one byte short of a page, a few
#: bytes into the next page's header, a record crossing into a page that is cut short
LENGTHS = (0, 1, 23, 24, 39, 40, 44, 64, 100, 500, 4000, XLOG_BLCKSZ - 1, XLOG_BLCKSZ,
           XLOG_BLCKSZ + 2, XLOG_BLCKSZ + 10, XLOG_BLCKSZ + 30, 2 * XLOG_BLCKSZ - 1,
           3 * XLOG_BLCKSZ + 777)


def walk(native: ModuleType, buf: memoryview, pos: int, *, end_data: int, page_ok: bytes,
         start_lsn: int) -> int:
    """One ``walk`` call with fresh totals; the position where it stopped."""
    counts, rec_bytes, fpi = [0] * 4096, [0] * 4096, [0] * 4096
    stop = native.walk(buf, pos, end_data, page_ok, start_lsn, False, 0, len(buf), True,
                       counts, rec_bytes, fpi, [])[0]
    assert isinstance(stop, int)
    return stop


def main(path: str) -> None:
    """Run every case; print ``ok N``."""
    native = nativescan.load_native()
    assert native is not None, "the C extension is not built"
    name = Path(path).name.removesuffix(".zst")
    data = zstandard.ZstdDecompressor().decompress(Path(path).read_bytes(), max_output_size=SEG)
    start = int(name[8:16], 16) * 0x100000000 + int(name[16:24], 16) * SEG
    timeline = int(name[:8], 16)
    pmap, _ = check_pages(data, data_len=len(data), start_lsn=start, segment_size=SEG,
                          timeline=timeline, partial=False)
    first = pmap.record_start(0)
    assert first is not None
    calls = 0
    for length in LENGTHS:
        buf = guarded(data[:length])
        pages = -(-length // XLOG_BLCKSZ)  # the last page may be cut
        for n in (pages, pages + 1, 1 << 40, sys.maxsize):
            good = native.check_pages(buf, n, start, timeline, SEG, pmap.magic or 0)[0]
            assert 0 <= good <= length // XLOG_BLCKSZ, (length, n, good)
            calls += 1
        for page_ok in (b"\x01" * pages, b"\x01" * 128):
            for end_data in (pages * XLOG_BLCKSZ, len(page_ok) * XLOG_BLCKSZ, sys.maxsize):
                stop = walk(native, buf, first, end_data=end_data, page_ok=page_ok,
                            start_lsn=start)
                assert stop <= max(first, length + 7), (length, end_data, stop)
                calls += 1
    short = guarded(data[:100], at="start")
    for pos in (-1, -24, -8192, -sys.maxsize):
        try:
            walk(native, short, pos, end_data=100, page_ok=b"\x01", start_lsn=start)
        except ValueError:
            calls += 1
        else:
            raise AssertionError(f"walk accepted the negative position {pos}")
    print(f"ok {calls}")


if __name__ == "__main__":
    main(sys.argv[1])
