"""``status`` and the metrics of a sealed archive directory, against a real PostgreSQL 15:
``stream --encrypt-to`` seals every completed segment (one file, ``F.FINGERPRINT.age``, named
for its recipient set) and ``backup --encrypt-to`` puts a sealed backup beside them; ``status``
(text and ``--json``) and the daemon's metrics count the sealed segments as the WAL files they
are and give the backup's start as the oldest recoverable point."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.agekeys import age_keygen
from support.scrape import scrape
from support.servers import PgServer, free_port
from support.streams import receivewal, start_streaming, stop, wait_for

from receivewal.archive.recipients import recipient_set
from receivewal.backup.catalog import read_catalog
from receivewal.backup.record import BackupRecord, utc_text
from receivewal.wal.lsn import format_lsn
from receivewal.wal.names import ENCRYPTED_SUFFIX, RECIPIENTS_SUFFIX, encrypted_file_name

pytestmark = pytest.mark.server


@pytest.fixture
def small_segments(server_base: Path) -> Iterator[PgServer]:
    server = PgServer(server_base, "primary")
    server.init(initdb_args=("--wal-segsize=1",))
    server.start()
    yield server
    server.stop("immediate")



def switch_segments(pg: PgServer, count: int) -> None:
    pg.sql("CREATE TABLE IF NOT EXISTS t (x int)")
    for _ in range(count):
        pg.sql("INSERT INTO t VALUES (1)")
        pg.sql("SELECT pg_switch_wal()")


def the_backup(archive: Path, backup_id: str) -> BackupRecord:
    (record,) = [e.record for e in read_catalog(archive)
                 if e.backup_id == backup_id and e.record is not None]
    return record


def test_status_and_metrics_count_sealed_wal_and_its_oldest_recoverable_point(
        small_segments: PgServer, archive_dir: Path, tmp_path: Path) -> None:
    """A sealed archive with a sealed local backup whose WAL is all there: ``status`` says
    how many sealed segments and their bytes (recipients files too) and the backup's start
    as the oldest recoverable point, ``--json`` the same, and the metrics too (they said 0
    WAL files and none: only plain names were counted)."""
    pg = small_segments
    key = age_keygen(tmp_path / "key.txt")
    port = free_port()
    env = {"RECEIVEWAL_METRICS_ADDRESS": f"127.0.0.1:{port}",
           "RECEIVEWAL_ARCHIVE_MEASURE_SECONDS": "0.3"}
    proc: subprocess.Popen[bytes] | None = start_streaming(
        "-D", str(archive_dir), "-d", pg.dsn, "--encrypt-to", key.recipient,
        log=tmp_path / "log", env=env)
    try:
        switch_segments(pg, 2)
        done = receivewal("backup", "-D", str(archive_dir), "-d", pg.dsn, "--fast",
                          "--encrypt-to", key.recipient, timeout=180)
        assert done.returncode == 0, done.stderr
        backup_id = done.stdout.split()[1]
        record = the_backup(archive_dir, backup_id)
        switch_segments(pg, 2)
        fingerprint = recipient_set([key.recipient]).fingerprint
        wait_for(lambda: all((archive_dir / encrypted_file_name(name, fingerprint)).exists()
                             for name in record.wal_segments()),
                 what="the backup's WAL sealed in the archive")
        verified = receivewal("verify", "--identity", str(key.path), str(archive_dir),
                              timeout=180)
        assert f"backup {backup_id}: verified: " in verified.stdout, \
            verified.stdout + verified.stderr

        sealed = sorted(p for p in archive_dir.iterdir() if p.name.endswith(ENCRYPTED_SUFFIX))
        assert len(sealed) >= 4
        assert not [p for p in archive_dir.iterdir()
                    if len(p.name) == 24 and not p.name.startswith(".")]  # nothing plain

        def measured() -> bool:
            return scrape(port)["receivewal_oldest_recoverable_lsn"] == record.start_lsn
        wait_for(measured, what="the oldest recoverable point in the metrics")
        held = sum(p.stat().st_size for p in sealed)
        # the meter measures every few seconds: a segment sealed after its last pass counts
        # at the next (under load that can be after the oldest point was seen)
        wait_for(lambda: scrape(port)["receivewal_archive_wal_bytes"] >= held,
                 what="the sealed WAL's bytes in the metrics")
        assert proc is not None
        stop(proc)
        proc = None

        files = sorted(archive_dir.iterdir())
        sealed = [p for p in files if p.name.endswith(ENCRYPTED_SUFFIX)]
        partial = [p for p in files if p.name.endswith(".partial")]
        recipients = [p for p in files if p.name.endswith(RECIPIENTS_SUFFIX)]
        assert recipients == []  # one file per sealed segment, named for its set
        wal_bytes = sum(p.stat().st_size for p in [*sealed, *partial, *recipients])
        shown = receivewal("status", "-D", str(archive_dir))
        lines = shown.stdout.splitlines()
        assert f"oldest recoverable: {format_lsn(record.start_lsn)} on timeline 1, " \
               f"{utc_text(record.start_time)} (backup {backup_id})" in lines, shown.stdout
        size = next(line for line in lines if line.startswith("archive size:"))
        assert f": {len(sealed) + len(partial)} WAL files " in size, size
        document = json.loads(receivewal("status", "-D", str(archive_dir), "--json").stdout)
        archive = document["archive"]
        assert archive["wal_files"] == len(sealed) + len(partial)
        assert archive["wal_bytes"] == wal_bytes
        assert archive["oldest_recoverable"] == {
            "backup_id": backup_id, "lsn": format_lsn(record.start_lsn), "timeline": 1,
            "time": utc_text(record.start_time)}
    finally:
        if proc is not None:
            stop(proc)
