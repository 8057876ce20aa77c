"""Monitor: sd_notify over a real datagram socket, the state file, and failures that never raise."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from receivewal.daemon.monitor import Monitor
from receivewal.daemon.notify import Notifier, format_message, socket_address, watchdog_interval
from receivewal.daemon.state import read_state
from receivewal.wal.lsn import parse_lsn


class NotifySocket:
    """A bound AF_UNIX datagram socket standing in for systemd's NOTIFY_SOCKET."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(2.0)

    def receive(self) -> dict[str, str]:
        """The next datagram as a dict of its KEY=VALUE lines."""
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.split("\n"))

    def pending(self) -> list[dict[str, str]]:
        """Every datagram already queued, without waiting."""
        messages = []
        self.sock.setblocking(False)
        try:
            while True:
                data = self.sock.recv(4096).decode()
                messages.append(dict(line.split("=", 1) for line in data.split("\n")))
        except BlockingIOError:
            pass
        finally:
            self.sock.settimeout(2.0)
        return messages


@pytest.fixture
def notify_path() -> Iterator[str]:
    """A short socket path (AF_UNIX paths are limited to 107 bytes)."""
    directory = tempfile.mkdtemp(prefix="rw-notify-")
    yield os.path.join(directory, "notify")
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def systemd(notify_path: str) -> Iterator[NotifySocket]:
    sock = NotifySocket(notify_path)
    yield sock
    sock.sock.close()


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_socket_address_reads_paths_and_abstract_names() -> None:
    assert socket_address({}) is None
    assert socket_address({"NOTIFY_SOCKET": ""}) is None
    assert socket_address({"NOTIFY_SOCKET": "/run/systemd/notify"}) == "/run/systemd/notify"
    assert socket_address({"NOTIFY_SOCKET": "@abstract/name"}) == b"\0abstract/name"


def test_watchdog_interval_is_half_of_watchdog_usec_for_our_pid_only() -> None:
    assert watchdog_interval({}, 42) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}, 42) is None
    assert watchdog_interval({"WATCHDOG_USEC": "60000000"}, 42) == 30.0
    assert watchdog_interval({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "42"}, 42) == 30.0
    assert watchdog_interval({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "41"}, 42) is None
    assert watchdog_interval({"WATCHDOG_USEC": "junk"}, 42) is None


def test_a_newline_in_a_value_cannot_inject_another_field() -> None:
    assert format_message(STATUS="bad\nREADY=1") == b"STATUS=bad READY=1"


def test_notifier_without_notify_socket_is_a_no_op() -> None:
    notifier = Notifier.from_environment({})
    assert not notifier.enabled
    assert notifier.notify(READY="1") is False


def test_ready_is_sent_once_streaming_has_started_and_not_on_connect(
    systemd: NotifySocket, notify_path: str
) -> None:
    monitor = Monitor(None, environ={"NOTIFY_SOCKET": notify_path})
    monitor.connected("host=db1 port=5432 user=rep", "7300000000000000001", 1, None)
    connected = systemd.receive()
    assert "READY" not in connected
    assert connected["STATUS"] == "Connected to host=db1 port=5432 user=rep, timeline 1"

    monitor.streaming_started(1, parse_lsn("0/5000000"))
    assert systemd.receive() == {
        "READY": "1", "STATUS": "Streaming timeline 1 from 0/5000000"
    }

    monitor.disconnected("server closed the connection")
    monitor.reconnecting(2.0)
    monitor.streaming_started(1, parse_lsn("0/6000000"))
    messages = systemd.pending()
    assert [m.get("STATUS") for m in messages] == [
        "Disconnected: server closed the connection",
        "Reconnecting in 2.0s",
        "Streaming timeline 1 from 0/6000000",
    ]
    assert not any("READY" in m for m in messages)
    monitor.close()


