"""Records that span many segments, up to PostgreSQL's own limit (issue 18 item 10).

A real PostgreSQL 15 server with 1 MiB segments writes a 24 MB logical message (one record
over some 23 segments) and a second one of several segments that ends exactly at a segment
boundary. The archive of its completed segments must be recoverable for ``verify`` on both
scanner paths (which must give the same scans) and for ``analyze``'s tables; a byte changed
inside the huge record is a CRC mismatch; and verify's memory is bounded by segments, not by
the record (a record is checked piece by piece, never held whole).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support.memory import PEAK_RSS_KB
from support.scanner import scanner_path  # noqa: F401 - the fixture, used below
from support.servers import PgServer, make_shared_dir
from support.sparkarchives import (
    COMPRESSORS,
    INITDB_ARGS,
    SEGMENT_SIZE,
    compressed_copy,
    copy_completed_segments,
    lsn_int,
)
from support.waldump import parse_record_lsns, parse_stats, waldump_output

from receivewal.check.verify import rmgr_totals, verify_archive
from receivewal.wal import nativescan
from receivewal.wal.lsn import format_lsn
from receivewal.wal.names import wal_file_name
from receivewal.wal.pageheader import SIZE_OF_LONG_PHD, SIZE_OF_SHORT_PHD, XLOG_BLCKSZ
from receivewal.wal.reader import SegmentScan

pytestmark = [pytest.mark.server, pytest.mark.slow]

SEG = SEGMENT_SIZE
HUGE = 24_000_000  # bytes of the big message: a record over some 23 segments of 1 MiB
PREFIX = "huge"
# XLogRecord, XLR_BLOCK_ID_DATA_LONG and its length, xl_logical_message, the prefix and its NUL
MESSAGE_OVERHEAD = 24 + 5 + 24 + len(PREFIX) + 1


@dataclass(frozen=True)
class HugeArchive:
    """The archive and where its two big records are."""

    path: Path
    names: list[str]  # the segment files, in order
    huge_lsn: int  # the 24 MB record starts here
    boundary_lsn: int  # the record that ends at a segment boundary starts here...
    boundary_end: int  # ...and ends here, a multiple of the segment size


def payload_between(start: int, end: int) -> int:
    """Record bytes that fit from ``start`` to ``end``: the distance minus the page headers of
    the pages that begin in between (long ones at segment starts)."""
    page = (start // XLOG_BLCKSZ + 1) * XLOG_BLCKSZ
    headers = sum(SIZE_OF_LONG_PHD if p % SEG == 0 else SIZE_OF_SHORT_PHD
                  for p in range(page, end, XLOG_BLCKSZ))
    return end - start - headers


def emit_to_segment_boundary(server: PgServer, segments: int) -> int:
    """A logical message that starts at the insert position and ends exactly where a segment
    ends, ``segments`` segments on; that end. Retried if another record slipped in between
    (the function returns where the record it wrote ends)."""
    for _ in range(3):
        start = lsn_int(server.sql("SELECT pg_current_wal_insert_lsn()"))
        end = (start // SEG + segments) * SEG
        size = payload_between(start, end) - MESSAGE_OVERHEAD
        got = lsn_int(server.sql(
            f"SELECT pg_logical_emit_message(false, '{PREFIX}', repeat('b', {size}))"))
        if got == end:
            return end
    pytest.fail(f"the message did not end at a segment boundary (ended at {format_lsn(got)})")


@pytest.fixture(scope="module")
def huge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HugeArchive]:
    """The archive of a 1 MiB-segment server that wrote the two big messages, then a little."""
    base = make_shared_dir("receivewal-huge-")
    server = PgServer(base, "huge")
    try:
        server.init({"autovacuum": "off"}, initdb_args=INITDB_ARGS)
        server.start()
        server.sql("CREATE TABLE around (x int)")
        server.sql("INSERT INTO around SELECT generate_series(1, 5000)")
        server.sql(f"SELECT pg_logical_emit_message(false, '{PREFIX}', repeat('a', {HUGE}))")
        boundary_end = emit_to_segment_boundary(server, 5)
        server.sql("INSERT INTO around SELECT generate_series(1, 5000)")
        server.switch_wal()  # the segment after the boundary is complete...
        server.sql("INSERT INTO around VALUES (0)")  # ...and the current one begins after it
        out = tmp_path_factory.mktemp("huge") / "archive"
        out.mkdir()
        names = copy_completed_segments(server, out)
        # Where the two messages start, as PostgreSQL's own pg_waldump reads them.
        huge_lsn, boundary_lsn = parse_record_lsns(
            waldump_output(out, names[0], names[-1], "-r", "LogicalMessage"))
        yield HugeArchive(out, names, huge_lsn, boundary_lsn, boundary_end)
    finally:
        server.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def scan_at(report_scans: tuple[SegmentScan, ...], lsn: int) -> SegmentScan:
    """The scan of the segment holding ``lsn``."""
    return next(s for s in report_scans if s.start_lsn <= lsn < s.start_lsn + SEG)


@pytest.mark.usefixtures("scanner_path")
def test_verify_accepts_records_spanning_many_segments(huge: HugeArchive) -> None:
    """A 24 MB record and one that ends at a segment boundary: recoverable end to end, both
    counted in the segment where they start, with their whole length: the statistics equal
    pg_waldump --stats on the same files."""
    report, _ = verify_archive(huge.path, jobs=1)
    assert report.recoverable, [p.describe() for p in report.problems]
    assert not report.problems
    assert rmgr_totals(report.scans) == parse_stats(
        waldump_output(huge.path, huge.names[0], huge.names[-1], "--stats"))
    messages, record_bytes, _ = rmgr_totals(report.scans)["LogicalMessage"]
    assert messages == 2
    assert record_bytes > HUGE + 4 * SEG
    start = scan_at(report.scans, huge.huge_lsn)
    assert start.last_record_lsn == huge.huge_lsn
    assert start.valid_end == start.start_lsn + SEG
    ending = scan_at(report.scans, huge.boundary_end - 1)
    assert ending.records == 0
    assert not ending.problems
    after = scan_at(report.scans, huge.boundary_end)
    assert after.first_record_prev == huge.boundary_lsn


@pytest.mark.usefixtures("scanner_path")
def test_verify_finishes_the_huge_record_from_compressed_files(huge: HugeArchive,
                                                               tmp_path: Path) -> None:
    """The same archive with its files in turn plain, .gz, .lz4 and .zst: the record runs
    through files of every format and is accepted, with the same statistics."""
    compressed_copy(huge.path, tmp_path / "mixed")
    report, _ = verify_archive(tmp_path / "mixed", jobs=1)
    assert report.recoverable, [p.describe() for p in report.problems]
    plain, _ = verify_archive(huge.path, jobs=1)
    assert rmgr_totals(report.scans) == rmgr_totals(plain.scans)


def cut_archive(huge: HugeArchive, into: Path, last: int, keep: int, suffix: str) -> str:
    """The archive's segments up to the huge record's segment + ``last``, that one as a
    ``.partial`` holding its first ``keep`` bytes (zero-padded when plain, as streaming
    leaves it; cut short when compressed, as ``-Z`` leaves it); the .partial's name."""
    into.mkdir()
    first = huge.huge_lsn // SEG
    for name in huge.names:
        segno = int(name[8:16], 16) * 4096 + int(name[16:24], 16)
        if segno < first + last:
            shutil.copy(huge.path / name, into / name)
        elif segno == first + last:
            data = (huge.path / name).read_bytes()[:keep]
            body = COMPRESSORS[suffix](data) if suffix else data + bytes(SEG - keep)
            (into / (name + suffix + ".partial")).write_bytes(body)
            return name + suffix + ".partial"
    raise AssertionError("the archive is shorter than asked")


