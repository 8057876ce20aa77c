"""--wait-for-server: as a service, an unreachable server at start is waited for, not fatal."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.servers import PgServer
from support.streams import start_receivewal, wait_for

pytestmark = pytest.mark.server


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[socket.socket]:
    """A datagram socket standing in for systemd's NOTIFY_SOCKET."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(0.5)
    yield sock
    sock.close()


def receive_until(sock: socket.socket, wanted: str, timeout: float = 60) -> list[str]:
    """Notification datagrams until one contains ``wanted``; all of them, in order."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            seen.append(sock.recv(4096).decode())
        except TimeoutError:
            continue
        if wanted in seen[-1]:
            return seen
    raise AssertionError(f"no notification with {wanted!r} in {timeout}s: {seen}")


def test_first_connection_is_retried_until_the_server_is_up(
        server_base: Path, archive_dir: Path, tmp_path: Path,
        notify_socket: socket.socket) -> None:
    """With --wait-for-server a refused first connection does not exit 1: STATUS says
    "Waiting for server: <libpq's reason>", and READY=1 comes once the server is up and
    streaming starts; SIGTERM while streaming still exits 0."""
    server = PgServer(server_base, "late")
    server.init()
    log = tmp_path / "receivewal.log"
    proc = start_receivewal(
        "stream", "-D", str(archive_dir), "-d",
        f"host=127.0.0.1 port={server.port} user=postgres", "--wait-for-server",
        "--reconnect-delay", "0.2", "--reconnect-delay-max", "0.5", "--log-format", "json",
        env={"NOTIFY_SOCKET": str(tmp_path / "notify")}, stderr_path=log)
    try:
        waiting = receive_until(notify_socket, "STATUS=Waiting for server:")
        assert "Connection refused" in waiting[-1]
        assert not any("READY=1" in message for message in waiting)
        wait_for(lambda: log.read_text().count('"event": "waiting_for_server"') >= 2,
                 what="a second attempt")
        assert proc.poll() is None, log.read_text()
        server.start()
        ready = receive_until(notify_socket, "READY=1")
        assert "STATUS=Streaming timeline 1 from " in ready[-1]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        server.stop("immediate")
    assert code == 0, log.read_text()


def test_sigterm_while_waiting_exits_0(archive_dir: Path, tmp_path: Path,
                                        notify_socket: socket.socket) -> None:
    """Stopping the service while it waits for the server is a clean stop (exit 0)."""
    port = PgServer(tmp_path, "none").port
    log = tmp_path / "receivewal.log"
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d",
                            f"host=127.0.0.1 port={port} user=postgres", "--wait-for-server",
                            env={"NOTIFY_SOCKET": str(tmp_path / "notify")}, stderr_path=log)
    receive_until(notify_socket, "STATUS=Waiting for server:")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, log.read_text()
    assert "STOPPING=1" in receive_until(notify_socket, "STOPPING=1")[-1]


def test_without_the_option_the_first_connection_failing_exits_1(
        archive_dir: Path, tmp_path: Path) -> None:
    """pg_receivewal's rule stays the CLI default: the first connection failing exits 1."""
    port = PgServer(tmp_path, "none").port
    log = tmp_path / "receivewal.log"
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d",
                            f"host=127.0.0.1 port={port} user=postgres", stderr_path=log)
    assert proc.wait(timeout=30) == 1
    assert "Connection refused" in log.read_text()
