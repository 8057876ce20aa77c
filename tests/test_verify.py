"""``receivewal verify`` on archives made by real PostgreSQL 15 servers, intact and damaged.

One module-scoped archive: timeline 1 on a primary, a standby promoted to timeline 2, the old
timeline's last segment as ``.partial``, the newest segment as ``.partial``, 1 MiB segments.
Statistics are compared with ``pg_waldump --stats`` and ``pg_waldump``'s record list on the
same segments; each kind of damage must be reported with its file and LSN, and make verify
exit non-zero.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.scanner import scanner_path  # noqa: F401 - the fixture, used below
from support.servers import make_shared_dir
from support.sparkarchives import (
    SEGMENT_SIZE,
    BuiltArchive,
    build_single_archive,
    build_two_timeline_archive,
    compressed_copy,
    lsn_int,
)
from support.waldump import by_rmgr, parse_record_lsns, parse_stats, waldump_output

from receivewal.check.verify import record_type_totals, rmgr_totals, verify_archive
from receivewal.commands.cli import cli, main
from receivewal.wal.names import parse_segment_file_name
from receivewal.wal.reader import WalProblem

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltArchive]:
    """The two-timeline archive, built once for the module."""
    base = make_shared_dir("receivewal-verify-")
    try:
        yield build_two_timeline_archive(base, tmp_path_factory.mktemp("archive"))
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def foreign_segments(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Completed segments of another server (another system identifier)."""
    base = make_shared_dir("receivewal-foreign-")
    out = tmp_path_factory.mktemp("foreign")
    try:
        build_single_archive(base, "other", out)
        yield out
    finally:
        shutil.rmtree(base, ignore_errors=True)


def copy_archive(built: BuiltArchive, tmp_path: Path) -> Path:
    """A private copy of the plain archive that a test may damage."""
    dst = tmp_path / "copy"
    shutil.copytree(built.plain, dst)
    return dst


def subset(built: BuiltArchive, names: list[str], dst: Path) -> Path:
    """A directory holding only ``names`` from the archive."""
    dst.mkdir()
    for name in names:
        shutil.copy(built.plain / name, dst / name)
    return dst


def run_verify(directory: Path, *args: str) -> tuple[int, dict[str, object]]:
    """Run ``receivewal verify --json`` and return its exit code and report."""
    result = CliRunner().invoke(cli, ["verify", "--json", "-j", "2", *args, str(directory)])
    return result.exit_code, json.loads(result.stdout)


def problems_of(report: dict[str, object], kind: str) -> list[dict[str, str]]:
    """The problems of one kind in a JSON report."""
    problems = report["problems"]
    assert isinstance(problems, list)
    return [p for p in problems if p["kind"] == kind]


def seg_start(name: str) -> int:
    """The LSN where a segment file named ``name`` begins."""
    seg = parse_segment_file_name(name, SEGMENT_SIZE)
    assert seg is not None
    return seg.start_lsn(SEGMENT_SIZE)


