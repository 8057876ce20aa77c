"""The state file round-trips, and ``receivewal status`` gives Nagios exit codes for each case."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from receivewal.archive.directory import Archive
from receivewal.commands.cli import cli
from receivewal.daemon.health import CRITICAL, OK, evaluate
from receivewal.daemon.monitor import Monitor
from receivewal.daemon.state import (
    LastError,
    State,
    decode_state,
    encode_state,
    read_state,
    state_path,
    write_state,
)
from receivewal.errors import ArchiveError
from receivewal.wal.lsn import parse_lsn

NOW = 1_700_000_000.0
WHERE = "timeline 1, received 0/5001000, flushed 0/5000000"  # streaming_state()'s position


def streaming_state(**changes: object) -> State:
    """A daemon on this host, streaming timeline 1, flushed to 0/5000000."""
    state = State(
        pid=os.getpid(),
        hostname=socket.gethostname(),
        started_at=NOW - 3600,
        updated_at=NOW - 1,
        phase="streaming",
        server="host=db1 port=5432 user=rep",
        system_identifier="7300000000000000001",
        timeline=1,
        slot="slot1",
        slot_restart_lsn=parse_lsn("0/4000000"),
        received_lsn=parse_lsn("0/5001000"),
        written_lsn=parse_lsn("0/5001000"),
        flushed_lsn=parse_lsn("0/5000000"),
        server_wal_end=parse_lsn("0/5002000"),
        last_contact=NOW - 2,
        compression="zstd",
        stream_wire_bytes=1000,
        stream_wal_bytes=4000,
        wire_bytes=2000,
        wal_bytes=8000,
        segments_completed=4,
        last_segment="000000010000000000000004",
        reconnects=1,
        last_error=LastError("ConnectionLost", "server closed the connection", NOW - 600),
    )
    return replace(state, **changes)  # type: ignore[arg-type]


def status(directory: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["status", "-D", str(directory), *args])
    return result.exit_code, result.output


def assert_age(pattern: str, text: str, least: float, since: float) -> None:
    """TEXT starts with PATTERN, whose ``(\\d+)`` is an age in seconds: at least LEAST rounded
    down and at most LEAST plus the time gone by SINCE, rounded up (on a loaded machine the
    status may be evaluated a second or more after the state was written)."""
    found = re.match(pattern, text)
    assert found, text
    high = least + (time.time() - since)
    assert int(least) <= int(found.group(1)) <= math.ceil(high), text


# -- the state file ------------------------------------------------------------------------


def test_state_round_trips_through_the_file(tmp_path: Path) -> None:
    state = streaming_state()
    write_state(tmp_path, state, mode=0o640)
    assert read_state(tmp_path) == state
    assert state_path(tmp_path).stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == [".receivewal-state.json"]
    document = json.loads(state_path(tmp_path).read_text())
    assert document["flushed_lsn"] == "0/5000000"
    assert document["last_contact"] == "2023-11-14T22:13:18+00:00"
    assert document["version"] == 1


def test_a_state_with_nothing_known_yet_round_trips() -> None:
    state = State(pid=1, hostname="h", started_at=NOW, updated_at=NOW)
    assert decode_state(encode_state(state)) == state


def test_rewriting_replaces_the_file_and_keeps_the_mode(tmp_path: Path) -> None:
    write_state(tmp_path, streaming_state(), mode=0o600)
    later = streaming_state(flushed_lsn=parse_lsn("0/6000000"))
    write_state(tmp_path, later, mode=0o600)
    assert read_state(tmp_path) == later
    assert state_path(tmp_path).stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"{", "Expecting"),
        (b"[]", "not a JSON object"),
        (b'{"version": 2}', "unsupported format version 2"),
        (b'{"version": 1, "pid": 1}', "missing"),
        (b'{"version": 1, "pid": "1", "hostname": "h", "started_at": "2023-11-14T22:13:18",'
         b' "updated_at": "2023-11-14T22:13:18"}', "pid must be an integer"),
        (b'{"version": 1, "pid": 1, "hostname": "h", "started_at": "2023-11-14T22:13:18",'
         b' "updated_at": "2023-11-14T22:13:18", "flushed_lsn": "junk"}', "invalid LSN"),
        (b"\xff\xfe", "invalid state file"),
    ],
)
def test_a_damaged_state_file_raises_archive_error_saying_why(data: bytes, reason: str) -> None:
    with pytest.raises(ArchiveError, match=reason):
        decode_state(data)


# -- evaluate (pure) -----------------------------------------------------------------------


def test_evaluate_ok_summary_names_timeline_position_and_contact_age() -> None:
    verdict = evaluate(streaming_state(), NOW, 60, running=True)
    assert verdict.code == OK
    assert verdict.summary == (
        f"RECEIVEWAL OK - streaming {WHERE}, last contact 2s ago"
    )


def test_evaluate_critical_cases() -> None:
    stale = evaluate(streaming_state(last_contact=NOW - 90), NOW, 60, running=True)
    assert stale.code == CRITICAL
    assert stale.summary.startswith(
        "RECEIVEWAL CRITICAL - no contact with the server for 90s (max 60s)"
    )
    assert "last error ConnectionLost: server closed the connection" in stale.summary
    dead = evaluate(streaming_state(), NOW, 60, running=False)
    assert dead.code == CRITICAL
    assert dead.summary.startswith("RECEIVEWAL CRITICAL - not running: no process holds the "
                                   f"archive's lock (pid {os.getpid()} recorded")
    assert dead.summary.endswith(
        f"{WHERE}, last error ConnectionLost: server closed the connection"
    )
    stopped = evaluate(streaming_state(phase="stopped"), NOW, 60, running=False)
    assert stopped.summary.startswith("RECEIVEWAL CRITICAL - not running: stopped 1s ago")
    never = evaluate(streaming_state(last_contact=None), NOW, 60, running=True)
    assert never.code == CRITICAL
    assert "no contact with the server since start 3600s ago" in never.summary


def test_evaluate_just_started_without_contact_is_ok() -> None:
    state = streaming_state(phase="starting", started_at=NOW - 5, last_contact=None)
    verdict = evaluate(state, NOW, 60, running=True)
    assert verdict == evaluate(state, NOW, 60, running=None)
    assert verdict.code == OK
    assert verdict.summary == "RECEIVEWAL OK - starting, no server contact yet (started 5s ago)"


def test_evaluate_on_another_host_relies_on_contact_age() -> None:
    assert evaluate(streaming_state(), NOW, 60, running=None).code == OK


# -- the command -----------------------------------------------------------------------------


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[None]:
    """This test holds the archive's lock, as the daemon does while it runs: status tells
    "running" by the lock."""
    archive = Archive(tmp_path)
    archive.lock()
    yield
    archive.unlock()


def fresh(**changes: object) -> State:
    """streaming_state() moved to the real clock: last contact about 2s ago."""
    now = time.time()
    state = streaming_state(
        started_at=now - 3600, updated_at=now - 1, last_contact=now - 1.8,
        last_error=LastError("ConnectionLost", "server closed the connection", now - 600),
    )
    return replace(state, **changes)  # type: ignore[arg-type]


def test_status_running_exits_0_and_prints_the_state(tmp_path: Path, locked: None) -> None:
    since = time.time()
    write_state(tmp_path, fresh())
    code, output = status(tmp_path)
    assert code == 0
    lines = output.splitlines()
    assert_age(rf"RECEIVEWAL OK - streaming {re.escape(WHERE)}, last contact (\d+)s ago$",
               lines[0], 1.8, since)
    assert "flushed:            0/5000000" in lines
    assert "server:             host=db1 port=5432 user=rep" in lines
    assert "slot:               slot1 (restart_lsn 0/4000000)" in lines
    assert (
        "compression:        zstd: 3.9 kB WAL in 1000 B on the wire (4.00x) this connection"
        in lines
    )
    assert "segments completed: 4 (last 000000010000000000000004)" in lines
    assert any(line.startswith("last error:         ConnectionLost: server") for line in lines)


def test_status_json_carries_the_verdict_and_the_state(tmp_path: Path, locked: None) -> None:
    write_state(tmp_path, fresh())
    code, output = status(tmp_path, "--json")
    assert code == 0
    document = json.loads(output)
    assert document["status"] == "OK"
    assert document["code"] == 0
    assert document["summary"].startswith(f"RECEIVEWAL OK - streaming {WHERE}")
    assert document["state"]["flushed_lsn"] == "0/5000000"
    assert document["state"]["pid"] == os.getpid()
    assert document["state"]["last_error"]["kind"] == "ConnectionLost"


def test_status_stale_contact_exits_2(tmp_path: Path, locked: None) -> None:
    since = time.time()
    write_state(tmp_path, fresh(last_contact=since - 120))
    code, output = status(tmp_path)
    assert code == 2
    assert_age(r"RECEIVEWAL CRITICAL - no contact with the server for (\d+)s \(max 60s\)",
               output, 120, since)
    code, output = status(tmp_path, "--max-age", "300")
    assert code == 0


def test_status_dead_pid_exits_2(tmp_path: Path) -> None:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    gone = int(child.stdout)
    write_state(tmp_path, fresh(pid=gone))
    code, output = status(tmp_path)
    assert code == 2
    assert output.startswith("RECEIVEWAL CRITICAL - not running: no process holds the "
                             f"archive's lock (pid {gone} recorded")


def test_status_missing_state_file_exits_3(tmp_path: Path) -> None:
    code, output = status(tmp_path)
    assert code == 3
    assert output.startswith(
        f"RECEIVEWAL UNKNOWN - no state file {tmp_path}/.receivewal-state.json"
    )
    code, output = status(tmp_path, "--json")
    assert code == 3
    assert json.loads(output)["state"] is None


def test_status_unreadable_state_file_exits_3(tmp_path: Path) -> None:
    state_path(tmp_path).write_text("{not json")
    code, output = status(tmp_path)
    assert code == 3
    assert output.startswith("RECEIVEWAL UNKNOWN - cannot read state: ")
    assert "invalid state file" in output


def test_status_reads_what_a_live_monitor_writes(tmp_path: Path, locked: None) -> None:
    since = time.time()
    monitor = Monitor(tmp_path, environ={})
    monitor.connected("host=db1 port=5432 user=rep", "7300000000000000001", 1, None)
    monitor.streaming_started(1, parse_lsn("0/5000000"))
    monitor.received(parse_lsn("0/5000100"), 100, 100)
    monitor.flushed(parse_lsn("0/5000100"))
    monitor.tick(time.time() + 10)
    code, output = status(tmp_path)
    assert code == 0
    assert_age(r"RECEIVEWAL OK - streaming timeline 1, received 0/5000100, flushed 0/5000100, "
               r"last contact (\d+)s ago", output, 0, since)
    since = time.time()
    monitor.close()
    code, output = status(tmp_path)
    assert code == 2
    assert_age(r"RECEIVEWAL CRITICAL - not running: stopped (\d+)s ago", output, 0, since)


def test_status_exit_codes_reach_the_shell(tmp_path: Path, locked: None) -> None:
    """Through the console entry point, as Nagios runs it (not only click's test runner)."""
    run = [sys.executable, "-m", "receivewal", "status", "-D", str(tmp_path)]
    missing = subprocess.run(run, capture_output=True, text=True, check=False)
    assert missing.returncode == 3
    write_state(tmp_path, fresh())
    ok = subprocess.run(run, capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    write_state(tmp_path, fresh(last_contact=time.time() - 61))
    stale = subprocess.run(run, capture_output=True, text=True, check=False)
    assert stale.returncode == 2
    env = {**os.environ, "RECEIVEWAL_DIRECTORY": str(tmp_path)}
    from_env = subprocess.run(run[:4], capture_output=True, text=True, check=False, env=env)
    assert from_env.returncode == 2


def test_summary_right_after_start_says_received_and_that_nothing_is_flushed_yet() -> None:
    """Right after START_REPLICATION nothing is flushed: the summary says where streaming
    stands (received) and says so, rather than ``at -``."""
    state = streaming_state(flushed_lsn=None, received_lsn=parse_lsn("0/3000000"))
    verdict = evaluate(state, NOW, 60, running=True)
    assert verdict.summary == ("RECEIVEWAL OK - streaming timeline 1, received 0/3000000, "
                               "nothing flushed yet, last contact 2s ago")