@pytest.mark.usefixtures("scanner_path")
@pytest.mark.parametrize("suffix", ["", ".zst"])
def test_a_huge_record_still_being_streamed_ends_the_archive(huge: HugeArchive, tmp_path: Path,
                                                            suffix: str) -> None:
    """The archive as it stands while the 24 MB record streams: its newest segment, 10
    segments on, is a .partial that ends inside the record. Recoverable up to the record's
    start, the end of the archive; nothing is damaged."""
    cut_archive(huge, tmp_path / "cut", 10, 40 * XLOG_BLCKSZ, suffix)
    report, _ = verify_archive(tmp_path / "cut", jobs=1)
    assert report.recoverable, [p.describe() for p in report.problems]
    assert not report.problems
    assert report.recovery is not None
    assert report.recovery.end_lsn == huge.huge_lsn


@pytest.mark.usefixtures("scanner_path")
def test_a_segment_missing_inside_the_huge_record_is_named(huge: HugeArchive,
                                                           tmp_path: Path) -> None:
    """A segment the record runs through, 16 segments on, deleted: recovery stops at the
    record, saying that it continues into that missing segment."""
    damaged = tmp_path / "gap"
    shutil.copytree(huge.path, damaged)
    missing = wal_file_name(1, huge.huge_lsn // SEG + 16, SEG)
    (damaged / missing).unlink()
    report, _ = verify_archive(damaged, jobs=1)
    assert not report.recoverable
    assert report.recovery is not None
    assert report.recovery.end_lsn == huge.huge_lsn
    assert report.recovery.stop_reason == (f"the record at {format_lsn(huge.huge_lsn)} "
                                           f"continues into {missing}, which is missing")


def test_both_scanner_paths_scan_the_huge_archive_the_same(
        huge: HugeArchive, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled and the pure-Python scanner give equal scans of every segment."""
    native = nativescan.native or nativescan.load_native()
    if native is None:
        pytest.skip("the C extension receivewal.wal._scan is not built here")

    def scans_on(path: ModuleType | None) -> tuple[SegmentScan, ...]:
        monkeypatch.setattr(nativescan, "native", path)
        report, _ = verify_archive(huge.path, jobs=1, collect_lsns=True)
        return report.scans

    compiled = scans_on(native)
    assert compiled == scans_on(None)
    assert sum(s.records for s in compiled) > 10_000


@pytest.mark.usefixtures("scanner_path")
def test_a_changed_byte_inside_the_huge_record_is_a_crc_mismatch(
        huge: HugeArchive, tmp_path: Path) -> None:
    """One byte of the message's data, 12 MB into the record (a segment it fills), changed:
    the record's CRC no longer matches, and the archive is not recoverable."""
    damaged = tmp_path / "damaged"
    shutil.copytree(huge.path, damaged)
    page = (huge.huge_lsn + HUGE // 2) // XLOG_BLCKSZ * XLOG_BLCKSZ
    segno, offset = divmod(page + 100, SEG)
    name = wal_file_name(1, segno, SEG)
    with (damaged / name).open("r+b") as fh:
        fh.seek(offset)
        old = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([old[0] ^ 0x01]))
    report, _ = verify_archive(damaged, jobs=1)
    assert not report.recoverable
    crc = [p for p in report.problems if p.kind == "crc_mismatch"]
    assert [p.lsn for p in crc] == [huge.huge_lsn], [p.describe() for p in report.problems]
    assert report.recovery is not None
    assert report.recovery.end_lsn == huge.huge_lsn


def verify_peak_rss_kb(archive: Path) -> int:
    """The peak RSS of a fresh process that verifies ``archive`` (which must be recoverable)."""
    code = ("import sys\nfrom pathlib import Path\n"
            "from receivewal.check.verify import verify_archive\n"
            "report, _ = verify_archive(Path(sys.argv[1]), jobs=1)\n"
            f"print(int(report.recoverable), {PEAK_RSS_KB})\n")
    done = subprocess.run([sys.executable, "-c", code, str(archive)], capture_output=True,
                          text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    recoverable, rss = map(int, done.stdout.split())
    assert recoverable == 1
    return rss


@pytest.mark.usefixtures("scanner_path")
def test_verify_memory_is_bounded_by_segments_not_by_the_record(huge: HugeArchive,
                                                                tmp_path: Path) -> None:
    """verify of the archive with the 24 MB record peaks less than half the record's size
    above verify of the segments after the big records (the same process, imports and
    scanner): a verify that held the record whole would take all of it more."""
    after = tmp_path / "after"
    after.mkdir()
    for name in huge.names:
        if int(name[8:16], 16) * 4096 + int(name[16:24], 16) >= huge.boundary_end // SEG:
            shutil.copy(huge.path / name, after / name)
    assert any(after.iterdir())
    small, rss = verify_peak_rss_kb(after), verify_peak_rss_kb(huge.path)
    assert rss - small < HUGE // 1024 // 2, \
        f"peak RSS {rss} kB for a {HUGE}-byte record, {small} kB without it"


@pytest.mark.spark
def test_analyze_tables_accept_the_huge_records(spark: Any, huge: HugeArchive,
                                                tmp_path: Path) -> None:
    """analyze says recoverable, and its segment_rmgr table counts both big records with the
    bytes verify counts."""
    from receivewal.check.analyze import run_analyze  # noqa: PLC0415 - the spark extra

    result = run_analyze(spark, [str(huge.path)], tmp_path / "analysis", report=False)
    archives = spark.read.parquet(result.tables["archives"]).collect()
    assert [(r["archive"], r["recoverable"]) for r in archives] == [(str(huge.path), True)]
    problems = spark.read.parquet(result.tables["problems"]).collect()
    assert problems == []
    rmgr = spark.read.parquet(result.tables["segment_rmgr"])
    rows = rmgr.where(rmgr.rmgr == "LogicalMessage").collect()
    report, _ = verify_archive(huge.path, jobs=1)
    assert (sum(r["records"] for r in rows), sum(r["record_bytes"] for r in rows),
            0) == rmgr_totals(report.scans)["LogicalMessage"]
