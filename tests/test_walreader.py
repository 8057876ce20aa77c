"""The segment parser on a committed real segment pair (fast, no server).

``tests/data/wal`` holds two consecutive 1 MiB segments written by a PostgreSQL 15 server
(zstd-compressed; a record crosses from the first into the second) and ``pg_waldump --stats``
output for them, made by ``tests/data/wal/make_fixture.py``.
"""

from __future__ import annotations

import gzip
import itertools
import struct
from pathlib import Path

import lz4.frame
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from support.scanner import scan_segment, scanner_path  # noqa: F401 - scanner_path: a fixture
from support.waldump import by_rmgr, parse_stats

from receivewal.archive.compression import read_wal_file
from receivewal.check.verify import record_type_totals, rmgr_totals
from receivewal.wal.names import parse_segment_file_name
from receivewal.wal.reader import SegmentScan, fpi_bytes_of
from receivewal.wal.rmgr import RMGR_NAMES, rmgr_id, rmgr_id_is_valid, rmgr_name

DATA = Path(__file__).parent / "data" / "wal"
SEG = 1 << 20
NAMES = sorted(p.name.removesuffix(".zst") for p in DATA.glob("*.zst"))

# Every test here runs on both scanner paths: the C extension and pure Python.
pytestmark = pytest.mark.usefixtures("scanner_path")


@pytest.fixture(scope="module")
def segments() -> dict[str, bytes]:
    """The fixture segments, decompressed."""
    return {n: zstandard.ZstdDecompressor().decompress(
        (DATA / f"{n}.zst").read_bytes(), max_output_size=SEG) for n in NAMES}


def scan(data: bytes, name: str, nxt: bytes | None = None, *, partial: bool = False,
         collect: bool = False) -> SegmentScan:
    """Scan one segment, finishing its last record from ``nxt`` when given."""
    return scan_segment(data, name, SEG, nxt, partial=partial, collect=collect)


def scan_pair(segments: dict[str, bytes]) -> list[SegmentScan]:
    """Both fixture segments, the first finished from the second."""
    first, second = NAMES
    return [scan(segments[first], first, segments[second]), scan(segments[second], second)]


def errors(s: SegmentScan) -> list[str]:
    """The kinds of error problems of a scan."""
    return [p.kind for p in s.problems if p.severity == "error"]


def test_statistics_equal_pg_waldump_stats(segments: dict[str, bytes]) -> None:
    """Records, record bytes and FPI bytes per rmgr equal pg_waldump --stats on the pair."""
    scans = scan_pair(segments)
    assert rmgr_totals(scans) == parse_stats((DATA / "waldump-stats.txt").read_text())
    assert all(not s.problems for s in scans)


def test_record_type_statistics_equal_pg_waldump_stats_record(
        segments: dict[str, bytes]) -> None:
    """Per record type (xl_info's high bits; Transaction's opcode bits) the rows equal
    pg_waldump --stats=record, compared per resource manager without the record names."""
    ours: dict[str, list[tuple[int, int, int]]] = {}
    for (name, _rtype), row in record_type_totals(scan_pair(segments)).items():
        ours.setdefault(name, []).append(row)
    expected = by_rmgr(parse_stats((DATA / "waldump-stats-record.txt").read_text()))
    assert {k: sorted(v) for k, v in sorted(ours.items())} == expected
    assert len(expected["Heap"]) > 2


def test_record_crossing_segments_is_counted_where_it_starts(segments: dict[str, bytes]) -> None:
    """The first segment's last record ends in the second: finished from the second's first
    pages; without them it is an incomplete tail, not counted and not an error."""
    first, second = NAMES
    whole = scan(segments[first], first, segments[second])
    alone = scan(segments[first], first)
    assert whole.records == alone.records + 1
    assert whole.valid_end == whole.start_lsn + SEG
    assert alone.incomplete_tail
    assert alone.valid_end == alone.end_lsn == whole.last_record_lsn
    assert not alone.problems
    follower = scan(segments[second], second)
    assert follower.first_record_prev == whole.last_record_lsn


