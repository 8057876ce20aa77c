"""``receivewal stream`` under a fake systemd: READY/WATCHDOG/STATUS/STOPPING, metrics, status."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.servers import PgServer, free_port, pg_bin
from support.streams import (
    PARTIAL,
    lsn_to_int,
    start_receivewal,
    stop,
    wait_for,
    wal_files,
)

pytestmark = pytest.mark.server


class FakeSystemd:
    """The NOTIFY_SOCKET end: a bound AF_UNIX datagram socket whose thread records every
    message as it arrives, as systemd reads its notify socket."""

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="rw-sd-")
        self.path = os.path.join(self.directory, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.messages: list[dict[str, str]] = []
        self.times: list[float] = []  # monotonic arrival time of each message
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._closing.is_set():
            try:
                data = self.sock.recv(4096).decode()
            except TimeoutError:
                continue
            self.times.append(time.monotonic())
            self.messages.append(dict(line.split("=", 1) for line in data.split("\n")))

    def wait(self, key: str, timeout: float = 60) -> int:
        """Index of the first message carrying ``key``, waiting for it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for index, message in enumerate(list(self.messages)):
                if key in message:
                    return index
            time.sleep(0.05)
        raise TimeoutError(f"no {key} notification within {timeout}s: {self.messages}")

    def close(self) -> None:
        self._closing.set()
        self._thread.join()
        self.sock.close()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture
def fake_systemd() -> Iterator[FakeSystemd]:
    systemd = FakeSystemd()
    yield systemd
    systemd.close()


