"""``receivewal backup`` and ``recover`` say what they wait for and how far they are, as a user
sees it against a real PostgreSQL 15 (issue 35 item 1): the checkpoint the backup waits for
(and that --fast makes it immediate), the bytes received of the server's estimate and the rate
(``pg_basebackup -P``), on a terminal by default, as ``backup_progress`` events in the JSON log
with ``--progress --log-format json``; ``recover``'s bytes unpacked, and its summary."""

from __future__ import annotations

import os
import pty
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.backups import pgbench
from support.servers import PgServer, make_shared_dir
from support.streams import RECEIVEWAL, log_events, receivewal, start_streaming, stop

pytestmark = pytest.mark.server


@dataclass
class World:
    base: Path
    pg: PgServer
    archive: Path


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    base = make_shared_dir("receivewal-progress-")
    pg = PgServer(base, "primary")
    streamer = None
    try:
        pg.init(initdb_args=("--wal-segsize=1",))
        pg.start()
        subprocess.run(pgbench(pg, "-i", "-q", "-s", "1"), check=True, capture_output=True)
        archive = base / "archive"
        archive.mkdir()
        streamer = start_streaming("-D", str(archive), "-d", pg.dsn, log=base / "stream.log")
        yield World(base, pg, archive)
    finally:
        if streamer is not None:
            stop(streamer)
        pg.stop()


def on_a_terminal(*args: str, timeout: float = 180) -> tuple[int, str, str]:
    """``receivewal ARGS`` with stderr on a pseudo-terminal: exit code, stdout, and what the
    terminal received."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([*RECEIVEWAL, *args], stdout=subprocess.PIPE, stderr=follower,
                            stdin=subprocess.DEVNULL, text=True)
    os.close(follower)
    screen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the last writer closed it
                return
            if not chunk:
                return
            screen.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    out, _ = proc.communicate(timeout=timeout)
    reader.join(timeout=30)
    os.close(leader)
    return proc.returncode, out, screen.decode(errors="replace")


def test_backup_says_it_waits_for_a_spread_checkpoint_and_logs_progress_as_events(
        world: World) -> None:
    """Without --fast the backup says it waits for the server's spread checkpoint and that
    --fast asks for an immediate one; with --progress --log-format json its stderr is JSON
    events, backup_progress among them with the bytes received, the server's estimate and the
    rate, and a summary at the end."""
    world.pg.sql("CHECKPOINT")  # nothing to spread: the checkpoint is quick
    done = receivewal("backup", "-D", str(world.archive), "-d", world.pg.dsn, "--progress",
                      "--log-format", "json", "--max-rate", "8M", timeout=300)
    assert done.returncode == 0, done.stderr
    events = log_events(done.stderr)
    assert len(events) == len(done.stderr.splitlines()), done.stderr
    said = [str(e["message"]) for e in events if e["event"] == "backup_said"]
    assert any("waiting for the server's checkpoint" in line
               and "--fast asks for an immediate one" in line for line in said), said
    assert any(line.startswith("checkpoint done: receiving the backup (the server estimates ")
               for line in said), said
    progress = [e for e in events if e["event"] == "backup_progress"]
    assert progress, done.stderr
    assert all(int(str(e["estimated_bytes"])) > 10 * 2**20 for e in progress), progress
    assert int(str(progress[-1]["done_bytes"])) > 0, progress
    assert "bytes_per_second" in progress[-1]
    assert said[-1].startswith("received "), said
    assert " MB in " in said[-1], said


def test_backup_shows_progress_on_a_terminal_by_default(world: World) -> None:
    """On a terminal, without --progress: the immediate checkpoint asked for by --fast, then a
    line redrawn in place, "received X of ~Y (P%), R/s", erased before the next line."""
    code, out, screen = on_a_terminal("backup", "-D", str(world.archive), "-d", world.pg.dsn,
                                      "--fast", "--max-rate", "8M")
    assert code == 0, screen
    assert out.startswith("backup "), out
    assert "waiting for the server's immediate checkpoint (--fast)" in screen, screen
    redrawn = [part for part in screen.split("\r\x1b[K") if part.startswith("received ")]
    assert any(" of ~" in part and "%)" in part and "/s" in part for part in redrawn), screen


def test_recover_shows_progress_and_sums_up_what_it_unpacked(world: World,
                                                             tmp_path: Path) -> None:
    """recover --progress off a terminal: "unpacked X of ~Y (P%)" lines while it unpacks,
    then its summary says the files, the bytes, the time and the rate."""
    done = receivewal("recover", "-D", str(world.archive), "--to", str(tmp_path / "pgdata"),
                      "--progress", "--no-sync", timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("receivewal: ")]
    assert any(line.startswith("receivewal: unpacked ") and " of ~" in line for line in lines
               ), done.stderr
    first = done.stdout.splitlines()[0]
    assert " unpacked: " in first, done.stdout
    assert " files, " in first, first
    assert " s (" in first, first
    assert first.endswith("/s))"), first
