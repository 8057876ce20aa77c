"""Faults against real servers: restarts, cut and stalled connections, a full disk.

After each fault the archive must be byte-identical to the server's files with no gap, the logs
must say what happened, and ``receivewal status`` must report it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.archives import assert_consecutive
from support.servers import IS_ROOT, PgServer
from support.streams import (
    assert_identical_to_server,
    complete_segments,
    lsn_to_int,
    receivewal,
    start_receivewal,
    stop,
    wait_for,
)
from support.tcpproxy import TcpProxy

pytestmark = [pytest.mark.server, pytest.mark.slow]

FAST_RETRY = ("--reconnect-delay", "0.2", "--reconnect-delay-max", "1", "-s", "0.3")


def flushed(pg: PgServer) -> int:
    """The receiver's flush position as the server sees it (0 when not connected)."""
    value = pg.sql("SELECT flush_lsn FROM pg_stat_replication")
    return lsn_to_int(value) if value else 0


def finish_and_compare(pg: PgServer, archive: Path, proc: object, log: Path) -> list[str]:
    """Wait for the receiver to flush everything, stop it, compare the archive."""
    pg.sql("CREATE TABLE IF NOT EXISTS tail (x int)")
    pg.sql("INSERT INTO tail VALUES (1)")
    target = lsn_to_int(pg.current_lsn())
    wait_for(lambda: flushed(pg) >= target, timeout=60, what="the receiver to catch up")
    assert stop(proc) == 0  # type: ignore[arg-type]
    names = assert_identical_to_server(archive, pg)
    assert_consecutive(names)
    return names


def status(archive: Path) -> dict[str, object]:
    """The state part of ``receivewal status --json``."""
    done = receivewal("status", "-D", str(archive), "--json")
    return json.loads(done.stdout)["state"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_server_restart_while_streaming(pg: PgServer, archive_dir: Path, tmp_path: Path,
                                        mode: str) -> None:
    """The server restarts (fast or immediate): reconnect, continue, nothing lost."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    log = tmp_path / "log"
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                            *FAST_RETRY, stderr_path=log)
    pg.generate_wal(2)
    wait_for(lambda: len(complete_segments(archive_dir)) >= 2, what="first segments")
    pg.restart(mode)
    pg.generate_wal(2)
    names = finish_and_compare(pg, archive_dir, proc, log)
    assert len(names) >= 4
    text = log.read_text()
    assert '"disconnected"' in text
    assert '"reconnecting"' in text
    assert text.count('"streaming_started"') >= 2
    assert status(archive_dir)["reconnects"] >= 1  # type: ignore[operator]


def test_connection_cut_by_the_network(pg: PgServer, archive_dir: Path, tmp_path: Path) -> None:
    """A proxy in between drops the TCP connection: reconnect through it, nothing lost."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    proxy = TcpProxy(pg.port)
    log = tmp_path / "log"
    try:
        proc = start_receivewal("stream", "-D", str(archive_dir), "-d",
                                f"host=127.0.0.1 port={proxy.port} user=postgres",
                                "-S", "arch", *FAST_RETRY, stderr_path=log)
        pg.generate_wal(1)
        wait_for(lambda: len(complete_segments(archive_dir)) >= 1, what="first segment")
        proxy.cut()
        pg.generate_wal(2)
        wait_for(lambda: proxy.accepted >= 2, what="a new connection through the proxy")
        finish_and_compare(pg, archive_dir, proc, log)
    finally:
        proxy.close()
    assert '"disconnected"' in log.read_text()


def test_network_stall_fires_the_receive_timeout(pg: PgServer, archive_dir: Path,
                                                 tmp_path: Path) -> None:
    """Nothing arrives: ping at half the timeout, drop at the full one, reconnect after."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    proxy = TcpProxy(pg.port)
    log = tmp_path / "log"
    try:
        proc = start_receivewal("stream", "-D", str(archive_dir), "-d",
                                f"host=127.0.0.1 port={proxy.port} user=postgres",
                                "-S", "arch", "--receive-timeout", "2", *FAST_RETRY,
                                stderr_path=log)
        pg.generate_wal(1)
        wait_for(lambda: len(complete_segments(archive_dir)) >= 1, what="first segment")
        proxy.stall()
        wait_for(lambda: "receive timeout" in log.read_text(), timeout=20,
                 what="the receive timeout")
        assert '"server_silent"' in log.read_text()
        last_error = status(archive_dir)["last_error"]
        assert "receive timeout" in json.dumps(last_error)
        proxy.resume()
        pg.generate_wal(1)
        finish_and_compare(pg, archive_dir, proc, log)
    finally:
        proxy.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 100 MB tmpfs mounted for the archive (needs root to mount)."""
    if not IS_ROOT:
        pytest.skip("mounting a small tmpfs to fill the disk needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=100m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_full_disk_waits_and_resumes_when_space_returns(pg: PgServer, small_disk: Path,
                                                        tmp_path: Path) -> None:
    """ENOSPC: log it, report nothing past what is durable, retry, resume when space returns."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    archive = small_disk / "archive"
    archive.mkdir()
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (78 << 20))  # leaves room for one segment, not two
    log = tmp_path / "log"
    proc = start_receivewal("stream", "-D", str(archive), "-d", pg.dsn, "-S", "arch",
                            *FAST_RETRY, stderr_path=log)
    pg.generate_wal(3)
    wait_for(lambda: '"disk_full"' in log.read_text(), timeout=30, what="disk full")
    last_error = status(archive)["last_error"]
    assert isinstance(last_error, dict)
    assert last_error["kind"] == "disk_full"
    # nothing past what is durable is reported: the slot stays within the archive
    restart = lsn_to_int(pg.sql("SELECT restart_lsn FROM pg_replication_slots"))
    held = complete_segments(archive)
    assert len(held) == 1, "one segment fits before the disk is full"
    end_of_archive = (int(held[-1][16:24], 16) + 1) << 24
    assert restart <= end_of_archive
    assert not [n for n in archive.iterdir() if n.name.endswith(".partial")
                and n.stat().st_size not in (0, 16 << 20)]
    filler.unlink()
    names = finish_and_compare(pg, archive, proc, log)
    assert len(names) >= 3
