"""Interrupted backups are reported, not ignored (issue 31 item 9): a ``receivewal backup``
SIGKILLed while it writes leaves a directory without a record that uses disk until ``cleanup``
removes it. ``status`` (text and ``--json``) names it with its size, and ``verify``'s backups
part says it is interrupted, without making the archive "NOT recoverable": the archive and its
complete backup still are. Against a real PostgreSQL 15 and the ``stream`` daemon."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.servers import PgServer, make_shared_dir
from support.streams import RECEIVEWAL, receivewal, start_streaming, stop, wait_for

from receivewal.backup.catalog import EntryState, read_entry, tree_bytes

pytestmark = pytest.mark.server


@dataclass
class World:
    archive: Path
    complete: str  # the complete backup's ID
    killed: str  # the SIGKILLed backup's ID
    killed_bytes: int


def backup_id_of(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert " complete: " in first, done.stdout
    return first.split()[1]


def started(archive: Path, known: str) -> str | None:
    """The backup other than ``known`` whose directory holds some bytes, if any."""
    backups = archive / "backups"
    for path in backups.iterdir() if backups.is_dir() else ():
        if path.name != known and tree_bytes(path) > 0:
            return path.name
    return None


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    base = make_shared_dir("receivewal-interrupted-")
    pg = PgServer(base, "primary")
    streamer = None
    try:
        pg.init(initdb_args=("--wal-segsize=1",))
        pg.start()
        pg.sql("CREATE TABLE filler AS SELECT g AS id, repeat('x', 200) AS pad "
               "FROM generate_series(1, 20000) g")
        archive = base / "archive"
        archive.mkdir()
        streamer = start_streaming("-D", str(archive), "-d", pg.dsn, log=base / "stream.log")
        complete = backup_id_of(receivewal("backup", "-D", str(archive), "-d", pg.dsn, "--fast",
                                           timeout=180))
        proc = subprocess.Popen([*RECEIVEWAL, "backup", "-D", str(archive), "-d", pg.dsn,
                                 "--fast", "--max-rate", "32"], env=dict(os.environ),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: started(archive, complete) is not None, timeout=120,
                     what="the throttled backup to store its first bytes")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        killed = started(archive, complete)
        assert killed is not None
        assert read_entry(archive / "backups" / killed).state is EntryState.INTERRUPTED
        size = tree_bytes(archive / "backups" / killed)
        assert size > 0
        yield World(archive, complete, killed, size)
    finally:
        if streamer is not None:
            stop(streamer)
        pg.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def test_status_names_the_interrupted_backup_and_its_size(world: World) -> None:
    """``status`` text: a line with the count, the size and the ID; ``--json``: each one's ID
    and bytes, and their sum. The verdict is the daemon's (it streams: OK)."""
    text = receivewal("status", "-D", str(world.archive))
    assert text.returncode == 0, text.stdout + text.stderr
    lines = [line for line in text.stdout.splitlines() if "interrupted backups" in line]
    assert len(lines) == 1, text.stdout
    assert lines[0].split(":", 1)[1].strip().startswith("1, "), lines[0]
    assert world.killed in lines[0]
    assert "receivewal cleanup removes them" in lines[0]
    done = receivewal("status", "--json", "-D", str(world.archive))
    assert done.returncode == 0, done.stdout + done.stderr
    archive = json.loads(done.stdout)["archive"]
    assert archive["interrupted_backups"] == [{"backup_id": world.killed,
                                               "bytes": world.killed_bytes}]
    assert archive["interrupted_bytes"] == world.killed_bytes
    assert archive["backups"] == 1


def test_verify_reports_the_interrupted_backup_and_the_archive_stays_recoverable(
        world: World) -> None:
    """``verify``: the backups' line counts the interrupted one (with its bytes), its own line
    says it is interrupted, not FAILED; the archive is recoverable, exit 0; ``--json`` the
    same, with the bytes."""
    done = receivewal("verify", str(world.archive), timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (f"backups: 2, 0 FAILED, 1 interrupted ({world.killed_bytes} bytes): not "
            "recoverable from, not an error") in done.stdout, done.stdout
    assert f"backup {world.killed}: interrupted: interrupted (no record), " \
           f"{world.killed_bytes} bytes on disk" in done.stdout, done.stdout
    assert f"backup {world.complete}: verified" in done.stdout, done.stdout
    assert "NOT recoverable" not in done.stdout
    report = receivewal("verify", "--json", str(world.archive), timeout=180)
    assert report.returncode == 0, report.stdout + report.stderr
    document = json.loads(report.stdout)
    assert document["interrupted_backups"] == 1
    killed = next(b for b in document["backups"] if b["backup_id"] == world.killed)
    assert (killed["state"], killed["bytes"]) == ("interrupted", world.killed_bytes)