def test_tick_sends_status_with_timeline_and_flushed_lsn_when_it_changes(
    systemd: NotifySocket, notify_path: str
) -> None:
    monitor = Monitor(None, environ={"NOTIFY_SOCKET": notify_path})
    monitor.streaming_started(1, parse_lsn("0/5000000"))
    systemd.receive()
    monitor.flushed(parse_lsn("0/5001000"))
    monitor.tick(1.0)
    assert systemd.receive() == {"STATUS": "Streaming timeline 1, flushed 0/5001000"}
    monitor.tick(2.0)  # nothing changed: nothing sent
    monitor.timeline_switched(2)
    monitor.flushed(parse_lsn("0/6000000"))
    monitor.tick(3.0)
    assert [m["STATUS"] for m in systemd.pending()] == [
        "Streaming timeline 2, flushed 0/5001000",
        "Streaming timeline 2, flushed 0/6000000",
    ]
    monitor.close()


def test_watchdog_pings_at_half_the_watchdog_interval(
    systemd: NotifySocket, notify_path: str
) -> None:
    env = {"NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": "10000000",
           "WATCHDOG_PID": str(os.getpid())}
    monitor = Monitor(None, environ=env)
    pings = []
    for now in [100.0, 101.0, 104.9, 105.0, 106.0, 109.9, 110.0]:
        monitor.tick(now)
        if systemd.pending() == [{"WATCHDOG": "1"}]:
            pings.append(now)
    assert pings == [100.0, 105.0, 110.0]
    monitor.tick(50.0)  # the wall clock jumped back: ping rather than starve the watchdog
    assert systemd.receive() == {"WATCHDOG": "1"}
    monitor.close()


def test_no_watchdog_pings_when_watchdog_pid_is_another_process(
    systemd: NotifySocket, notify_path: str
) -> None:
    env = {"NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": "10000000",
           "WATCHDOG_PID": str(os.getpid() + 1)}
    monitor = Monitor(None, environ=env)
    for now in range(30):
        monitor.tick(float(now))
    assert systemd.pending() == []
    monitor.close()


def test_stopping_sends_stopping(systemd: NotifySocket, notify_path: str) -> None:
    monitor = Monitor(None, environ={"NOTIFY_SOCKET": notify_path})
    monitor.stopping()
    assert systemd.receive() == {"STOPPING": "1", "STATUS": "Stopping"}
    monitor.close()


def test_abstract_notify_socket_receives_ready() -> None:
    name = f"@receivewal-test-{os.getpid()}"
    sock = NotifySocket(b"\0" + name[1:].encode())
    try:
        monitor = Monitor(None, environ={"NOTIFY_SOCKET": name})
        monitor.streaming_started(3, parse_lsn("1/0"))
        assert sock.receive() == {"READY": "1", "STATUS": "Streaming timeline 3 from 1/0"}
        monitor.close()
    finally:
        sock.sock.close()


def test_a_vanished_notify_socket_is_logged_once_not_raised(notify_path: str) -> None:
    monitor = Monitor(None, environ={"NOTIFY_SOCKET": notify_path})  # nothing bound there
    with capture_logs() as logs:
        monitor.streaming_started(1, 0)
        monitor.stopping()
        receiver = NotifySocket(notify_path)
        monitor.error("ServerError", "boom")
    assert [e["event"] for e in logs] == ["notify_failed", "notify_recovered"]
    assert logs[0]["socket"] == notify_path
    assert logs[0]["fields"] == ["READY", "STATUS"]
    assert receiver.receive() == {"STATUS": "Error (ServerError): boom"}
    receiver.sock.close()
    monitor.close()


def test_a_reader_that_stops_reading_never_blocks_the_daemon(
    systemd: NotifySocket, notify_path: str
) -> None:
    """AF_UNIX datagram queues are short (net.unix.max_dgram_qlen, often 10): sends must not
    wait for systemd to catch up."""
    notifier = Notifier(notify_path)
    with capture_logs() as logs:
        sent = [notifier.notify(STATUS=f"message {i}") for i in range(2000)]
    assert sent[0]
    assert not all(sent)  # the queue filled up and we went on
    assert [e["event"] for e in logs] == ["notify_failed"]
    systemd.pending()
    with capture_logs() as logs:
        assert notifier.notify(WATCHDOG="1")
    assert [e["event"] for e in logs] == ["notify_recovered"]
    assert systemd.receive() == {"WATCHDOG": "1"}
    notifier.close()