def test_system_identifier_and_page_timelines(segments: dict[str, bytes]) -> None:
    """The long header's system identifier is read; all pages are on timeline 1."""
    first, _ = NAMES
    s = scan(segments[first], first)
    assert s.system_identifier == struct.unpack_from("<Q", segments[first], 24)[0]
    assert s.page_tlis == ((s.start_lsn, 1),)


@pytest.mark.parametrize("suffix", ["", ".gz", ".lz4", ".zst", ".partial", ".gz.partial"])
def test_every_archive_format_reads_the_same_bytes(segments: dict[str, bytes], tmp_path: Path,
                                                   suffix: str) -> None:
    """Plain, gzip, LZ4 frame and zstd files (and .partial) decompress to the segment."""
    name = NAMES[0]
    raw = segments[name]
    packers = {".gz": gzip.compress, ".lz4": lz4.frame.compress,
               ".zst": zstandard.ZstdCompressor().compress}
    packer = packers.get(suffix.removesuffix(".partial"), lambda b: b)
    path = tmp_path / f"{name}{suffix}"
    path.write_bytes(packer(raw))
    seg = parse_segment_file_name(path.name, SEG)
    assert seg is not None
    assert read_wal_file(str(path), seg.compression) == raw
    assert read_wal_file(str(path), seg.compression, 8192 * 3) == raw[:8192 * 3]


def test_flipped_bit_is_a_crc_mismatch_at_the_record(segments: dict[str, bytes]) -> None:
    """A bit flipped in a record's data: crc_mismatch at exactly that record's LSN."""
    name = NAMES[0]
    lsns = scan(segments[name], name, collect=True).record_lsns
    lsn = next(a for a, b in itertools.pairwise(lsns[100:])
               if b - a > 64 and a % 8192 < 8000)
    data = bytearray(segments[name])
    data[lsn % SEG + 30] ^= 0x10
    s = scan(bytes(data), name)
    assert [(p.kind, p.lsn) for p in s.problems] == [("crc_mismatch", lsn)]
    assert s.valid_end == lsn
    assert s.records == len(lsns) - 1  # the walk goes on after the damaged record


def test_damaged_page_header(segments: dict[str, bytes]) -> None:
    """A wrong magic number on page 7: bad_page_header at the page; the records that run
    into it are lost, the walk resumes on the next page."""
    name = NAMES[0]
    data = bytearray(segments[name])
    data[7 * 8192] ^= 0xFF
    s = scan(bytes(data), name)
    start = s.start_lsn
    assert ("bad_page_header", start + 7 * 8192) in [(p.kind, p.lsn) for p in s.problems]
    assert s.valid_end <= start + 7 * 8192
    assert s.records > 0


