"""The primary of a point-in-time recovery test: a base backup, then rows and WAL after it; and
a recovery that may either promote or stop (restore_command exiting above 125)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from support.servers import IS_ROOT, PgServer, as_server_user, pg_bin


def backup_then_rows(pg: PgServer, name: str, segments: int) -> tuple[PgServer, str]:
    """Take a base backup of ``pg`` (a new, stopped server named ``name``), then write a
    table of 20,000 rows and about ``segments`` segments of WAL on ``pg``, switch WAL and stop
    it: its pg_wal then holds every segment the backup needs to reach those rows. Returns the
    backup and the rows' ``count(*), sum(id)`` that the recovered server must show."""
    backup = pg.base_backup(name)
    pg.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg.sql("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 20000) g")
    pg.generate_wal(segments)
    expected = pg.sql("SELECT count(*), sum(id) FROM t")
    pg.switch_wal()
    pg.stop()
    return backup, expected


def complete_segments(server: PgServer) -> list[Path]:
    """The complete segments in the pg_wal of the cleanly stopped ``server``: those before
    the one its shutdown checkpoint is in. What an archive holds: PostgreSQL archives only
    completed segments, and receivewal names only those without ``.partial``; the segment
    being written (WAL, then zeros) and the recycled ones after it (another segment's old
    WAL) are no complete segment, and restore refuses to serve them as one."""
    control = subprocess.run(as_server_user([pg_bin("pg_controldata"), "-D",
                                             str(server.datadir)]),
                             capture_output=True, text=True, check=True).stdout
    redo = next(line.split(":", 1)[1].strip() for line in control.splitlines()
                if line.startswith("Latest checkpoint's REDO WAL file:"))
    return sorted(p for p in server.pg_wal.iterdir()
                  if len(p.name) == 24 and p.is_file() and p.name < redo)


def copy_of(backup: PgServer, name: str) -> PgServer:
    """A copy of the stopped server ``backup`` (its data directory as it is, owners kept),
    to recover once: one base backup serves many recoveries."""
    copy = PgServer(backup.base, name, backup.major)
    subprocess.run(["cp", "-a", str(backup.datadir), str(copy.datadir)], check=True)
    return copy


def recover_or_stop(server: PgServer, restore_command: str, timeout: float = 120) -> bool:
    """Start archive recovery of ``server`` (a restored base backup) with ``restore_command``
    and wait for its outcome: True when recovery ended and the server promoted, False when the
    server stopped instead (PostgreSQL ends the startup process, and the server with it, when
    restore_command exits above 125)."""
    server._mkdirs()  # the socket directory, as recover_from_archive makes it
    server.configure({"restore_command": f"'{restore_command}'",
                      "recovery_target_timeline": "'latest'"})
    signal_file = server.datadir / "recovery.signal"
    signal_file.touch()
    if IS_ROOT:
        shutil.chown(signal_file, "postgres", "postgres")
    # -w: until it accepts connections (consistent, with hot_standby) or has stopped
    subprocess.run(as_server_user([server.pg_bin("pg_ctl"), "-D", str(server.datadir), "-l",
                                   str(server.logfile), "-w", "-t", str(int(timeout)),
                                   "start"]), check=False, capture_output=True)
    server.running = True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = subprocess.run(as_server_user([server.pg_bin("pg_ctl"), "-D", str(server.datadir),
                                                "status"]), capture_output=True, check=False)
        if status.returncode == 3 and not (server.datadir / "postmaster.pid").exists():
            server.running = False
            return False
        promoted = subprocess.run(
            [server.pg_bin("psql"), "-X", "-At", "-h", "127.0.0.1", "-p", str(server.port), "-U",
             "postgres", "-c", "SELECT pg_is_in_recovery()"], capture_output=True, text=True,
            check=False)
        if promoted.stdout.strip() == "f":
            return True
        time.sleep(0.1)
    raise TimeoutError(f"recovery of {server.name} neither ended nor stopped in {timeout} s")