def test_state_file_follows_the_session_and_is_rewritten_on_tick(tmp_path: Path) -> None:
    clock = Clock()
    monitor = Monitor(tmp_path, clock=clock, environ={}, state_interval=5.0, file_mode=0o640)
    monitor.connected("host=db1 user=rep", "7300000000000000001", 1, "slot1")
    state = read_state(tmp_path)
    assert state is not None
    assert (state.phase, state.server, state.timeline, state.slot) == (
        "connected", "host=db1 user=rep", 1, "slot1"
    )
    assert state.pid == os.getpid()
    assert (tmp_path / ".receivewal-state.json").stat().st_mode & 0o777 == 0o640

    monitor.streaming_started(1, parse_lsn("0/5000000"))
    clock.now += 1
    monitor.received(parse_lsn("0/5100000"), wire_bytes=300, wal_bytes=1000)
    monitor.written(parse_lsn("0/5100000"))
    monitor.flushed(parse_lsn("0/5080000"))
    monitor.keepalive(parse_lsn("0/5200000"))
    monitor.compression("zstd")
    monitor.segment_completed("000000010000000000000005")
    monitor.slot_state("slot1", parse_lsn("0/5000000"))
    monitor.tick(clock.now)  # within state_interval of the last write: not rewritten yet
    state = read_state(tmp_path)
    assert state is not None
    assert state.flushed_lsn is None

    clock.now += 5
    monitor.tick(clock.now)
    state = read_state(tmp_path)
    assert state is not None
    assert state.phase == "streaming"
    assert (state.received_lsn, state.written_lsn, state.flushed_lsn, state.server_wal_end) == (
        parse_lsn("0/5100000"), parse_lsn("0/5100000"), parse_lsn("0/5080000"),
        parse_lsn("0/5200000"),
    )
    assert state.last_contact == clock.now - 5
    assert state.updated_at == clock.now
    assert (state.compression, state.stream_wire_bytes, state.stream_wal_bytes) == (
        "zstd", 300, 1000
    )
    assert (state.wire_bytes, state.wal_bytes) == (300, 1000)
    assert (state.segments_completed, state.last_segment) == (1, "000000010000000000000005")
    assert state.slot_restart_lsn == parse_lsn("0/5000000")

    monitor.error("ConnectionLost", "server closed the connection unexpectedly")
    monitor.disconnected("server closed the connection unexpectedly")
    monitor.reconnecting(1.5)
    state = read_state(tmp_path)
    assert state is not None
    assert (state.phase, state.reconnects) == ("reconnecting", 1)
    assert state.last_error is not None
    assert (state.last_error.kind, state.last_error.message) == (
        "ConnectionLost", "server closed the connection unexpectedly"
    )
    monitor.stopping()
    assert read_state(tmp_path).phase == "stopping"  # type: ignore[union-attr]
    monitor.close()
    assert read_state(tmp_path).phase == "stopped"  # type: ignore[union-attr]


def test_passwords_never_reach_state_or_status(tmp_path: Path) -> None:
    monitor = Monitor(tmp_path, environ={})
    monitor.connected("host=db1 password=s3cret", "1", 1, None)
    monitor.error("ServerError", 'connection to "postgresql://rep:s3cret@db1" failed')
    assert b"s3cret" not in (tmp_path / ".receivewal-state.json").read_bytes()
    monitor.close()


