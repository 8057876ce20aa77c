"""Bad input gets one clear error line and a non-zero exit code.

The cases refused before any connection run the command in this process
(support.streams.receivewal_here: the same exit code, the same standard error); the ones that
reach for a server, and the one that must show no secret, run it as the operator would, as a
process of its own (the subprocess smoke tests of ``stream``'s exits)."""

from __future__ import annotations

import json
import select
import socket
import struct
import subprocess
import threading
from pathlib import Path

import pytest
from support.servers import IS_ROOT, PgServer, free_port, pg_bin
from support.streams import receivewal, receivewal_here, start_receivewal, stop, wait_for


def error_line(stderr: str) -> str:
    """The one error line (plain, or the JSON log event's error field)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    line = lines[0]
    if line.startswith("{"):
        event = json.loads(line)
        assert event["level"] == "error"
        return str(event["error"])
    return line


def test_missing_directory_option() -> None:
    """No -D at all."""
    done = receivewal_here("stream", "-d", "host=127.0.0.1")
    assert done.returncode == 1
    assert "no target directory specified" in error_line(done.stderr)


def test_directory_that_does_not_exist(tmp_path: Path) -> None:
    """-D names a directory that is not there."""
    done = receivewal_here("stream", "-D", str(tmp_path / "nope"), "-d", "host=127.0.0.1")
    assert done.returncode == 1
    assert "does not exist" in error_line(done.stderr)


def test_directory_not_writable(tmp_path: Path) -> None:
    """-D names a directory we cannot create files in."""
    target = tmp_path / "ro"
    target.mkdir()
    if IS_ROOT:  # root ignores permission bits: make the directory immutable instead
        subprocess.run(["chattr", "+i", str(target)], check=True)
    else:
        target.chmod(0o555)
    try:
        done = receivewal_here("stream", "-D", str(target), "-d", "host=127.0.0.1")
    finally:
        if IS_ROOT:
            subprocess.run(["chattr", "-i", str(target)], check=True)
    assert done.returncode == 1
    assert "is not writable" in error_line(done.stderr)


def test_unreachable_server(archive_dir: Path) -> None:
    """Nothing listens on the port: exit 1 at once, even without --no-loop."""
    done = receivewal("stream", "-D", str(archive_dir), "-h", "127.0.0.1",
                      "-p", str(free_port()), "-U", "postgres", timeout=30)
    assert done.returncode == 1
    assert "Connection refused" in error_line(done.stderr)


def test_bad_endpos(archive_dir: Path) -> None:
    """--endpos that is not an LSN."""
    done = receivewal_here("stream", "-D", str(archive_dir), "-E", "banana")
    assert done.returncode == 1
    assert "invalid LSN 'banana'" in error_line(done.stderr)


def test_synchronous_with_no_sync(archive_dir: Path) -> None:
    """--synchronous and --no-sync contradict each other."""
    done = receivewal_here("stream", "-D", str(archive_dir), "--synchronous", "--no-sync")
    assert done.returncode == 1
    assert "cannot use --synchronous together with --no-sync" in error_line(done.stderr)


def test_bad_compression_list(archive_dir: Path) -> None:
    """An algorithm the server would refuse is caught before connecting."""
    done = receivewal_here("stream", "-D", str(archive_dir), "--compression", "gzip")
    assert done.returncode == 1
    assert "gzip" in error_line(done.stderr)


@pytest.mark.shared_server
@pytest.mark.server
def test_database_specific_connection_is_still_physical(pg: PgServer, archive_dir: Path) -> None:
    """replication=database in -d is overridden: the stream stays physical and works."""
    pg.generate_wal(1)
    done = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn + " replication=database",
                      "-E", pg.mid_segment_lsn(), "-n")
    assert done.returncode == 0, done.stderr
    assert any(p.name.endswith(".partial") for p in archive_dir.iterdir())


def test_password_never_logged(archive_dir: Path) -> None:
    """A password in the connection string does not reach the error output."""
    done = receivewal("stream", "-D", str(archive_dir), "-v", "-d",
                      f"host=127.0.0.1 port={free_port()} user=x password=sekrit-42")
    assert done.returncode == 1
    assert "sekrit-42" not in done.stderr


@pytest.mark.server
def test_password_authentication(server_base: Path, archive_dir: Path) -> None:
    """-w never prompts: a server that wants a password refuses us with libpq's reason;
    PGPASSWORD (or a passfile) is how a service supplies one, and it is never logged."""
    server = PgServer(server_base, "scram")
    server.init()
    hba = server.datadir / "pg_hba.conf"
    hba.write_text("local all all trust\n"
                   "host all all 127.0.0.1/32 scram-sha-256\n"
                   "host replication all 127.0.0.1/32 scram-sha-256\n")
    server.start()
    try:
        subprocess.run(["psql", "-X", "-h", str(server.sockdir), "-p", str(server.port),
                        "-U", "postgres", "-c", "ALTER USER postgres PASSWORD 'pw-7781'"],
                       check=True, capture_output=True,
                       env={"PATH": str(Path(pg_bin("psql")).parent)})
        dsn = f"host=127.0.0.1 port={server.port} user=postgres"
        refused = receivewal("stream", "-D", str(archive_dir), "-d", dsn, "-w", "-n")
        assert refused.returncode == 1
        assert "password" in error_line(refused.stderr)
        done = receivewal("stream", "-D", str(archive_dir), "-d", dsn, "-n", "-v",
                          "-E", "0/1000100", env={"PGPASSWORD": "pw-7781"})
        assert done.returncode == 0, done.stderr
        assert "pw-7781" not in done.stderr
    finally:
        server.stop("immediate")


# -- a server that accepts and then says nothing -----------------------------------------------


class SilentServer:
    """A TCP listener that accepts connections and never answers, or (``handshake``) that
    completes the startup handshake and then ignores every command."""

    def __init__(self, handshake: bool = False) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.handshake = handshake
        self.accepted = threading.Event()
        self.clients: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        client, _ = self.listener.accept()
        self.clients.append(client)
        self.accepted.set()
        if not self.handshake:
            return
        while True:  # SSL / GSS requests get "N", then the startup packet
            length, code = struct.unpack(">II", client.recv(8, socket.MSG_WAITALL))
            client.recv(length - 8, socket.MSG_WAITALL)
            if code not in (80877103, 80877104):
                break
            client.sendall(b"N")
        version = b"server_version\x0015.0\x00"
        client.sendall(b"R" + struct.pack(">II", 8, 0)
                       + b"S" + struct.pack(">I", 4 + len(version)) + version
                       + b"Z" + struct.pack(">I", 5) + b"I")

    def client_sent(self) -> bool:
        """The accepted client has sent bytes (its first packet) that nobody read."""
        return bool(self.clients) and bool(select.select(self.clients[:1], [], [], 0)[0])

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.listener.close()


def test_stop_signal_during_a_connect_the_server_never_answers(archive_dir: Path) -> None:
    """A server that accepts TCP but never answers: SIGTERM during the connect ends the
    process with exit 0 (the 10 s bound only guards against a hang)."""
    server = SilentServer()
    proc = start_receivewal("stream", "-D", str(archive_dir), "-h", "127.0.0.1",
                            "-p", str(server.port), "-U", "postgres", "--receive-timeout", "0")
    try:
        assert server.accepted.wait(30), "receivewal never connected"
        # its first packet sent, it waits for the server's answer
        wait_for(server.client_sent, timeout=30, what="receivewal's first packet")
        assert stop(proc, timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.close()


def test_receive_timeout_fires_during_a_command_the_server_never_answers(
        archive_dir: Path) -> None:
    """The server completes the handshake, then ignores IDENTIFY_SYSTEM: --receive-timeout
    ends the wait with one error line naming it (exit 1 with --no-loop)."""
    server = SilentServer(handshake=True)
    try:
        done = receivewal("stream", "-D", str(archive_dir), "-n", "--receive-timeout", "1",
                          "-d", f"host=127.0.0.1 port={server.port} user=postgres "
                          "sslmode=disable gssencmode=disable", timeout=60)
    finally:
        server.close()
    assert done.returncode == 1
    line = error_line(done.stderr)
    assert "IDENTIFY_SYSTEM" in line
    assert "receive timeout 1s" in line