def scrape(port: int) -> dict[str, float]:
    """Unlabelled samples of the metrics endpoint, by name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def status(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "receivewal", "status", "-D", str(directory), "--json"],
        capture_output=True, text=True, check=False,
    )


@pytest.mark.shared_server
def test_daemon_notifies_systemd_serves_metrics_and_reports_status(
    pg: PgServer, archive_dir: Path, tmp_path: Path, fake_systemd: FakeSystemd
) -> None:
    """READY=1 once streaming, WATCHDOG=1 pings, STATUS with timeline and LSN; SIGTERM gives
    STOPPING=1 and exit 0 with the .partial kept; metrics and `receivewal status` agree."""
    pg.sql("SELECT pg_create_physical_replication_slot('rw1', true)")
    port = free_port()
    log = tmp_path / "log"
    env = {
        "NOTIFY_SOCKET": fake_systemd.path,
        "WATCHDOG_USEC": "2000000",  # pings every second
        "RECEIVEWAL_DIRECTORY": str(archive_dir),
        "RECEIVEWAL_DBNAME": pg.dsn,
        "RECEIVEWAL_SLOT": "rw1",
        "RECEIVEWAL_STATUS_INTERVAL": "1",
        "RECEIVEWAL_METRICS_ADDRESS": f"127.0.0.1:{port}",
    }
    proc = start_receivewal("stream", env=env, stderr_path=log)
    try:
        ready = fake_systemd.wait("READY")
        assert fake_systemd.messages[ready]["READY"] == "1"
        assert fake_systemd.messages[ready]["STATUS"].startswith("Streaming timeline 1 from ")
        assert any(m.get("STATUS", "").startswith("Connected to ")
                   for m in fake_systemd.messages[:ready]), fake_systemd.messages
        # READY came after START_REPLICATION: the server sees us streaming.
        wait_for(lambda: pg.sql("SELECT count(*) FROM pg_stat_replication") == "1",
                 what="walsender")

        pg.generate_wal(segments=1)
        pg.switch_wal()
        pg.sql("CREATE TABLE after_switch (x int)")  # so that a .partial segment is open
        lsn = pg.current_lsn()
        flushed = f"SELECT flush_lsn >= '{lsn}' FROM pg_stat_replication"
        wait_for(lambda: pg.sql(flushed) == "t", what="WAL to be flushed")
        wait_for(lambda: sum("WATCHDOG" in m for m in fake_systemd.messages) >= 2 and any(
            m.get("STATUS", "").startswith("Streaming timeline 1, flushed ")
            for m in fake_systemd.messages), timeout=15, what="watchdog pings, STATUS refresh")
        messages = list(fake_systemd.messages)
        assert sum("WATCHDOG" in m for m in messages) >= 2, messages
        assert sum("READY" in m for m in messages) == 1
        assert any(m.get("STATUS", "").startswith("Streaming timeline 1, flushed ")
                   for m in messages), messages

        metrics = scrape(port)
        assert metrics["receivewal_streaming"] == 1
        assert metrics["receivewal_timeline"] == 1
        assert metrics["receivewal_segments_completed_total"] >= 1
        hi, lo = lsn.split("/")
        assert metrics["receivewal_flushed_lsn"] >= (int(hi, 16) << 32 | int(lo, 16))
        assert metrics["receivewal_received_lsn"] >= metrics["receivewal_flushed_lsn"]
        assert metrics["receivewal_wal_bytes_total"] > 16 << 20
        assert metrics["receivewal_last_message_age_seconds"] < 30

        # The state file is rewritten every few seconds: wait for one that saw the segments.
        wait_for(lambda: json.loads(status(archive_dir).stdout)["state"]["segments_completed"],
                 timeout=15, what="state file rewrite")
        running = status(archive_dir)
        assert running.returncode == 0, running.stdout
        document = json.loads(running.stdout)
        assert document["summary"].startswith("RECEIVEWAL OK - streaming timeline 1, received ")
        assert document["state"]["pid"] == proc.pid
        assert document["state"]["slot"] == "rw1"
        assert document["state"]["segments_completed"] >= 1
    finally:
        code = stop(proc, signal.SIGTERM)
    assert code == 0, log.read_text()
    messages = list(fake_systemd.messages)
    assert any(m.get("STOPPING") == "1" for m in messages), messages
    assert [n for n in wal_files(archive_dir) if n.endswith(PARTIAL)]

    stopped = status(archive_dir)
    assert stopped.returncode == 2
    assert json.loads(stopped.stdout)["summary"].startswith(
        "RECEIVEWAL CRITICAL - not running: stopped "
    )
    assert "password" not in (archive_dir / ".receivewal-state.json").read_text().lower()


def test_watchdog_pings_go_on_while_the_server_is_down(
    pg: PgServer, archive_dir: Path, tmp_path: Path, fake_systemd: FakeSystemd
) -> None:
    """A server outage is not a hung daemon: pings keep coming at half of WATCHDOG_USEC."""
    env = {
        "NOTIFY_SOCKET": fake_systemd.path,
        "WATCHDOG_USEC": "2000000",  # pings every second; systemd would give up after 2s
        "RECEIVEWAL_RECONNECT_DELAY": "4",
        "RECEIVEWAL_RECONNECT_DELAY_MAX": "4",
    }
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, env=env,
                            stderr_path=tmp_path / "log")
    try:
        fake_systemd.wait("READY")
        pg.stop("fast")
        fake_systemd.wait("STATUS", timeout=5)
        down = time.monotonic()

        def retries() -> int:
            return sum(m.get("STATUS", "").startswith("Reconnecting in ") and t >= down
                       for t, m in zip(fake_systemd.times, fake_systemd.messages, strict=True))
        # two retries after the outage began: a whole 4 s reconnect delay lies between them
        wait_for(lambda: retries() >= 2, timeout=30, what="two reconnect attempts")
        pings = [t for t, m in zip(fake_systemd.times, fake_systemd.messages, strict=True)
                 if "WATCHDOG" in m and t >= down]
        assert any(m.get("STATUS", "").startswith("Reconnecting in ")
                   for m in fake_systemd.messages), fake_systemd.messages
        gaps = [b - a for a, b in zip([down, *pings], [*pings, time.monotonic()], strict=True)]
        assert max(gaps) < 2.0, gaps
    finally:
        assert stop(proc, signal.SIGTERM) == 0


def scrape_labelled(port: int, name: str) -> dict[str, float]:
    """Samples of the labelled metric ``name``, by their label text (``slot="rw"``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1:].rsplit(" ", 1)
            samples[labels.rstrip("}")] = float(value)
    return samples