def fmt(lsn: int) -> str:
    """An LSN as PostgreSQL prints it."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


# -- intact archives ---------------------------------------------------------------------------
@pytest.mark.usefixtures("scanner_path")
@pytest.mark.parametrize("timeline", [1, 2])
def test_rmgr_statistics_equal_pg_waldump_stats(built: BuiltArchive, tmp_path: Path,
                                                timeline: int) -> None:
    """Per resource manager records, record bytes and FPI bytes equal pg_waldump --stats;
    per record type they equal --stats=record."""
    names = built.tl1 if timeline == 1 else built.tl2
    history = [] if timeline == 1 else ["00000002.history"]
    directory = subset(built, names + history, tmp_path / "tl")
    report, _ = verify_archive(directory, jobs=2)
    expected = parse_stats(waldump_output(directory, names[0], names[-1], "--stats",
                                          "-t", str(timeline)))
    assert len(names) >= 3
    assert rmgr_totals(report.scans) == expected
    assert not [p for p in report.problems if p.severity == "error"]
    per_record = by_rmgr(parse_stats(waldump_output(directory, names[0], names[-1],
                                                    "--stats=record", "-t", str(timeline))))
    ours: dict[str, list[tuple[int, int, int]]] = {}
    for (name, _rtype), row in record_type_totals(report.scans).items():
        ours.setdefault(name, []).append(row)
    assert {k: sorted(v) for k, v in sorted(ours.items())} == per_record


@pytest.mark.usefixtures("scanner_path")
def test_every_record_pg_waldump_lists_is_verified(built: BuiltArchive, tmp_path: Path) -> None:
    """The LSN of every record pg_waldump lists is a record the parser checked, and no more."""
    directory = subset(built, built.tl1, tmp_path / "tl1")
    listed = parse_record_lsns(waldump_output(directory, built.tl1[0], built.tl1[-1]))
    _, results = verify_archive(directory, jobs=1, collect_lsns=True)
    checked = sorted(lsn for r in results if r.scan for lsn in r.scan.record_lsns)
    assert len(listed) > 1000
    assert checked == listed


@pytest.mark.usefixtures("scanner_path")
def test_whole_archive_is_recoverable_across_the_promotion(built: BuiltArchive) -> None:
    """Both timelines, the history file and the .partial files: exit 0, recovery to the end."""
    code, report = run_verify(built.plain)
    assert code == 0, report["problems"]
    assert report["recoverable"] is True
    recovery = report["recovery"]
    assert isinstance(recovery, dict)
    assert recovery["timeline"] == 2
    assert recovery["complete"] is True
    assert lsn_int(recovery["end_lsn"]) > lsn_int(built.switchpoint)


@pytest.mark.usefixtures("scanner_path")
def test_compressed_archive_gives_the_same_statistics(built: BuiltArchive, tmp_path: Path) -> None:
    """Plain, .gz, .lz4 and .zst segments (and compressed .partial) read the same."""
    renamed = compressed_copy(built.plain, tmp_path / "packed")
    assert {n.rsplit(".partial")[0].rsplit(".", 1)[-1] for n in renamed.values()} >= {
        "gz", "lz4", "zst"}
    plain, _ = verify_archive(built.plain, jobs=2)
    packed, _ = verify_archive(tmp_path / "packed", jobs=2)
    assert packed.recoverable
    assert rmgr_totals(packed.scans) == rmgr_totals(plain.scans)
    assert packed.recovery == plain.recovery


def test_human_output_names_the_verdict(built: BuiltArchive) -> None:
    """Without --json verify prints the recovery range and the verdict."""
    result = CliRunner().invoke(cli, ["verify", "--compressibility", str(built.plain)])
    assert result.exit_code == 0
    assert "verdict: recoverable end to end" in result.stdout
    assert "recovery on timeline 2" in result.stdout
    assert "compressibility: zstd-1" in result.stdout


def test_recovery_from_a_later_start_lsn(built: BuiltArchive, tmp_path: Path) -> None:
    """With --start after a missing early segment, recovery still reaches the end."""
    directory = copy_archive(built, tmp_path)
    (directory / built.tl1[0]).unlink()  # before the start: not needed
    start = fmt(lsn_int(built.switchpoint) - 1)
    report, _ = verify_archive(directory, jobs=2, start_lsn=lsn_int(start))
    assert report.recovery is not None
    assert report.recovery.complete


# -- damage ------------------------------------------------------------------------------------
def flip(path: Path, offset: int, mask: int = 0x01) -> None:
    """Flip bits of one byte of a file."""
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def assert_fails_with(directory: Path, kind: str, file: str, lsn: int | None = None) -> None:
    """verify exits non-zero and reports a problem of ``kind`` in ``file`` (at ``lsn``)."""
    code, report = run_verify(directory)
    assert code != 0
    hits = [p for p in problems_of(report, kind) if p["file"] == file]
    assert hits, report["problems"]
    if lsn is not None:
        assert fmt(lsn) in {p["lsn"] for p in hits}, hits
    assert rc_of_main(directory) == 1


def rc_of_main(directory: Path) -> int:
    """The exit code of the console script's main()."""
    return main(["verify", "-j", "1", str(directory)])


def scan_of(directory: Path, name: str) -> tuple[int, ...]:
    """The record LSNs the parser finds in one segment of an intact archive."""
    _, results = verify_archive(directory, jobs=1, collect_lsns=True)
    return next(r.scan.record_lsns for r in results if r.scan and r.scan.file == name)


