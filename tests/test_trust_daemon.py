"""The daemon under hostile conditions: a flood of idle metrics connections, a file descriptor
limit reached in the middle of the stream. It stays up and the archive keeps every WAL byte."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.archives import proven_segment
from support.dropin import install_dropin
from support.servers import PgServer, free_port
from support.streams import (
    RECEIVEWAL,
    assert_identical_to_server,
    lsn_to_int,
    start_receivewal,
    stop,
    wait_for,
)

from receivewal.archive.directory import Archive
from receivewal.errors import DescriptorLimitError

SEGMENT = 16 * 1024 * 1024
FD_LIMIT = 64
IDLE_CONNECTIONS = 3 * FD_LIMIT


def open_descriptors(pid: int) -> int:
    """How many file descriptors the process has open now."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def fewest_descriptors(pid: int) -> int:
    """The fewest file descriptors the process held in ten looks over half a second."""
    counts = []
    for _ in range(10):
        counts.append(open_descriptors(pid))
        time.sleep(0.05)
    return min(counts)


def flushed(pg: PgServer) -> int:
    """The flush position the daemon reported to the server through its slot (0 before it
    reported any; without a slot the daemon reports none, as pg_receivewal)."""
    text = pg.sql("SELECT flush_lsn FROM pg_stat_replication")
    return lsn_to_int(text) if text else 0


def scrape_ok(port: int) -> bool:
    """True when GET /metrics answers 200 with the daemon's metrics."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return response.status == 200 and b"receivewal_flushed_lsn" in response.read()
    except OSError:
        return False


@contextlib.contextmanager
def idle_connections(port: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connection attempts to the port (those the kernel completes are held) that
    never send a byte; closed on exit."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.settimeout(1)
            try:
                sock.connect(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            held.append(sock)
        yield held
    finally:
        for sock in held:
            sock.close()


@pytest.mark.shared_server
@pytest.mark.server
def test_idle_metrics_connections_beyond_the_fd_limit_leave_the_daemon_streaming(
        pg: PgServer, archive_dir: Path, tmp_path: Path) -> None:
    """With RLIMIT_NOFILE at 64, three times as many idle connections to the metrics port
    while WAL flows: the daemon keeps streaming (the metrics server caps its connections and
    drops idle ones), /metrics answers again, and the archive equals the server's pg_wal."""
    port = free_port()
    log = tmp_path / "stream.log"
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                            "-s", "0.2",
                            "--metrics-address", f"127.0.0.1:{port}", "--log-format", "json",
                            "--reconnect-delay", "0.2", "--reconnect-delay-max", "1",
                            stderr_path=log)
    try:
        wait_for(lambda: scrape_ok(port), what="the metrics endpoint")
        resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))
        with idle_connections(port, IDLE_CONNECTIONS):
            pg.generate_wal(segments=3)
            end = lsn_to_int(pg.switch_wal())
            wait_for(lambda: proc.poll() is not None or flushed(pg) >= end, timeout=120,
                     what="the daemon to flush the WAL written meanwhile")
            assert proc.poll() is None, log.read_text()[-2000:]
            wait_for(lambda: scrape_ok(port), what="/metrics to answer despite the idle ones")
        assert proc.poll() is None, log.read_text()[-2000:]
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-2000:]
    assert "Traceback" not in log.read_text()  # dropped clients are not worth a traceback
    assert len(assert_identical_to_server(archive_dir, pg)) >= 3