def run_pgbench(pg: PgServer, seconds: int) -> subprocess.Popen[bytes]:
    """pgbench's TPC-B-like load on ``pg`` for ``seconds`` (initialised first), in the
    background."""
    common = ["-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres"]
    subprocess.run([pg_bin("pgbench"), "-i", "-q", "-s", "2", *common, "postgres"],
                   check=True, capture_output=True)
    return subprocess.Popen([pg_bin("pgbench"), "-n", "-c", "2", "-T", str(seconds), *common,
                             "postgres"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.shared_server
def test_status_and_metrics_are_live_while_pgbench_writes(
    pg: PgServer, archive_dir: Path, tmp_path: Path
) -> None:
    """Under a pgbench load, before any server_silent probe: the server's WAL end is known
    (from XLogData's walEnd) and lag is measured against it; the slot's restart_lsn follows
    the flush position we report; the per-connection and since-start counters are one;
    the summary says received and flushed; the compression is spelled one way in the logs."""
    pg.sql("SELECT pg_create_physical_replication_slot('rw', true)")
    initial_restart = lsn_to_int(
        pg.sql("SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = 'rw'"))
    port = free_port()
    log = tmp_path / "log"
    env = {"RECEIVEWAL_STATUS_INTERVAL": "1", "RECEIVEWAL_METRICS_ADDRESS": f"127.0.0.1:{port}",
           "RECEIVEWAL_RECEIVE_TIMEOUT": "600"}  # server_silent only after 300 s of silence
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "rw",
                            env=env, stderr_path=log)
    try:
        wait_for(lambda: '"phase": "streaming"' in status(archive_dir).stdout, what="streaming")
        first = json.loads(status(archive_dir).stdout)
        assert first["summary"].startswith("RECEIVEWAL OK - streaming timeline 1, received 0/")
        assert " at -" not in first["summary"]
        assert first["state"]["server_wal_end"] is not None, first

        bench = run_pgbench(pg, seconds=120)  # stopped once the checks are done
        try:
            def moved() -> bool:
                state = json.loads(status(archive_dir).stdout)["state"]
                return (state["slot_restart_lsn"] is not None
                        and lsn_to_int(state["slot_restart_lsn"]) > initial_restart + (4 << 20))
            wait_for(moved, timeout=60, what="the slot's restart_lsn in the state to move")
            during = json.loads(status(archive_dir).stdout)
            metrics = scrape(port)
            slot_metric = scrape_labelled(port, "receivewal_slot_restart_lsn")['slot="rw"']
            server_restart = lsn_to_int(
                pg.sql("SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = 'rw'"))
            assert bench.poll() is None, "pgbench ended before the checks: the load is too short"
        finally:
            bench.terminate()
            bench.wait(timeout=60)
        state = during["state"]
        received = lsn_to_int(state["received_lsn"])
        server_end = lsn_to_int(state["server_wal_end"])
        assert server_end >= received > initial_restart + (4 << 20)
        assert metrics["receivewal_server_wal_end_lsn"] >= metrics["receivewal_received_lsn"]
        assert metrics["receivewal_lag_bytes"] == (
            metrics["receivewal_server_wal_end_lsn"] - metrics["receivewal_flushed_lsn"])
        # The slot: what we reported as flushed, which the server then holds (it only moves on).
        reported = lsn_to_int(state["slot_restart_lsn"])
        assert initial_restart < reported <= server_restart
        assert initial_restart < slot_metric <= server_restart
        # One source for the byte counters: no reconnect, so this connection == since start.
        assert state["reconnects"] == 0
        assert state["stream_wal_bytes"] == state["wal_bytes"] > 4 << 20
        assert state["stream_wire_bytes"] == state["wire_bytes"] > 4 << 20
        assert metrics["receivewal_wal_bytes_total"] >= state["wal_bytes"]
        summary = during["summary"]
        assert f"received {state['received_lsn']}" in summary, summary
        assert f"flushed {state['flushed_lsn']}" in summary, summary
    finally:
        assert stop(proc, signal.SIGTERM) == 0, log.read_text()
    assert_plain_stream_spelled_none(log, archive_dir)


def assert_plain_stream_spelled_none(log: Path, archive_dir: Path) -> None:
    """No server_silent probe happened; log events and state spell a plain stream "none"."""
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert not [e for e in events if e["event"] == "server_silent"]
    spellings = {e["algorithm"] for e in events
                 if e["event"] in ("stream_compression", "compression_summary")}
    assert spellings == {"none"}, spellings
    assert json.loads(status(archive_dir).stdout)["state"]["compression"] == "none"