def test_a_failing_state_write_is_logged_once_and_never_raised(tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    monitor = Monitor(missing, environ={}, state_interval=0.0)
    with capture_logs() as logs:
        monitor.connected("host=db1", "1", 1, None)
        monitor.streaming_started(1, 0)
        monitor.tick(1.0)
        missing.mkdir()
        monitor.tick(2.0)
    events = [e["event"] for e in logs]
    assert events == ["state_write_failed", "state_write_recovered"]
    assert read_state(missing) is not None
    monitor.close()


def test_null_monitor_has_no_side_channels_but_keeps_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, systemd: NotifySocket, notify_path: str
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", notify_path)
    monitor = Monitor.null()
    monitor.streaming_started(1, 0)
    monitor.flushed(parse_lsn("0/1000000"))
    monitor.tick(1.0)
    monitor.stopping()
    assert systemd.pending() == []
    assert monitor.metrics_address is None
    assert monitor.snapshot().flushed_lsn == parse_lsn("0/1000000")
    monitor.close()


def test_server_wal_end_is_known_at_connect_and_follows_the_xlogdata_batches() -> None:
    """IDENTIFY_SYSTEM's position, then every batch's walEnd: under load, with no keepalive at
    all, the server's WAL end (and so the lag) is live. A keepalive's lower walEnd (the
    server's sent position) never moves it back."""
    monitor = Monitor.null()
    monitor.connected("host=db1", "1", 1, None, server_wal_end=parse_lsn("0/7000000"))
    assert monitor.snapshot().server_wal_end == parse_lsn("0/7000000")
    monitor.streaming_started(1, parse_lsn("0/5000000"))
    monitor.received(parse_lsn("0/5100000"), 300, 1000, server_wal_end=parse_lsn("0/7200000"))
    monitor.flushed(parse_lsn("0/5000000"))
    assert monitor.snapshot().server_wal_end == parse_lsn("0/7200000")
    assert monitor.metrics._lag() == parse_lsn("0/7200000") - parse_lsn("0/5000000")
    monitor.keepalive(parse_lsn("0/5100000"))
    assert monitor.snapshot().server_wal_end == parse_lsn("0/7200000")
    monitor.close()


def test_slot_restart_lsn_is_the_flush_position_last_reported_to_the_server() -> None:
    """A physical slot's restart_lsn becomes the flush position of our status update; a flush
    not reported (a segment completed between updates) or a zero flush does not move it."""
    monitor = Monitor.null()
    monitor.connected("host=db1", "1", 1, "slot1")
    monitor.slot_state("slot1", parse_lsn("0/1500718"))
    monitor.streaming_started(1, parse_lsn("0/1000000"))
    monitor.flushed(parse_lsn("0/3000000"))
    assert monitor.snapshot().slot_restart_lsn == parse_lsn("0/1500718")
    monitor.flush_reported(parse_lsn("0/3000000"))
    assert monitor.snapshot().slot_restart_lsn == parse_lsn("0/3000000")
    assert monitor.metrics._slots["slot1"][0] == parse_lsn("0/3000000")
    monitor.flush_reported(0)
    assert monitor.snapshot().slot_restart_lsn == parse_lsn("0/3000000")
    monitor.close()


def test_no_slot_no_restart_lsn_from_a_reported_flush() -> None:
    """--synchronous without a slot reports flush positions, but there is no slot to move."""
    monitor = Monitor.null()
    monitor.connected("host=db1", "1", 1, None)
    monitor.flush_reported(parse_lsn("0/3000000"))
    assert monitor.snapshot().slot_restart_lsn is None
    assert monitor.metrics._slots == {}
    monitor.close()


def test_connection_and_since_start_byte_counters_have_one_source() -> None:
    """Both come from the same batches: equal until a reconnect, then this connection's restart
    from zero while the totals go on."""
    monitor = Monitor.null()
    monitor.connected("host=db1", "1", 1, None)
    monitor.streaming_started(1, 0)
    monitor.received(parse_lsn("0/100000"), 300, 1000)
    monitor.received(parse_lsn("0/200000"), 200, 1000)
    state = monitor.snapshot()
    assert (state.stream_wire_bytes, state.stream_wal_bytes) == (500, 2000)
    assert (state.wire_bytes, state.wal_bytes) == (500, 2000)
    monitor.disconnected("gone")
    monitor.reconnecting(1.0)
    monitor.connected("host=db1", "1", 1, None)
    monitor.received(parse_lsn("0/300000"), 100, 1000)
    state = monitor.snapshot()
    assert (state.stream_wire_bytes, state.stream_wal_bytes) == (100, 1000)
    assert (state.wire_bytes, state.wal_bytes) == (600, 3000)
    monitor.close()


def test_an_uncompressed_stream_is_spelled_none_everywhere() -> None:
    """The state says "none", as the log events and the metric do; null only before any WAL."""
    monitor = Monitor.null()
    monitor.connected("host=db1", "1", 1, None)
    assert monitor.snapshot().compression is None
    monitor.compression(None)
    assert monitor.snapshot().compression == "none"
    assert monitor.metrics._algorithm == "none"
    monitor.compression("zstd")
    assert monitor.snapshot().compression == "zstd"
    monitor.close()