@pytest.mark.shared_server
@pytest.mark.server
def test_running_out_of_descriptors_mid_stream_is_retried_not_fatal(
        pg: PgServer, archive_dir: Path, tmp_path: Path) -> None:
    """The daemon's descriptor limit is cut to what it holds, so opening the next segment
    fails with EMFILE: the daemon logs it, stays up, retries, and once the limit is raised
    again archives every segment byte for byte."""
    log = tmp_path / "stream.log"
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                            "-s", "0.2", "--log-format", "json", "--reconnect-delay", "0.2",
                            "--reconnect-delay-max", "1", stderr_path=log)
    try:
        wait_for(lambda: pg.sql("SELECT count(*) FROM pg_stat_replication WHERE state = "
                                "'streaming'") == "1", what="streaming to start")
        soft, hard = resource.prlimit(proc.pid, resource.RLIMIT_NOFILE)

        def emfile_logged() -> bool:
            return proc.poll() is not None or "Too many open files" in log.read_text()
        # A count taken while the daemon briefly holds one more descriptor (a status file, a
        # directory synced) leaves room for the next segment, so the limit is cut to the fewest
        # seen, again before each segment, until the daemon runs out.
        for attempt in range(5):
            resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (fewest_descriptors(proc.pid), hard))
            pg.generate_wal(segments=1)
            try:
                wait_for(emfile_logged, timeout=20, what="the daemon to run out of descriptors")
                break
            except TimeoutError:
                if attempt == 4:
                    raise
        events = [json.loads(line) for line in log.read_text().splitlines()
                  if line.startswith("{")]
        assert proc.poll() is None, log.read_text()[-2000:]
        assert not any(e["event"] == "failed" for e in events), log.read_text()[-2000:]
        resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (soft, hard))
        end = lsn_to_int(pg.switch_wal())
        wait_for(lambda: proc.poll() is not None or flushed(pg) >= end, timeout=120,
                 what="the daemon to catch up once descriptors are back")
        assert proc.poll() is None, log.read_text()[-2000:]
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-2000:]
    assert "Traceback" not in log.read_text()
    assert len(assert_identical_to_server(archive_dir, pg)) >= 2


def test_a_segment_that_cannot_be_opened_for_lack_of_descriptors_is_no_resume_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The resume scan never passes over a good segment because opening it failed with EMFILE
    (it would then restart from an older point, or from the server's, leaving a hole): the
    scan raises the retryable DescriptorLimitError instead (injected: the scan's own
    directory read needs a descriptor too, so a real limit fails that first)."""
    (tmp_path / "000000010000000000000005").write_bytes(proven_segment(5))
    archive = Archive(tmp_path)
    assert archive.resume_point(SEGMENT, 7)[0] is not None

    def no_descriptor(*args: object, **kwargs: object) -> int:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
    monkeypatch.setattr(os, "open", no_descriptor)
    with pytest.raises(DescriptorLimitError, match="000000010000000000000005"):
        archive.resume_point(SEGMENT, 7)


# -- a password given on the command line ------------------------------------------------------

PASSWORD = "argv-secret-5521"  # noqa: S105 - the test role's password


@pytest.fixture
def password_server(pg: PgServer) -> PgServer:
    """``pg`` with a role ``rep`` that must log in for replication with a scram-sha-256
    password (the tests' own psql, as postgres, still gets in by trust)."""
    pg.sql(f"CREATE ROLE rep LOGIN REPLICATION PASSWORD '{PASSWORD}'")
    hba = pg.datadir / "pg_hba.conf"
    hba.write_text("host replication rep 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    pg.sql("SELECT pg_reload_conf()")
    return pg


def command_line(pid: int) -> str:
    """What ``ps`` shows as the process's arguments: /proc/PID/cmdline, NULs as spaces."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.mark.server
@pytest.mark.parametrize("program", ["receivewal stream", "pg_receivewal drop-in"])
def test_a_password_on_the_command_line_is_scrubbed_from_argv(
        program: str, password_server: PgServer, archive_dir: Path, tmp_path: Path) -> None:
    """-d "... password=..." logs in (the server asks rep for a scram password), and while
    the daemon streams its command line, as ps and /proc/PID/cmdline show it to every user,
    no longer holds the password: it reads password=****."""
    pg = password_server
    dsn = f"host=127.0.0.1 port={pg.port} user=rep password={PASSWORD} dbname=postgres"
    argv = [*RECEIVEWAL, "stream"] if program == "receivewal stream" \
        else [str(install_dropin(tmp_path / "bin"))]
    log = tmp_path / "stream.log"
    with log.open("wb") as err:
        proc = subprocess.Popen([*argv, "-D", str(archive_dir), "-d", dsn],
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for(lambda: proc.poll() is not None or pg.sql(
            "SELECT count(*) FROM pg_stat_replication WHERE usename = 'rep' "
            "AND state = 'streaming'") == "1", what="streaming as rep")
        assert proc.poll() is None, log.read_text()
        shown = command_line(proc.pid)
        ps = subprocess.run(["ps", "-o", "args=", "-p", str(proc.pid)], capture_output=True,
                            text=True, check=True).stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0, log.read_text()
    assert PASSWORD not in shown
    assert PASSWORD not in ps
    assert "password=****" in shown
    assert f"host=127.0.0.1 port={pg.port} user=rep" in shown
