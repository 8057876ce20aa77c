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
from test_verify_truth import SEG, write_pair

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
