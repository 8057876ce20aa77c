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
from support.servers import PgServer, free_port
from support.streams import PARTIAL, start_receivewal, stop, wait_for, wal_files

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
        time.sleep(2.5)  # a few ticks: watchdog pings, STATUS refresh, state file rewrite
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
        assert document["summary"].startswith("RECEIVEWAL OK - streaming timeline 1 at ")
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
        time.sleep(10)
        pings = [t for t, m in zip(fake_systemd.times, fake_systemd.messages, strict=True)
                 if "WATCHDOG" in m and t >= down]
        assert any(m.get("STATUS", "").startswith("Reconnecting in ")
                   for m in fake_systemd.messages), fake_systemd.messages
        gaps = [b - a for a, b in zip([down, *pings], [*pings, time.monotonic()], strict=True)]
        assert max(gaps) < 2.0, gaps
    finally:
        assert stop(proc, signal.SIGTERM) == 0