def test_zeroed_tail_of_complete_segment_is_an_error(segments: dict[str, bytes]) -> None:
    """Zeros from the middle of a complete segment to its end: zeroed_tail."""
    name = NAMES[0]
    data = segments[name][:SEG // 2] + bytes(SEG // 2)
    s = scan(data, name)
    assert "zeroed_tail" in errors(s)
    assert s.valid_end <= s.start_lsn + SEG // 2


def test_zero_padded_partial_ends_cleanly(segments: dict[str, bytes]) -> None:
    """The same zeros in a .partial are where WAL ends: no problem, valid up to the end."""
    name = NAMES[0]
    data = segments[name][:SEG // 2] + bytes(SEG // 2)
    s = scan(data, name, partial=True)
    assert not s.problems
    assert s.start_lsn < s.valid_end <= s.start_lsn + SEG // 2


def test_damaged_continuation_in_next_segment(segments: dict[str, bytes]) -> None:
    """A byte of the crossing record's tail damaged in the second segment: the first
    segment's scan reports crc_mismatch at the crossing record."""
    first, second = NAMES
    nxt = bytearray(segments[second])
    nxt[44] ^= 0x01
    whole = scan(segments[first], first, segments[second])
    s = scan(segments[first], first, bytes(nxt))
    assert [(p.kind, p.lsn) for p in s.problems] == [("crc_mismatch", whole.last_record_lsn)]


def test_wrong_contrecord_length_in_next_segment(segments: dict[str, bytes]) -> None:
    """The second segment's xlp_rem_len disagreeing with the record: bad_record."""
    first, second = NAMES
    nxt = bytearray(segments[second])
    struct.pack_into("<I", nxt, 16, struct.unpack_from("<I", nxt, 16)[0] + 8)
    s = scan(segments[first], first, bytes(nxt))
    assert "bad_record" in errors(s)


def test_foreign_segment_size_in_long_header(segments: dict[str, bytes]) -> None:
    """A long header that declares another segment size: bad_page_header on page 0."""
    name = NAMES[0]
    data = bytearray(segments[name])
    struct.pack_into("<I", data, 32, 16 << 20)
    s = scan(bytes(data), name)
    assert ("bad_page_header", s.start_lsn) in [(p.kind, p.lsn) for p in s.problems]


def test_fpi_bytes_of_decodes_block_headers() -> None:
    """One block with a 100-byte image and 6 bytes of data, then 3 bytes of main data."""
    blocks = bytes([0, 0x10 | 0x20]) + struct.pack("<H", 6)
    blocks += struct.pack("<HHB", 100, 0, 0) + bytes(12) + struct.pack("<I", 7)
    blocks += bytes([255, 3])
    record = bytes(24) + blocks + bytes(100 + 6 + 3)
    assert fpi_bytes_of(record, 24, len(record)) == 100
    assert fpi_bytes_of(record, 24, len(record) - 1) == -1  # lengths no longer add up
    same_rel_first = bytes(24) + bytes([0, 0x80 | 0x20]) + struct.pack("<H", 1) + bytes(5)
    assert fpi_bytes_of(same_rel_first, 24, len(same_rel_first)) == -1


def test_rmgr_names_follow_postgresql_15() -> None:
    """Ids and names as rmgrlist.h lists them; custom ids are custom###."""
    assert RMGR_NAMES[10] == "Heap"
    assert RMGR_NAMES[21] == "LogicalMessage"
    assert rmgr_name(130) == "custom130"
    assert rmgr_id("Btree") == 11
    assert rmgr_id("custom130") == 130
    assert not rmgr_id_is_valid(22)
    assert rmgr_id_is_valid(128)


@settings(max_examples=60, deadline=None)
@given(offsets=st.lists(st.integers(0, SEG - 1), min_size=1, max_size=8),
       value=st.integers(0, 255))
def test_random_damage_only_raises_problems(offsets: list[int], value: int) -> None:
    """Overwriting random bytes never raises: every damage becomes WalProblem entries."""
    name = NAMES[0]
    raw = zstandard.ZstdDecompressor().decompress((DATA / f"{name}.zst").read_bytes(),
                                                  max_output_size=SEG)
    data = bytearray(raw)
    for off in offsets:
        data[off] = value
    s = scan(bytes(data), name)
    if bytes(data) != raw:
        assert s.records >= 0
    assert all(p.file == name for p in s.problems)


@settings(max_examples=40, deadline=None)
@given(garbage=st.binary(min_size=0, max_size=3 * 8192))
def test_garbage_segment_only_raises_problems(garbage: bytes) -> None:
    """Arbitrary bytes as a segment: problems, never an exception."""
    s = scan(garbage, NAMES[0])
    assert s.problems


@pytest.mark.parametrize(("tot_len", "too_long"), [(0x3FFFDFFF, False), (0x3FFFE000, True)])
def test_record_length_limit_is_postgresql_15s(segments: dict[str, bytes], tot_len: int,
                                               too_long: bool) -> None:
    """An xl_tot_len up to PostgreSQL 15's limit (its xlogreader allocates the length rounded
    up past the next page boundary, at most MaxAllocSize: 1 GiB - 8 KiB - 1) is read as a
    record that runs on (here into pages that do not continue it); one byte more is refused
    as "too long", as recovery refuses it."""
    first = NAMES[0]
    intact = scan(segments[first], first, collect=True)
    lsn = intact.record_lsns[len(intact.record_lsns) // 2]
    data = bytearray(segments[first])
    struct.pack_into("<I", data, lsn - intact.start_lsn, tot_len)
    details = [p.detail for p in scan(bytes(data), first).problems if p.lsn == lsn]
    assert details
    assert any("too long" in d for d in details) == too_long, details
