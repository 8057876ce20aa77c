"""verify's verdict and problem list say what was checked and where the damage is (issue 18
items 9 and 14): a start the archive does not hold is not "recoverable", damage in a segment
is blamed on that segment, and a list cut short says how much is left out.

Uses the committed 1 MiB segment pair in ``tests/data/wal`` on both scanner paths.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from support.scanner import scanner_path  # noqa: F401 - the fixture, used below
from test_verify_truth import NAMES, SEG, write_pair

from receivewal.check.verify import verify_archive
from receivewal.commands.cli import cli
from receivewal.wal.lsn import format_lsn
from receivewal.wal.names import parse_segment_file_name

pytestmark = pytest.mark.usefixtures("scanner_path")


def start_of(name: str) -> int:
    """The LSN where segment ``name`` begins."""
    seg = parse_segment_file_name(name, SEG)
    assert seg is not None
    return seg.start_lsn(SEG)


# -- item 9: a start outside the archive verifies nothing ---------------------------------------
@pytest.mark.parametrize("past", [0, 1, SEG, 100 * SEG])
def test_start_at_or_past_the_archive_end_is_not_recoverable(tmp_path: Path, past: int) -> None:
    """``verify --start`` at the archive's last valid byte or beyond: the report says the start
    is not in the archive, exit 1, never "recoverable"."""
    directory = write_pair(tmp_path / "a")
    report, _ = verify_archive(directory, jobs=1)
    assert report.recoverable
    assert report.recovery is not None
    start = report.recovery.archive_end_lsn + past
    result = CliRunner().invoke(cli, ["verify", "-j", "1", "--start", format_lsn(start),
                                      str(directory)])
    assert result.exit_code == 1, result.stdout
    assert "verdict: NOT recoverable end to end" in result.stdout
    assert f"start_not_in_archive: the start {format_lsn(start)} is not in the archive" \
        in result.stdout, result.stdout


# -- item 14: the damaged segment is the one named; a long list says what it leaves out ---------
def damage(directory: Path, name: str, *offsets: int) -> None:
    """Flip the lowest bit of the bytes at ``offsets`` of segment ``name``."""
    path = directory / name
    data = bytearray(path.read_bytes())
    for offset in offsets:
        data[offset] ^= 1
    path.write_bytes(bytes(data))


def test_damaged_first_page_of_the_next_segment_is_blamed_on_it(tmp_path: Path) -> None:
    """The first page header of the second segment is damaged, where the first segment's last
    record continues: every error names the second segment, not the intact first one, and the
    reason recovery stops names it too."""
    good, bad = NAMES
    directory = write_pair(tmp_path / "a")
    damage(directory, bad, 0)  # the magic number
    report, _ = verify_archive(directory, jobs=1)
    errors = [p for p in report.problems if p.severity == "error"]
    assert errors
    assert {p.file for p in errors} == {bad}, [p.describe() for p in errors]
    continuation = next(p for p in errors if p.kind == "bad_record")
    assert continuation.lsn == start_of(bad)
    assert good in continuation.detail  # where the record starts
    assert report.recovery is not None
    assert bad in report.recovery.stop_reason


def test_checksum_of_a_record_crossing_into_a_damaged_segment_names_it(tmp_path: Path) -> None:
    """A byte of the first segment's last record is damaged in its tail, which lies in the
    second segment: the crc_mismatch names the second segment as well as the first."""
    good, bad = NAMES
    directory = write_pair(tmp_path / "a")
    damage(directory, bad, 100)  # inside the continuation, after the 40-byte long header
    report, _ = verify_archive(directory, jobs=1)
    (crc,) = [p for p in report.problems if p.kind == "crc_mismatch"]
    assert crc.file == good
    assert bad in crc.detail


def test_problems_past_the_listed_ones_are_counted(tmp_path: Path) -> None:
    """80 damaged page headers in one segment (81 problems): the report lists 50 and says
    "... and 31 more problems", in the text and in the JSON."""
    directory = write_pair(tmp_path / "a")
    damage(directory, NAMES[1], *(page * 8192 + 9 for page in range(1, 81)))
    text = CliRunner().invoke(cli, ["verify", "-j", "1", str(directory)])
    assert text.exit_code == 1
    lines = text.stdout.splitlines()
    assert sum(NAMES[1] in line and "bad_page_header" in line for line in lines) == 50
    assert "  ... and 31 more problems" in lines, text.stdout
    assert lines[-1] == "verdict: NOT recoverable end to end"
    as_json = CliRunner().invoke(cli, ["verify", "--json", "-j", "1", str(directory)])
    assert '"problems_not_listed": 31' in as_json.stdout
