"""Helpers for tests that run ``receivewal stream`` against real servers."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog

from receivewal.wal.lsn import parse_lsn
from support.servers import PgServer, pg_bin

RECEIVEWAL = [sys.executable, "-m", "receivewal"]
PARTIAL = ".partial"


def receivewal(*args: str, timeout: float = 120, env: dict[str, str] | None = None,
               ) -> subprocess.CompletedProcess[str]:
    """Run ``receivewal ARGS`` to completion with JSON logs; return the finished process."""
    return subprocess.run([*RECEIVEWAL, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, check=False)


def receivewal_here(*args: str, env: dict[str, str] | None = None,
                    main: Callable[[list[str]], int] | None = None,
                    ) -> subprocess.CompletedProcess[str]:
    """Run ``receivewal ARGS`` in this process (its entry point, as ``python -m receivewal``
    calls it, or ``main``) and return what a finished process would: the exit code, standard
    output and error. For the cases that end before any connection or child process (bad
    input): the time of a Python start each. The environment, the logging configuration and
    the signal handlers are as they were afterwards."""
    from receivewal.commands import cli  # noqa: PLC0415 - the code under test

    entry = cli.main if main is None else main

    out, err = io.StringIO(), io.StringIO()
    saved_logging = structlog.get_config()
    saved_signals = {signum: signal.getsignal(signum) for signum in HANDLED_SIGNALS}
    try:
        with pytest.MonkeyPatch.context() as patch:
            for name, value in (env or {}).items():
                patch.setenv(name, value)
            patch.setattr(sys, "stdout", out)
            patch.setattr(sys, "stderr", err)
            try:
                code = entry(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        structlog.configure(**saved_logging)
        for signum, handler in saved_signals.items():
            signal.signal(signum, handler)
    return subprocess.CompletedProcess(["receivewal", *args], code, out.getvalue(),
                                       err.getvalue())


#: the signals whose handlers an in-process run (receivewal_here) puts back as they were
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM)


def start_receivewal(*args: str, env: dict[str, str] | None = None,
                     stderr_path: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``receivewal ARGS`` in the background."""
    stderr = stderr_path.open("ab") if stderr_path else subprocess.PIPE
    return subprocess.Popen([*RECEIVEWAL, *args], stdout=subprocess.DEVNULL, stderr=stderr,
                            env={**os.environ, **(env or {})})


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 30) -> int:
    """Send ``sig`` and wait for the exit code."""
    proc.send_signal(sig)
    return proc.wait(timeout=timeout)


def wait_for(predicate: object, timeout: float = 60, what: str = "condition") -> None:
    """Poll ``predicate()`` until true."""
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def start_streaming(*args: str, log: Path, env: dict[str, str] | None = None,
                    ) -> subprocess.Popen[bytes]:
    """Start ``receivewal stream ARGS --log-format json`` (its log into ``log``) and wait
    until it streams; an exit before that fails with its log."""
    proc = start_receivewal("stream", *args, "--log-format", "json", env=env, stderr_path=log)
    wait_for(lambda: '"streaming_started"' in log.read_text() or proc.poll() is not None,
             what="streaming")
    assert proc.poll() is None, log.read_text()
    return proc


def wal_files(directory: Path) -> list[str]:
    """Segment file names (complete and partial) in an archive, sorted."""
    return sorted(n for n in os.listdir(directory) if len(n.split(".")[0]) == 24)


def complete_segments(directory: Path) -> list[str]:
    """Complete segment file names in an archive, sorted."""
    return [n for n in wal_files(directory) if not n.endswith(PARTIAL)]


def assert_identical_to_server(directory: Path, server: PgServer) -> list[str]:
    """Every complete archived segment equals the server's own file; return their names."""
    names = complete_segments(directory)
    for name in names:
        ours = (directory / name).read_bytes()
        theirs = (server.pg_wal / name).read_bytes()
        assert ours == theirs, f"segment {name} differs from the server's pg_wal file"
    return names

def lsn_to_int(text: str) -> int:
    """Parse X/X."""
    return parse_lsn(text)


def pg_waldump(directory: Path, start: str, end: str) -> subprocess.CompletedProcess[str]:
    """Run pg_waldump over the archive between two LSNs."""
    return subprocess.run([pg_bin("pg_waldump"), "-p", str(directory), "-s", start, "-e", end,
                           "-q"], capture_output=True, text=True, check=False)


def slot_restart_lsn(server: PgServer, slot: str) -> int:
    """A replication slot's restart_lsn."""
    return lsn_to_int(server.sql("SELECT restart_lsn FROM pg_replication_slots "
                                 f"WHERE slot_name = '{slot}'"))


def log_events(stderr: str) -> list[dict[str, object]]:
    """receivewal's JSON log lines."""
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
