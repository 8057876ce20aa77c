"""``receivewal verify`` as a well-behaved Unix tool (issue 25 item 13 and "left open"): its exit
status is its verdict (0 recoverable, 1 NOT recoverable) and nothing else is read as one: a
usage error (an empty archive name included) and a report that cannot be written are 2, with
one line on stderr; a reader that leaves early (``verify DIR | head -1``) ends the output
quietly with the verdict's status; nothing in the archive directory that bears a WAL file's
name is passed over without a word.

Both entries are run: the lean path (``python -m receivewal``) and the click command.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.streams import receivewal_here
from test_verify_truth import NAMES, write_pair

from receivewal.check.verify import verify_archive

CLICK_PATH = ("import sys\n"
              "from receivewal.commands.group import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
PATHS = {"lean": ["-m", "receivewal"], "click": ["-c", CLICK_PATH]}
TIMEOUT = 120


def verify(path: str, *args: str, cwd: Path | None = None, stdout: int | None = None,
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *PATHS[path], "verify", *args], cwd=cwd, text=True,
                          stdout=subprocess.PIPE if stdout is None else stdout,
                          stderr=subprocess.PIPE, check=False, timeout=TIMEOUT)


def verify_here(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    """:func:`verify` in this process (support.streams.receivewal_here), through the same
    entry: for the cases refused before any work; test_a_usage_error_from_a_process_of_its_own
    runs one of them as a process, on each entry."""
    from receivewal.commands.group import main as click_main  # noqa: PLC0415

    return receivewal_here("verify", *args, main=None if path == "lean" else click_main)


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pair(tmp_path_factory.mktemp("exits") / "good")


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = write_pair(tmp_path_factory.mktemp("exits") / "damaged")
    data = bytearray((directory / NAMES[1]).read_bytes())
    data[300_000] ^= 0x40  # inside a record: a CRC mismatch
    (directory / NAMES[1]).write_bytes(bytes(data))
    return directory


USAGE = [[], ["--no-such-option", "DIR"], ["-j", "0", "DIR"], ["DIR", "DIR"], ["-j"],
         ["--start", "not-an-lsn", "DIR"], [""], ["--json", ""]]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("args", USAGE, ids=lambda a: " ".join(repr(x) for x in a) or "none")
def test_a_usage_error_is_status_2_never_the_not_recoverable_verdict(
        good: Path, path: str, args: list[str]) -> None:
    """A bad command line exits 2 with one ``receivewal: error:`` line, nothing on stdout."""
    done = verify_here(path, *[str(good) if a == "DIR" else a for a in args])
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("receivewal: error: "), done.stderr


@pytest.mark.parametrize("path", PATHS)
def test_a_usage_error_from_a_process_of_its_own(good: Path, path: str) -> None:
    """One usage error as the operator meets it, on each entry: status 2, one line, nothing on
    stdout (no traceback)."""
    done = verify(path, "-j", "0", str(good))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("receivewal: error: "), done.stderr


@pytest.mark.parametrize("path", PATHS)
def test_an_empty_archive_name_is_not_the_current_directory(good: Path, path: str) -> None:
    """``verify ''`` run inside an archive: a usage error naming the empty name, never a
    report on the current directory."""
    done = verify(path, "", cwd=good)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "empty" in done.stderr, done.stderr
    assert "Invalid value for 'DIR-OR-S3-URL'" in done.stderr, done.stderr


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("options", [[], ["--json"]], ids=["text", "json"])
def test_a_report_that_cannot_be_written_is_one_line_and_status_2(
        good: Path, path: str, options: list[str]) -> None:
    """``verify DIR > /dev/full``: the report cannot be written (ENOSPC); one line on stderr
    naming standard output and why, status 2, no traceback."""
    with open("/dev/full", "w") as full:
        done = verify(path, *options, str(good), stdout=full.fileno())
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("receivewal: error: could not write to standard output: "
                           "No space left on device\n")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("archive", "status"), [("good", 0), ("damaged", 1)])
def test_a_reader_that_left_ends_the_output_quietly_with_the_verdict(
        good: Path, damaged: Path, path: str, archive: str, status: int) -> None:
    """``verify DIR | head -1`` where the reader has gone before verify writes (a pipe whose
    read end is closed: EPIPE): nothing on stderr, and the exit status is still the verdict
    (0 recoverable, 1 not), not a failure."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = verify(path, "--json", str(good if archive == "good" else damaged),
                      stdout=write_end)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (status, "")


def test_the_shell_pipeline_into_head(good: Path) -> None:
    """With pipefail, ``verify DIR | head -n 0`` (head leaves without reading) is 0 for a
    recoverable archive, and ``| head -n 1`` prints the report's first line."""
    command = f"{sys.executable} -m receivewal verify {good}"
    for lines, out in ((0, ""), (1, f"archive {good}: 2 segments of 1 MiB")):
        done = subprocess.run(["bash", "-c", f"set -o pipefail; {command} | head -n {lines}"],
                              capture_output=True, text=True, check=False, timeout=TIMEOUT)
        assert (done.returncode, done.stderr) == (0, "")
        assert done.stdout.startswith(out)


NEXT = f"{NAMES[1][:16]}{int(NAMES[1][16:], 16) + 1:08X}"


@pytest.mark.parametrize("name", [NEXT, f"{NEXT}.zst.partial", "00000002.history"])
def test_a_directory_named_like_a_wal_file_is_reported(good: Path, tmp_path: Path,
                                                       name: str) -> None:
    """A directory where a segment, a .partial or a history file would be is an unreadable
    file named in the report, and the archive is NOT recoverable, never passed over."""
    directory = write_pair(tmp_path / "a")
    (directory / name).mkdir()
    report, _ = verify_archive(directory, jobs=1)
    found = [(p.kind, p.file) for p in report.problems if p.severity == "error"]
    assert found == [("unreadable", name)], report.problems
    assert f'"{directory / name}" is a directory' in report.problems[0].detail
    assert not report.recoverable
    done = verify("lean", str(directory))
    assert done.returncode == 1
    assert f"error: {name} at " in done.stdout, done.stdout
