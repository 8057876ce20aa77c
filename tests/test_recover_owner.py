"""``receivewal recover`` run as root, as a DBA runs it against a real PostgreSQL 15 (issue 35
item 6): the files it writes belong to the server's user (``--owner``, by default the owner of
PGDATA's parent directory), who is checked first to be able to read the archive and run the
restore_command (else one clear line, nothing written); ``--setting NAME=VALUE`` adds to the
recovery settings and the server starts with it, a setting recover decides is refused."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.backups import start_recovered
from support.postgres_user import install_for_postgres, readable_by_postgres
from support.servers import IS_ROOT, PgServer, make_shared_dir
from support.streams import receivewal, start_streaming, stop, wait_for

pytestmark = [pytest.mark.server,
              pytest.mark.skipif(not IS_ROOT, reason="handing files to another user needs root")]


@dataclass
class World:
    base: Path
    pg: PgServer
    archive: Path
    prefix: str  # restore_command's prefix, runnable by the server user
    rows: str


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    base = make_shared_dir("receivewal-owner-")
    pg = PgServer(base, "primary")
    streamer = None
    try:
        pg.init(initdb_args=("--wal-segsize=1",))
        pg.start()
        archive = base / "archive"
        archive.mkdir()
        streamer = start_streaming("-D", str(archive), "-d", pg.dsn, log=base / "stream.log")
        pg.sql("CREATE TABLE t AS SELECT g FROM generate_series(1, 100) g")
        done = receivewal("backup", "-D", str(archive), "-d", pg.dsn, "--fast", timeout=180)
        assert done.returncode == 0, done.stderr
        pg.sql("INSERT INTO t SELECT g FROM generate_series(101, 150) g")
        last = pg.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
        pg.switch_wal()
        wait_for((archive / last).exists, timeout=120, what=f"{last} archived")
        readable_by_postgres(archive)
        yield World(base, pg, archive, install_for_postgres(base), pg.sql(
            "SELECT count(*) FROM t"))
    finally:
        if streamer is not None:
            stop(streamer)
        pg.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def owners(root: Path) -> set[str]:
    """The user names owning ``root`` and everything under it."""
    found = {pwd.getpwuid(os.lstat(root).st_uid).pw_name}
    for directory, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            found.add(pwd.getpwuid(os.lstat(os.path.join(directory, name)).st_uid).pw_name)
    return found


def test_as_root_the_files_go_to_the_parents_owner_and_the_server_starts(world: World) -> None:
    """PGDATA's parent belongs to postgres: without --owner every file written is postgres's,
    and the server started as postgres without any chown recovers every row, with the
    --setting given in effect."""
    name = "recovered-default"
    pgdata = world.base / name
    done = receivewal("recover", "--to", str(pgdata), "-D", str(world.archive),
                      "--restore-command-prefix", world.prefix, "--setting", "work_mem=7MB",
                      "--setting", "application_name=restored", "--no-sync", timeout=180)
    assert done.returncode == 0, done.stderr
    assert "owned by postgres: every file and directory written" in done.stdout, done.stdout
    assert "added to the recovery settings: work_mem = '7MB'" in done.stdout, done.stdout
    assert owners(pgdata) == {"postgres"}
    auto = (pgdata / "postgresql.auto.conf").read_text()
    assert "work_mem = '7MB'" in auto.split("# added by receivewal recover")[-1]
    server = start_recovered(world.base, name)
    try:
        assert server.sql("SELECT count(*) FROM t") == world.rows == "150"
        assert server.sql("SHOW work_mem") == "7MB"
    finally:
        server.stop("immediate")


def test_an_owner_who_cannot_read_the_archive_is_refused_before_writing(world: World) -> None:
    """--owner nobody, who cannot enter the archive directory (0700): one line naming the
    user and the archive, exit 1, no data directory."""
    pgdata = world.base / "recovered-nobody"
    world.archive.chmod(0o700)
    try:
        done = receivewal("recover", "--to", str(pgdata), "-D", str(world.archive), "--owner",
                          "nobody", "--restore-command-prefix", world.prefix, "--no-sync")
    finally:
        world.archive.chmod(0o755)
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("receivewal: error: user nobody, who will own the data directory "
                           "and run the restore_command, cannot read the archive directory "
                           f"{world.archive}"), line
    assert not pgdata.exists()


def test_an_owner_who_cannot_run_the_restore_program_is_refused(world: World) -> None:
    """--owner postgres, and a prefix naming a program postgres cannot run (under a 0700
    directory): one line naming the user and the program, exit 1, nothing written. Without
    --owner (postgres by the parent's owner) the recovery goes on and warns of it."""
    private = world.base / "private"
    private.mkdir(mode=0o700, exist_ok=True)
    program = private / "receivewal"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    pgdata = world.base / "recovered-unrunnable"
    done = receivewal("recover", "--to", str(pgdata), "-D", str(world.archive), "--owner",
                      "postgres", "--restore-command-prefix", f"{program} restore", "--no-sync")
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"receivewal: error: user postgres, who will run the "
                           f"restore_command, cannot run '{program} restore'"), line
    assert line.endswith("; nothing was written"), line
    assert not pgdata.exists()
    done = receivewal("recover", "--to", str(pgdata), "-D", str(world.archive),
                      "--restore-command-prefix", f"{program} restore", "--no-sync")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Warning: user postgres, who will run the restore_command, cannot run '{program} " \
        "restore'" in done.stdout, done.stdout
    assert owners(pgdata) == {"postgres"}


@pytest.mark.parametrize(("setting", "words"), [
    ("restore_command=cp /x %p", "recover sets restore_command itself"),
    ("recovery_target_time=2030-01-01", "recover sets recovery_target_time itself"),
    ("Recovery_Target_Action=pause", "recover sets recovery_target_action itself"),
    ("port", "not NAME=VALUE"),
    ("bad name=1", "not NAME=VALUE"),
])
def test_a_setting_recover_decides_or_a_malformed_one_is_refused(world: World, setting: str,
                                                                 words: str) -> None:
    pgdata = world.base / "recovered-refused"
    done = receivewal("recover", "--to", str(pgdata), "-D", str(world.archive), "--setting",
                      setting, "--no-sync")
    assert done.returncode != 0
    assert words in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert not pgdata.exists()


def test_owner_given_by_a_user_who_is_not_root_is_refused(world: World) -> None:
    """Only root can give files away: recover run as postgres with --owner nobody says so."""
    done = subprocess.run(["runuser", "-u", "postgres", "--", "sh", "-c",
                           f"{world.prefix.removesuffix(' restore')} recover --to "
                           f"{world.base}/recovered-x -D {world.archive} --owner nobody"],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode != 0
    assert "only root can give the files to another user" in done.stderr, done.stderr
