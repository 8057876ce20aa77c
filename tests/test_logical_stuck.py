"""``receivewal logical`` against a stream the server refuses for good, and a slot that would be
left behind, against a real PostgreSQL 15 (one server for the module): the publication
dropped (and created again: PostgreSQL 15 reads it as of the slot's position, where it does
not exist) ends the daemon at once with the server's own words and the exit status the unit
does not restart, and ``status`` says CRITICAL with those words; ``--create-slot`` with a
directory that does not exist creates no slot."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.logical import LOGICAL_CONF
from support.servers import PgServer, running_server
from support.streams import receivewal, start_receivewal, wait_for

from receivewal.daemon.supervisor import EXIT_STAY_DOWN

pytestmark = [pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    """Database app: table t in publication pub1."""
    with running_server(LOGICAL_CONF) as server:
        server.sql("CREATE DATABASE app")
        server.sql("CREATE TABLE t (id int PRIMARY KEY, v text)", "app")
        server.sql("CREATE PUBLICATION pub1 FOR TABLE t", "app")
        yield server


def conninfo(pg: PgServer) -> str:
    return f"host=127.0.0.1 port={pg.port} user=postgres dbname=app"


def slots(pg: PgServer) -> list[str]:
    return pg.sql("SELECT slot_name FROM pg_replication_slots ORDER BY 1").split()


def events(stderr: str) -> list[dict[str, object]]:
    """The JSON log lines of a run."""
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_a_dropped_publication_stops_the_daemon_with_the_servers_words(
        pg: PgServer, tmp_path: Path) -> None:
    """The publication dropped and created again, a row inserted: every start of the stream
    meets ``publication "pub1" does not exist``. The daemon says so (not "server shut
    down?"), does not reconnect, exits with the status the unit's RestartPreventExitStatus
    names, and ``status`` says CRITICAL with the server's words (it used to reconnect every
    few seconds for ever, status OK, the slot holding WAL)."""
    done = receivewal("logical", "-d", conninfo(pg), "-S", "stuck", "--create-slot")
    assert done.returncode == 0, done.stderr[-2000:]
    pg.sql("DROP PUBLICATION pub1", "app")
    pg.sql("INSERT INTO t VALUES (1, 'after the drop')", "app")
    pg.sql("CREATE PUBLICATION pub1 FOR TABLE t", "app")
    out = tmp_path / "log"
    out.mkdir()
    log = tmp_path / "stderr"
    proc = start_receivewal("logical", "-d", conninfo(pg), "-D", str(out), "-S", "stuck",
                            "-P", "pub1", "--log-format", "json", "--reconnect-delay", "0.05",
                            "--reconnect-delay-max", "0.2", stderr_path=log)
    try:
        wait_for(lambda: proc.poll() is not None
                 or log.read_text().count('"event": "reconnecting"') >= 3,
                 timeout=120, what="an exit or three reconnects")
    finally:
        if proc.poll() is None:
            proc.kill()
        code = proc.wait(timeout=30)
    stderr = log.read_text()
    said = events(stderr)
    assert [e["event"] for e in said if e["event"] == "reconnecting"] == [], stderr[-3000:]
    assert code == EXIT_STAY_DOWN, stderr[-3000:]
    (failed,) = [e for e in said if e["event"] == "failed"]
    assert 'publication "pub1" does not exist' in str(failed["error"]), failed
    assert "server shut down?" not in stderr
    assert "Traceback" not in stderr
    status = receivewal("status", "-D", str(out))
    assert status.returncode == 2, status.stdout
    assert status.stdout.startswith("RECEIVEWAL CRITICAL - not running"), status.stdout
    assert 'publication "pub1" does not exist' in status.stdout, status.stdout
    pg.sql("SELECT pg_drop_replication_slot('stuck')")


def test_create_slot_with_a_missing_directory_creates_no_slot(
        pg: PgServer, tmp_path: Path) -> None:
    """``--create-slot -D`` naming a directory that does not exist: one line naming it, exit
    1, and no slot on the server (it used to create the slot, then fail on the directory,
    leaving a slot that holds WAL)."""
    missing = tmp_path / "nowhere"
    before = slots(pg)
    done = receivewal("logical", "-d", conninfo(pg), "-D", str(missing), "-S", "orphan",
                      "-P", "pub1", "--create-slot")
    assert done.returncode == 1, done.stderr[-2000:]
    assert str(missing) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert slots(pg) == before
    assert not missing.exists()


def test_create_slot_with_the_directory_there_creates_it(
        pg: PgServer, tmp_path: Path) -> None:
    """The same command with the directory there creates the slot and exits 0."""
    done = receivewal("logical", "-d", conninfo(pg), "-D", str(tmp_path), "-S", "made",
                      "-P", "pub1", "--create-slot")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "made" in slots(pg)
    pg.sql("SELECT pg_drop_replication_slot('made')")