@pytest.mark.usefixtures("scanner_path")
def test_flipped_bit_in_a_record_is_a_crc_mismatch(built: BuiltArchive, tmp_path: Path) -> None:
    """One bit flipped inside a record's data: crc_mismatch at that record's LSN."""
    directory = copy_archive(built, tmp_path)
    name = built.tl1[1]
    lsns = scan_of(directory, name)
    start = seg_start(name)
    lsn = next(a for a, b in zip(lsns[len(lsns) // 2:], lsns[len(lsns) // 2 + 1:], strict=False)
               if b - a > 64 and (a % 8192) < 8000)
    flip(directory / name, lsn - start + 40)
    assert_fails_with(directory, "crc_mismatch", name, lsn)


def test_damaged_page_header_is_reported(built: BuiltArchive, tmp_path: Path) -> None:
    """A bit flipped in a page's xlp_pageaddr: bad_page_header at that page."""
    directory = copy_archive(built, tmp_path)
    name = built.tl1[1]
    flip(directory / name, 3 * 8192 + 9)
    page_lsn = seg_start(name) + 3 * 8192
    assert_fails_with(directory, "bad_page_header", name, page_lsn)


def test_zeroed_tail_of_a_complete_segment(built: BuiltArchive, tmp_path: Path) -> None:
    """The second half of a complete segment zeroed: zeroed_tail where the zeros begin."""
    directory = copy_archive(built, tmp_path)
    _, results = verify_archive(directory, jobs=2)
    name = next(r.scan.file for r in results
                if r.scan and not r.scan.switched and not r.scan.partial)
    data = bytearray((directory / name).read_bytes())
    data[SEGMENT_SIZE // 2:] = bytes(SEGMENT_SIZE // 2)
    (directory / name).write_bytes(bytes(data))
    zero_lsn = seg_start(name) + SEGMENT_SIZE // 2
    assert_fails_with(directory, "zeroed_tail", name, zero_lsn)


@pytest.mark.usefixtures("scanner_path")
def test_damage_in_a_record_that_crosses_segments(built: BuiltArchive, tmp_path: Path) -> None:
    """A byte of a record's tail in the next segment damaged: reported on the record's own
    segment, at the record's LSN, though its start lies in an intact file."""
    directory = copy_archive(built, tmp_path)
    _, results = verify_archive(directory, jobs=2)
    scans = {r.scan.file: r.scan for r in results if r.scan}
    name, nxt = next((a, b) for a, b in zip(built.tl1, built.tl1[1:], strict=False)
                     if (scans[b].first_record_lsn or 0) % SEGMENT_SIZE > 48)
    last = scans[name].last_record_lsn
    assert last is not None
    flip(directory / nxt, 40 + 4)
    assert_fails_with(directory, "crc_mismatch", name, last)


def test_missing_segment(built: BuiltArchive, tmp_path: Path) -> None:
    """A segment in the middle of timeline 1 removed: missing_segment with its name and LSN."""
    directory = copy_archive(built, tmp_path)
    name = built.tl1[len(built.tl1) // 2]
    (directory / name).unlink()
    assert_fails_with(directory, "missing_segment", name, seg_start(name))
    _, report = run_verify(directory)
    recovery = report["recovery"]
    assert isinstance(recovery, dict)
    assert name in recovery["stop_reason"]
    assert lsn_int(recovery["end_lsn"]) <= seg_start(name)


def test_missing_history_file(built: BuiltArchive, tmp_path: Path) -> None:
    """00000002.history removed: missing_history at the first timeline 2 segment."""
    directory = copy_archive(built, tmp_path)
    (directory / "00000002.history").unlink()
    first = seg_start(built.tl2[0])
    assert_fails_with(directory, "missing_history", "00000002.history", first)


def test_history_file_disagreeing_with_segments(built: BuiltArchive, tmp_path: Path) -> None:
    """A history file whose switch point lies after timeline 2's first pages: mismatch."""
    directory = copy_archive(built, tmp_path)
    late = lsn_int(built.switchpoint) + 3 * SEGMENT_SIZE
    (directory / "00000002.history").write_text(f"1\t{fmt(late)}\tno recovery target\n")
    code, report = run_verify(directory)
    assert code != 0
    assert problems_of(report, "history_mismatch")


def test_foreign_segment(built: BuiltArchive, foreign_segments: Path, tmp_path: Path) -> None:
    """A segment of another server under a name the archive uses: foreign_segment."""
    directory = copy_archive(built, tmp_path)
    other = sorted(p.name for p in foreign_segments.iterdir())
    name = next(n for n in other if n in built.tl1)
    shutil.copy(foreign_segments / name, directory / name)
    assert_fails_with(directory, "foreign_segment", name, seg_start(name))


def test_partial_where_a_complete_segment_should_be(built: BuiltArchive, tmp_path: Path) -> None:
    """A completed timeline 1 segment present only as .partial: partial_segment."""
    directory = copy_archive(built, tmp_path)
    name = built.tl1[1]
    (directory / name).rename(directory / f"{name}.partial")
    assert_fails_with(directory, "partial_segment", f"{name}.partial")


def test_problem_text_names_file_and_lsn() -> None:
    """A problem line carries the severity, the file, the LSN, the kind and the detail."""
    problem = WalProblem("crc_mismatch", "000000010000000000000003", 0x3000028, "bad")
    assert problem.describe() == "error: 000000010000000000000003 at 0/3000028: crc_mismatch: bad"
