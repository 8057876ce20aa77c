"""The one-writer lock cannot be tricked or deleted from under the daemon (issue 18, item 12).

The lock is the archive directory itself (flock on a descriptor of the directory), which no
one can delete while the daemon runs; ``.receivewal.lock`` only records who holds it. So a
FIFO or a directory at the record's path, a record left by another user, or a record deleted
while the daemon runs never lets a second writer in nor gives a traceback, and ``status``
tells "running" by the lock, not by a pid that may have been reused.
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.servers import PgServer
from support.streams import (
    assert_identical_to_server,
    lsn_to_int,
    receivewal,
    slot_restart_lsn,
    start_receivewal,
    stop,
    wait_for,
    wal_files,
)

from receivewal.archive.directory import Archive
from receivewal.archive.lock import LOCK_FILE
from receivewal.daemon.state import State, write_state
from receivewal.errors import ArchiveError

NOWHERE = "host=127.0.0.1 port=1 user=nobody connect_timeout=5"  # nothing listens on port 1
CRITICAL, OK = 2, 0


def stream_once(directory: Path) -> subprocess.CompletedProcess[str]:
    """``stream -n`` against a port where no server listens: it takes the lock, then fails
    to connect (exit 1)."""
    return receivewal("stream", "-D", str(directory), "-d", NOWHERE, "-n", timeout=60)


def as_postgres(action: Callable[[], str]) -> str:
    """Run ``action`` in a forked child that became the ``postgres`` user; its result, or
    the exception it raised as ``ExceptionName: message``."""
    user = pwd.getpwnam("postgres")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            result = action()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, whatever it is
            result = f"{type(exc).__name__}: {exc}"
        os.write(write_end, result.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        result = reader.read().decode()
    os.waitpid(pid, 0)
    return result


def lock_once(directory: Path) -> Callable[[], str]:
    def action() -> str:
        Archive(directory).lock()
        return "locked"
    return action


# -- what sits at the lock record's path ------------------------------------------------------
def test_fifo_at_the_lock_path_is_no_traceback(tmp_path: Path) -> None:
    """A FIFO at ``.receivewal.lock``: the daemon takes the lock, replaces the FIFO by its
    record (pid and host) and goes on (here to a failed connection), without a traceback."""
    os.mkfifo(tmp_path / LOCK_FILE)
    done = stream_once(tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    assert "lock" not in done.stderr, done.stderr
    assert (tmp_path / LOCK_FILE).is_file()
    pid, host = (tmp_path / LOCK_FILE).read_text().split()
    assert host == socket.gethostname()
    assert int(pid) > 0


def test_directory_at_the_lock_path_is_one_line_naming_it(tmp_path: Path) -> None:
    """A directory at ``.receivewal.lock``: exit 1 with one line naming it."""
    (tmp_path / LOCK_FILE).mkdir()
    done = stream_once(tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(tmp_path / LOCK_FILE) in lines[0]
    assert "directory" in lines[0]


# -- records left by another user ---------------------------------------------------------------
def test_lock_record_of_another_user_does_not_stop_the_owner(archive_dir: Path) -> None:
    """A record left by root (mode 0644) in an archive the postgres user owns: postgres
    takes the lock (the record is only a note), instead of being told that its own directory
    is not writable."""
    archive = archive_dir
    os.chown(archive, pwd.getpwnam("postgres").pw_uid, -1)
    (archive / LOCK_FILE).write_text("1 elsewhere\n")
    (archive / LOCK_FILE).chmod(0o644)
    assert as_postgres(lock_once(archive)) == "locked"
    assert (archive / LOCK_FILE).stat().st_uid == pwd.getpwnam("postgres").pw_uid


def test_lock_held_by_another_user_is_refused_in_one_line(archive_dir: Path) -> None:
    """root holds the archive of the postgres user; postgres is refused. The record is 0600
    as every file of the archive (pg_receivewal's rule), so postgres is told that it cannot
    read who holds it."""
    archive = archive_dir
    os.chown(archive, pwd.getpwnam("postgres").pw_uid, -1)
    holder = Archive(archive)
    holder.lock()
    try:
        result = as_postgres(lock_once(archive))
    finally:
        holder.unlock()
    assert result == (f"ArchiveError: archive {archive} is in use by another process (its "
                      f'record "{archive / LOCK_FILE}" cannot be read: [Errno 13] Permission '
                      f"denied: '{archive / LOCK_FILE}')")


def test_a_deleted_lock_record_still_refuses_a_second_writer(tmp_path: Path) -> None:
    """Deleting ``.receivewal.lock`` from under the holder changes nothing: a second writer
    is refused and told the holder's record is missing."""
    holder = Archive(tmp_path)
    holder.lock()
    try:
        (tmp_path / LOCK_FILE).unlink()
        with pytest.raises(ArchiveError, match=f"archive {tmp_path} is in use"):
            Archive(tmp_path).lock()
    finally:
        holder.unlock()
    Archive(tmp_path).lock()  # released with the holder


@pytest.mark.shared_server
@pytest.mark.server
def test_deleting_the_lock_file_while_the_daemon_runs_lets_no_second_writer_in(
        pg: PgServer, archive_dir: Path, tmp_path: Path) -> None:
    """A running daemon's lock file is deleted; a second ``stream`` on the same directory is
    refused (exit 1, "in use"), and the first keeps an archive identical to the server's."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    pg.sql("SELECT pg_create_physical_replication_slot('other', true)")
    first = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                             "-s", "0.2", stderr_path=tmp_path / "first.log")
    try:
        wait_for(lambda: any(n.endswith(".partial") for n in wal_files(archive_dir)),
                 what="the first writer's .partial")
        (archive_dir / LOCK_FILE).unlink()
        second = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "other",
                            "-n")
        assert second.returncode == 1, second.stderr
        assert f"archive {archive_dir} is in use" in second.stderr
        assert "Traceback" not in second.stderr
        assert first.poll() is None
        pg.generate_wal(2)
        target = lsn_to_int(pg.current_lsn())
        wait_for(lambda: slot_restart_lsn(pg, "arch") >= target,
                 what="the first writer to catch up")
    finally:
        assert stop(first) == 0
    assert len(assert_identical_to_server(archive_dir, pg)) >= 2


# -- status tells "running" by the lock -----------------------------------------------------------
def running_state() -> State:
    """A state on this host whose pid is alive (this test's own), streaming, in contact."""
    now = time.time()
    return State(pid=os.getpid(), hostname=socket.gethostname(), started_at=now - 60,
                 updated_at=now - 1, phase="streaming", timeline=1, last_contact=now - 1)


def status_of(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "receivewal", "status", "-D", str(directory)],
                          capture_output=True, text=True, check=False, timeout=60)


def test_status_is_critical_when_no_one_holds_the_lock(tmp_path: Path) -> None:
    """The state names a live pid (a reused one, say) but no process holds the archive:
    CRITICAL, not running."""
    write_state(tmp_path, running_state())
    done = status_of(tmp_path)
    assert done.returncode == CRITICAL, done.stdout
    assert done.stdout.startswith("RECEIVEWAL CRITICAL - not running: no process holds the "
                                  f"archive's lock (pid {os.getpid()} recorded"), done.stdout


def test_status_is_ok_while_the_lock_is_held(tmp_path: Path) -> None:
    """The same state while a process holds the archive's lock: OK; and the probe left the
    lock to its holder."""
    write_state(tmp_path, running_state())
    holder = Archive(tmp_path)
    holder.lock()
    try:
        done = status_of(tmp_path)
        assert done.returncode == OK, done.stdout
        with pytest.raises(ArchiveError, match="in use"):
            Archive(tmp_path).lock()
    finally:
        holder.unlock()
