"""Barman, installed from PyPI, runs the drop-in as its pg_receivewal: streaming, check,
switch-wal --archive, backup and recover, against a real server."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from support.barman import SERVER, Barman
from support.servers import IS_ROOT, PgServer
from support.streams import wait_for

pytestmark = [pytest.mark.server, pytest.mark.slow]


def test_barman_streams_backs_up_and_recovers_with_the_dropin(
        pg: PgServer, server_base: Path, tmp_path: Path) -> None:
    """receive-wal streams through the drop-in, check passes, switch-wal --archive archives a
    segment, backup completes and recover gives a data directory that starts with the data."""
    if shutil.which("rsync") is None:  # Barman copies backups with rsync (its packages need it)
        pytest.fail("barman recover needs rsync: install it (apt-get install rsync)")
    barman = Barman(tmp_path / "barman", pg)
    pg.sql("CREATE TABLE accounts (id int PRIMARY KEY, balance numeric)")
    pg.sql("INSERT INTO accounts SELECT g, g * 2.5 FROM generate_series(1, 30000) g")

    created = barman.run("receive-wal", "--create-slot", SERVER)
    assert created.returncode == 0, created.stdout + created.stderr
    assert pg.sql("SELECT slot_type FROM pg_replication_slots WHERE slot_name = 'barman'") \
        == "physical"

    receive_log = tmp_path / "receive-wal.log"
    receiver = barman.start("receive-wal", SERVER, output=receive_log)
    try:
        wait_for(lambda: pg.sql("SELECT application_name FROM pg_stat_replication")
                 == "barman_receive_wal", timeout=60, what="barman receive-wal to stream")
        # it is our drop-in that streams: only receivewal writes its identity file
        wait_for((barman.streaming_dir / ".receivewal-archive.json").exists,
                 what="the drop-in's identity file")
        shown = barman.run("show-servers", SERVER)
        assert f"pg_receivexlog_path: {barman.bin / 'pg_receivewal'}" in shown.stdout
        assert "pg_receivexlog_version: 15.18" in shown.stdout

        switched = barman.run_while_writing(pg, "switch-wal", "--force", "--archive",
                                            "--archive-timeout", "60", SERVER)
        assert switched.returncode == 0, switched.stdout + switched.stderr
        archived = sorted(p.name for p in barman.wals_dir.rglob("0*"))
        assert archived, switched.stdout

        check = barman.run("check", SERVER)
        assert check.returncode == 0, check.stdout + check.stderr
        assert "FAILED" not in check.stdout
        for item in ("pg_receivexlog: OK", "pg_receivexlog compatible: OK",
                     "receive-wal running: OK", "replication slot: OK"):
            assert item in check.stdout, check.stdout

        backup = barman.run("backup", "--wait", "--wait-timeout", "120", SERVER)
        assert backup.returncode == 0, backup.stdout + backup.stderr
        listed = barman.run("list-backups", SERVER)
        assert listed.returncode == 0
        assert "WAITING" not in listed.stdout
        assert "FAILED" not in listed.stdout
        assert len(listed.stdout.strip().splitlines()) == 1, listed.stdout
        pg.sql("INSERT INTO accounts SELECT g, 1 FROM generate_series(30001, 31000) g")
        switched = barman.run_while_writing(pg, "switch-wal", "--force", "--archive",
                                            "--archive-timeout", "60", SERVER)
        assert switched.returncode == 0, switched.stdout + switched.stderr
    finally:
        receiver.send_signal(signal.SIGINT)
        try:
            receiver.wait(timeout=30)
        except subprocess.TimeoutExpired:
            receiver.kill()
            receiver.wait()
    errors = barman.home / SERVER / "errors"
    assert not errors.exists() or not list(errors.iterdir())  # nothing Barman did not know
    log = receive_log.read_text()
    assert "pg_receivewal: starting log streaming at" in log, log
    assert "pg_receivewal: finished segment at" in log, log
    expected = pg.sql("SELECT count(*), sum(balance) FROM accounts")

    restored = PgServer(server_base, "recovered")
    recover = barman.run("recover", SERVER, "latest", str(restored.datadir))
    assert recover.returncode == 0, recover.stdout + recover.stderr
    if IS_ROOT:
        shutil.chown(restored.datadir, "postgres", "postgres")
        for path in restored.datadir.rglob("*"):
            shutil.chown(path, "postgres", "postgres")
    restored._mkdirs()
    restored.configure({})  # its own port and socket directory
    restored.start_or_fail()
    try:
        wait_for(lambda: restored.sql("SELECT pg_is_in_recovery()") == "f", timeout=120,
                 what="recovery to finish")
        assert restored.sql("SELECT count(*), sum(balance) FROM accounts") == expected
    finally:
        restored.stop("immediate")
