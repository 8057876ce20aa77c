"""Every reader of archive content survives any content: the state file (``status``), history
files, segment and history file names, and segment files for verify (oversize files and
decompression bombs). Each malformed input gives the project's error in one line naming the
file, or the documented exit code, never a traceback or unbounded memory."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.archives import SEGMENT, zstd_bomb
from support.memory import PEAK_RSS_KB

from receivewal.archive.compression import CompressSpec, new_compressor, read_wal_file
from receivewal.check.verify import verify_archive
from receivewal.daemon.state import STATE_FILE, decode_state
from receivewal.errors import ArchiveError
from receivewal.wal.names import (
    AtRest,
    at_rest_of,
    parse_history_file_name,
    parse_segment_file_name,
)
from receivewal.wal.timeline import parse_history

NAME = "000000010000000000000003"


def good_state() -> dict[str, object]:
    return {"version": 1, "pid": os.getpid(), "hostname": "elsewhere",
            "started_at": "2026-01-01T00:00:00+00:00", "updated_at": "2026-01-01T00:00:00+00:00",
            "phase": "streaming"}


def with_changes(**changes: object) -> str:
    return json.dumps({**good_state(), **changes})


def run_status(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "receivewal", "status", "-D", str(directory)],
                          capture_output=True, text=True, check=False, timeout=60)


# -- the state file, through `receivewal status` ---------------------------------------------
@pytest.mark.parametrize("content", [
    "[" * 100_000 + "]" * 100_000,
    '{"a":' * 100_000 + "1" + "}" * 100_000,
    with_changes(pid=2**70),
    with_changes(pid=-1),
    with_changes(pid=True),
    with_changes(pid="12"),
    with_changes(started_at=None),
    with_changes(updated_at=12),
    with_changes(wal_bytes=10**400),
    with_changes(timeline="1"),
    with_changes(last_error="boom"),
    with_changes(last_error={"kind": "X", "message": "m", "at": 5}),
    with_changes(flushed_lsn=5),
    with_changes(hostname=None),
    with_changes(reconnects=1.5),
    "",
    "null",
    b"\xff\xfe garbage",
], ids=["nested-list", "nested-object", "pid-2^70", "pid-negative", "pid-bool", "pid-string",
        "started-null", "updated-number", "huge-counter", "timeline-string", "error-string",
        "error-at-number", "lsn-number", "hostname-null", "float-counter", "empty", "null",
        "binary"])
def test_malformed_state_file_is_unknown_in_one_line(tmp_path: Path,
                                                     content: str | bytes) -> None:
    """Whatever the state file holds, status exits 3 (UNKNOWN) with one line naming it."""
    data = content if isinstance(content, bytes) else content.encode()
    (tmp_path / STATE_FILE).write_bytes(data)
    done = run_status(tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 3, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    assert lines[0].startswith("RECEIVEWAL UNKNOWN - cannot read state:"), lines[0]
    assert STATE_FILE in lines[0]


@given(st.binary(max_size=300))
def test_decode_state_raises_only_archive_error(data: bytes) -> None:
    with contextlib.suppress(ArchiveError):
        decode_state(data)


def test_summary_stays_one_line(tmp_path: Path) -> None:
    """An error message with newlines in the state file does not break the summary line."""
    (tmp_path / STATE_FILE).write_text(with_changes(
        phase="stopped", last_error={"kind": "X", "message": "a\nb\r\nc",
                                     "at": "2026-01-01T00:00:00+00:00"}))
    done = run_status(tmp_path)
    assert done.returncode == 2
    assert done.stdout.splitlines()[0].endswith("last error X: a b c")


# -- history files ----------------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    "0_1\t0/10\tx\n", "\u0661\t0/10\tx\n", "-1\t0/10\tx\n", "0\t0/10\tx\n",
    "1\t0/10\n1\t0/20\n", "1\n", "1\tnot-an-lsn\n", "9" * 5000 + "\t0/10\n",
    "99999999999\t0/10\n", "1\t0/10\x00\n",
], ids=["underscore", "arabic-digit", "negative", "zero", "not-increasing", "no-lsn", "bad-lsn",
        "huge", "over-32-bits", "nul"])
def test_history_garbage_is_an_archive_error(text: str) -> None:
    with pytest.raises(ArchiveError, match="history file of timeline 3"):
        parse_history(text, 3)


@given(st.text(max_size=200))
def test_history_parser_raises_only_archive_error(text: str) -> None:
    try:
        entries = parse_history(text, 0x10)
    except ArchiveError:
        return
    assert all(1 <= e.timeline < 0x10 for e in entries)


# -- file names ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [
    NAME + "\n", NAME + ".partial\n", "00000000" + NAME[8:], "0000000a" + NAME[8:], NAME + ".gz.gz",
    NAME + ".bz2", "\u0661" * 24, NAME[:23],
])
def test_not_segment_names(name: str) -> None:
    assert parse_segment_file_name(name, SEGMENT) is None


def test_not_history_names() -> None:
    for name in ("00000002.history\n", "0000002.history", "00000002.HISTORY", "0000000G.history"):
        assert parse_history_file_name(name) is None


@given(st.text(max_size=60))
def test_name_parsers_never_raise(name: str) -> None:
    parse_segment_file_name(name, SEGMENT)
    parse_history_file_name(name)


# -- segment files for verify: bounded by the segment size ---------------------------------------


@pytest.mark.parametrize("suffix", ["", ".zst"])
def test_oversize_file_is_reported_by_verify(tmp_path: Path, suffix: str) -> None:
    """A file holding more than a segment (plain, or a .zst bomb) is a problem naming it."""
    name = NAME + suffix
    if suffix:
        zstd_bomb(tmp_path / name, 64 << 20)
    else:
        with (tmp_path / name).open("wb") as fh:
            fh.truncate(SEGMENT + 8192)
    with pytest.raises(ArchiveError, match=f"{name}.*more than {SEGMENT} bytes"):
        read_wal_file(str(tmp_path / name), "zstd" if suffix else "", cap=SEGMENT)
    report, _ = verify_archive(tmp_path, jobs=1, segment_size=SEGMENT)
    assert not report.recoverable
    found = [p for p in report.problems if p.file == name and "more than" in p.detail]
    assert found, report.problems


def test_verify_reads_a_4gib_bomb_in_bounded_memory(tmp_path: Path) -> None:
    """An 4 GiB zstd bomb costs verify no more than a segment's worth of memory."""
    zstd_bomb(tmp_path / (NAME + ".zst"), 4 << 30)
    code = ("import sys\nfrom pathlib import Path\n"
            "from receivewal.check.verify import verify_archive\n"
            f"report, _ = verify_archive(Path(sys.argv[1]), jobs=1, segment_size={SEGMENT})\n"
            f"print(len(report.problems), {PEAK_RSS_KB})\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                          text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    problems, rss = map(int, done.stdout.split())
    assert problems >= 1
    assert rss < 250_000, f"peak RSS {rss} kB"


# -- the one table of at-rest formats ------------------------------------------------------------
@pytest.mark.parametrize("fmt", list(AtRest))
def test_each_format_is_named_written_and_read_through_the_table(tmp_path: Path,
                                                                  fmt: AtRest) -> None:
    """A file named with a format's suffix is parsed as that format, and what its writer
    wrote its reader reads back, for every format the table lists."""
    data = os.urandom(100_000)
    for partial in (False, True):
        name = NAME + fmt.suffix + (".partial" if partial else "")
        parsed = parse_segment_file_name(name, SEGMENT)
        assert parsed is not None
        assert parsed.compression == fmt
        assert at_rest_of(name) == fmt
        body = data
        if fmt:
            compressor = new_compressor(CompressSpec(fmt.value))
            body = compressor.begin() + compressor.compress(data) + compressor.finish()
        (tmp_path / name).write_bytes(body)
        assert read_wal_file(str(tmp_path / name), fmt, cap=SEGMENT) == data
