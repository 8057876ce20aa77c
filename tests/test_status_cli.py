"""``receivewal status`` as other command line tools behave (issue 18, item 11): a time in the
state file that is valid ISO 8601 but cannot be printed (past year 9999 in UTC) is an UNKNOWN
problem naming the file, never a traceback; and when whoever reads its output leaves early
(``status | head -1``), status stops writing quietly and keeps its verdict's exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from receivewal.daemon.state import STATE_FILE

TIMEOUT = 60
UNKNOWN = 3


def one_line(text: str) -> str:
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "receivewal", *args], capture_output=True,
                          text=True, check=False, timeout=TIMEOUT)


def _state(**changes: object) -> str:
    return json.dumps({"version": 1, "pid": os.getpid(), "hostname": "elsewhere",
                       "started_at": "2026-01-01T00:00:00+00:00",
                       "updated_at": "2026-01-01T00:00:00+00:00", "phase": "stopped",
                       **changes})


@pytest.mark.parametrize("field", ["updated_at", "started_at", "last_contact", "last_error"])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_state_time_past_year_9999_is_unknown_in_one_line(tmp_path: Path, field: str,
                                                          as_json: bool) -> None:
    """A time that is valid ISO 8601 but lies past year 9999 in UTC is an UNKNOWN problem
    naming the state file, never a traceback."""
    late = "9999-12-31T23:59:59-12:00"
    value: object = {"kind": "X", "message": "m", "at": late} if field == "last_error" else late
    (tmp_path / STATE_FILE).write_text(_state(**{field: value}))
    done = run("status", "-D", str(tmp_path), *(["--json"] if as_json else []))
    assert done.returncode == UNKNOWN, done.stdout + done.stderr
    assert done.stderr == "", done.stderr
    summary = json.loads(done.stdout)["summary"] if as_json else one_line(done.stdout)
    assert summary.startswith("RECEIVEWAL UNKNOWN - cannot read state:"), summary
    assert STATE_FILE in summary
    assert "out of range" in summary


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_status_into_a_closed_pipe_keeps_its_exit_code(tmp_path: Path, as_json: bool) -> None:
    """``status | head -1``: the reader has gone before status writes (a pipe whose read end
    is closed): status stops writing quietly and still exits with its verdict (2 here, for a
    stopped daemon), not 1, and prints no traceback."""
    (tmp_path / STATE_FILE).write_text(_state())
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "receivewal", "status", "-D", str(tmp_path),
             *(["--json"] if as_json else [])],
            stdout=write_end, stderr=subprocess.PIPE, text=True, check=False, timeout=TIMEOUT)
    finally:
        os.close(write_end)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ""


def test_status_piped_into_head_reports_the_verdict(tmp_path: Path) -> None:
    """The shell pipeline itself: with pipefail, ``status | head -n 0`` (head leaves without
    reading, long before the Python interpreter has started) exits with status's verdict
    (2), with nothing on stderr; ``status | head -n 1`` prints the summary line."""
    (tmp_path / STATE_FILE).write_text(_state())
    status = f'"{sys.executable}" -m receivewal status -D "{tmp_path}"'
    for lines in (0, 1):
        done = subprocess.run(["bash", "-c", f"set -o pipefail; {status} | head -n {lines}"],
                              capture_output=True, text=True, check=False, timeout=TIMEOUT)
        assert done.returncode == 2, done.stderr
        assert done.stderr == ""
        if lines:
            assert one_line(done.stdout).startswith(
                "RECEIVEWAL CRITICAL - not running: stopped")
