"""The archive's whole life while the daemon streams, against a real PostgreSQL 15 (issue 28
§3): a base backup taken into the archive the daemon writes; ``status`` and the metrics show
the oldest recoverable point and the archive's size; ``cleanup`` run beside the daemon removes
the WAL before the backup, and the daemon streams on."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.backups import replication_link
from support.scrape import scrape
from support.servers import PgServer, free_port
from support.streams import start_receivewal, stop, wait_for

from receivewal.backup.backupdir import BACKUPS
from receivewal.backup.command import BackupRequest
from receivewal.backup.record import utc_text
from receivewal.backup.transfer import take_backup
from receivewal.replication.commands import identify_server
from receivewal.retention.removal import backup_bytes
from receivewal.wal.lsn import format_lsn, parse_lsn

pytestmark = pytest.mark.server


@pytest.fixture
def small_segments(server_base: Path) -> Iterator[PgServer]:
    server = PgServer(server_base, "primary")
    server.init(initdb_args=("--wal-segsize=1",))
    server.start()
    yield server
    server.stop("immediate")



def receivewal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "receivewal", *args], capture_output=True,
                          text=True, check=False, timeout=60)


def switch_segments(pg: PgServer, count: int) -> None:
    pg.sql("CREATE TABLE IF NOT EXISTS t (x int)")
    for _ in range(count):
        pg.sql("INSERT INTO t VALUES (1)")
        pg.sql("SELECT pg_switch_wal()")


def test_status_metrics_and_cleanup_beside_the_daemon(small_segments: PgServer,
                                                      archive_dir: Path, tmp_path: Path) -> None:
    pg = small_segments
    pg.sql("SELECT pg_create_physical_replication_slot('rw', true)")
    port = free_port()
    log = tmp_path / "log"
    env = {"RECEIVEWAL_STATUS_INTERVAL": "1", "RECEIVEWAL_METRICS_ADDRESS": f"127.0.0.1:{port}",
           "RECEIVEWAL_ARCHIVE_MEASURE_SECONDS": "0.3"}
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "rw",
                            env=env, stderr_path=log)
    try:
        wait_for(lambda: '"phase": "streaming"' in receivewal("status", "-D", str(archive_dir),
                                                              "--json").stdout,
                 what="streaming")
        wait_for(lambda: "receivewal_archive_wal_bytes" in scrape(port), what="a measure")
        assert math.isnan(scrape(port)["receivewal_oldest_recoverable_lsn"])
        assert scrape(port)["receivewal_archive_backups"] == 0
        switch_segments(pg, 3)
        with replication_link(pg) as conn:
            record = take_backup(conn, BackupRequest(label="beside", fast=True), archive_dir,
                                 identify_server(conn), sync=False)
        switch_segments(pg, 2)
        wait_for(lambda: all((archive_dir / name).exists() for name in record.wal_segments()),
                 what="the backup's WAL in the archive")

        def measured() -> bool:
            return scrape(port)["receivewal_oldest_recoverable_lsn"] == record.start_lsn
        wait_for(measured, what="the oldest recoverable point in the metrics")
        metrics = scrape(port)
        assert metrics["receivewal_oldest_recoverable_timestamp_seconds"] == \
            record.start_time.timestamp()
        assert metrics["receivewal_archive_backups"] == 1
        assert metrics["receivewal_archive_backup_bytes"] == \
            backup_bytes(archive_dir / BACKUPS / record.backup_id)
        assert metrics["receivewal_archive_wal_bytes"] >= 4 << 20  # 3 switched + the backup's

        shown = receivewal("status", "-D", str(archive_dir))
        assert shown.returncode == 0, shown.stdout
        lines = shown.stdout.splitlines()
        assert f"oldest recoverable: {format_lsn(record.start_lsn)} on timeline 1, " \
               f"{utc_text(record.start_time)} (backup {record.backup_id})" in lines
        size = next(line for line in lines if line.startswith("archive size:"))
        assert ", 1 backups " in size
        document = json.loads(receivewal("status", "-D", str(archive_dir), "--json").stdout)
        assert document["archive"]["oldest_recoverable"] == {
            "backup_id": record.backup_id, "lsn": format_lsn(record.start_lsn), "timeline": 1,
            "time": utc_text(record.start_time)}
        assert document["archive"]["backup_bytes"] == metrics["receivewal_archive_backup_bytes"]

        def slot_past_backup() -> bool:
            state = json.loads(receivewal("status", "-D", str(archive_dir), "--json").stdout)
            restart = state["state"]["slot_restart_lsn"]
            return restart is not None and parse_lsn(restart) > record.start_lsn
        # the state file (rewritten every 5 s) says where the slot restarts: past the backup
        wait_for(slot_past_backup, what="the slot's restart position past the backup's start")
        before = sorted(p.name for p in archive_dir.iterdir()
                        if len(p.name) == 24 and not p.name.startswith("."))
        done = receivewal("cleanup", "-D", str(archive_dir), "--keep-backups", "1")
        assert done.returncode == 0, done.stderr
        first = record.wal_segments()[0]
        gone = [name for name in before if not (archive_dir / name).exists()]
        assert gone == [name for name in before if name < first]
        assert len(gone) >= 3
        assert f"{gone[0]} .. {gone[-1]} ({len(gone)} files): removed: needed by no kept " \
               "backup" in done.stdout
        assert all((archive_dir / name).exists() for name in record.wal_segments())
        switch_segments(pg, 2)
        flushed = pg.current_lsn()
        wait_for(lambda: _flushed_past(archive_dir, flushed), what="streaming on")
        assert receivewal("status", "-D", str(archive_dir)).returncode == 0
    finally:
        assert stop(proc, signal.SIGTERM) == 0, log.read_text()


def _flushed_past(archive: Path, lsn: str) -> bool:
    state = json.loads(receivewal("status", "-D", str(archive), "--json").stdout)["state"]
    flushed = state["flushed_lsn"]
    return flushed is not None and parse_lsn(flushed) >= parse_lsn(lsn)
