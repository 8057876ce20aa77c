"""``receivewal recover`` decides the recovery whatever the backup holds, against a real
PostgreSQL 15 whose WAL ``receivewal stream`` archives (issue 31, items 1, 7 and 8).

A server that was itself recovered keeps its recovery's ``recovery_target_time`` and
``recovery_target_action`` in ``postgresql.auto.conf`` (PostgreSQL ignores them without
recovery.signal), and its backups carry them: here they are planted with ALTER SYSTEM before
a backup, and in postgresql.conf before another. ``recover`` without a target from either
reaches every row committed after the backup, and says what it removed and what it overrode.
The ``restore_command`` it writes names the receivewal that runs, not the first on PATH. A
target time after the archive's last commit is refused before anything is written, naming
that commit's time."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from support.backups import give_to_postgres, start_recovered
from support.postgres_user import install_for_postgres, readable_by_postgres
from support.servers import PgServer, make_shared_dir
from support.streams import RECEIVEWAL, receivewal, start_streaming, stop, wait_for

pytestmark = pytest.mark.server

_names = itertools.count()
OLD_TARGET = "2001-02-03 04:05:06+00"  # a recovery target long past: before every backup


@dataclass
class World:
    base: Path
    pg: PgServer
    archive: Path
    prefix: str  # restore_command's prefix, runnable by the server user
    auto_conf_backup: str  # its postgresql.auto.conf holds an old recovery's settings
    main_conf_backup: str  # its postgresql.conf sets recovery_target_time
    rows: str  # count(*) of t once everything is archived
    last_insert: datetime  # now() of the last transaction that wrote t
    between: str  # a time after row 10 committed and before row 11


def backup_id_of(stdout: str) -> str:
    first = stdout.splitlines()[0]
    assert first.startswith("backup "), stdout
    assert " complete: " in first, stdout
    return first.split()[1]


def archived(world_pg: PgServer, archive: Path) -> None:
    """Switch WAL and wait until the archive holds the segment that was current."""
    last = world_pg.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
    world_pg.switch_wal()
    wait_for((archive / last).exists, timeout=120, what=f"{last} archived")


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    base = make_shared_dir("receivewal-recoverconf-")
    pg = PgServer(base, "primary")
    streamer = None
    try:
        pg.init(initdb_args=("--wal-segsize=1",))
        pg.start()
        archive = base / "archive"
        archive.mkdir()
        streamer = start_streaming("-D", str(archive), "-d", pg.dsn, log=base / "stream.log")
        pg.sql("CREATE TABLE t (id int)")
        pg.sql("INSERT INTO t VALUES (1)")
        # what a server recovered to a time keeps (PostgreSQL ignores it without
        # recovery.signal), and a primary_conninfo of a standby it once was
        for name, value in (("restore_command", "false"), ("recovery_target_time", OLD_TARGET),
                            ("recovery_target_action", "promote"),
                            ("primary_conninfo", "host=gone")):
            pg.sql(f"ALTER SYSTEM SET {name} = '{value}'")
        done = receivewal("backup", "-D", str(archive), "-d", pg.dsn, "--fast", "--label",
                          "auto-conf", timeout=180)
        assert done.returncode == 0, done.stderr
        auto_conf_backup = backup_id_of(done.stdout)
        pg.sql("INSERT INTO t SELECT g FROM generate_series(2, 7) g")
        pg.sql("ALTER SYSTEM RESET ALL")
        with (pg.datadir / "postgresql.conf").open("a") as conf:
            conf.write(f"recovery_target_time = '{OLD_TARGET}'\n")
        done = receivewal("backup", "-D", str(archive), "-d", pg.dsn, "--fast", "--label",
                          "main-conf", timeout=180)
        assert done.returncode == 0, done.stderr
        main_conf_backup = backup_id_of(done.stdout)
        for n in range(8, 14):  # one transaction each, after both backups
            pg.sql(f"INSERT INTO t VALUES ({n})")
            if n == 10:
                time.sleep(1.1)
                between = pg.sql("SELECT clock_timestamp()")
                time.sleep(1.1)
        last_insert = datetime.fromisoformat(pg.sql(
            "INSERT INTO t VALUES (14) RETURNING now()"))
        archived(pg, archive)
        readable_by_postgres(archive)
        yield World(base, pg, archive, install_for_postgres(base), auto_conf_backup,
                    main_conf_backup, pg.sql("SELECT count(*) FROM t"), last_insert, between)
    finally:
        if streamer is not None:
            stop(streamer)
        pg.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def recover_latest(world: World, backup_id: str) -> str:
    """``recover BACKUP-ID`` without a target, the server started: every row of t is there.
    The command's output."""
    name = f"recovered-{next(_names)}"
    pgdata = world.base / name
    done = receivewal("recover", backup_id, "--to", str(pgdata), "-D", str(world.archive),
                      "--restore-command-prefix", world.prefix, "--no-sync", timeout=180)
    assert done.returncode == 0, done.stderr
    # the closing lines say how the same archive goes on with the promoted server
    assert f"the same archive goes on with it: receivewal stream -D {world.archive} against " \
        "the new primary, with a new slot" in done.stdout, done.stdout
    give_to_postgres(pgdata)
    server = start_recovered(world.base, name)
    try:
        assert server.sql("SELECT count(*) FROM t") == world.rows == "14"
    finally:
        server.stop("immediate")
    return done.stdout


def test_an_old_recovery_target_in_postgresql_auto_conf_is_removed(world: World) -> None:
    """The backup's postgresql.auto.conf holds an old recovery's restore_command, target time,
    action and a primary_conninfo: recover removes them, says so, and the recovery reaches
    the end of the archive (before: it stopped at the old target, right after the backup's
    consistent point, and lost the 13 rows written after it)."""
    out = recover_latest(world, world.auto_conf_backup)
    removed = [line.split(": ", 1)[1] for line in out.splitlines()
               if line.startswith("removed from postgresql.auto.conf")]
    assert removed == ["restore_command = 'false'", f"recovery_target_time = '{OLD_TARGET}'",
                       "recovery_target_action = 'promote'", "primary_conninfo = 'host=gone'"]


def test_a_recovery_target_in_postgresql_conf_is_named_and_overridden(world: World) -> None:
    """postgresql.conf sets recovery_target_time: recover names the file, the line and the
    setting, and its own settings in postgresql.auto.conf (read after it, the last occurrence
    winning) override it: every row is there."""
    out = recover_latest(world, world.main_conf_backup)
    overridden = [line for line in out.splitlines() if line.startswith("overridden by")]
    assert len(overridden) == 1, out
    assert re.search(rf"/postgresql\.conf:\d+: recovery_target_time = '{re.escape(OLD_TARGET)}'$",
                     overridden[0]), overridden


def test_restore_command_names_the_receivewal_that_runs(world: World, tmp_path: Path) -> None:
    """A PATH whose first ``receivewal`` is another program: the restore_command names the
    running one, run as ``python -m receivewal`` (this Python, and PYTHONPATH where the package
    comes from) or as its console script (that script), and runs."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "receivewal").write_text("#!/bin/sh\necho 'not this receivewal' >&2\nexit 3\n")
    (fake / "receivewal").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin"}
    script = shutil.which("receivewal")
    assert script is not None
    assert Path(script).resolve().parent != fake
    for argv in (RECEIVEWAL, [script]):
        pgdata = tmp_path / f"pgdata-{next(_names)}"
        done = subprocess.run([*argv, "recover", "--to", str(pgdata), "-D", str(world.archive),
                               "--no-sync"], capture_output=True, text=True, check=False,
                              env={**os.environ, **env})
        assert done.returncode == 0, done.stderr
        line = next(line for line in (pgdata / "postgresql.auto.conf").read_text().splitlines()
                    if line.startswith("restore_command = "))
        command = line.removeprefix("restore_command = '").removesuffix("'")
        assert str(fake) not in command, command
        if argv == RECEIVEWAL:
            assert f"{sys.executable} -m receivewal restore -D " in command, command
        else:
            assert command.startswith(f"{Path(script).resolve()} restore -D "), command
        prefix = command.split(" -D ", 1)[0]
        helped = subprocess.run(["/bin/sh", "-c", f"{prefix} --help"], capture_output=True,
                                text=True, check=False, env={**os.environ, **env}, cwd=pgdata)
        assert helped.returncode == 0, helped.stderr
        assert "restore" in helped.stdout


def test_a_target_time_after_the_archives_last_commit_is_refused(world: World) -> None:
    """--target-time a day after the last commit: exit 1 before anything is written, one line
    naming the archive's last commit (the last INSERT's, in the last segment archived);
    --target-beyond-archive accepts it; a time before that commit is accepted."""
    pgdata = world.base / f"late-{next(_names)}"
    late = world.last_insert + timedelta(days=1)
    done = receivewal("recover", "--to", str(pgdata), "-D", str(world.archive),
                      "--target-time", late.isoformat(), "--no-sync")
    assert done.returncode == 1, done.stdout
    line = done.stderr.strip()
    assert "\n" not in line, line
    assert "Traceback" not in line
    assert line.startswith("receivewal: error: the target time ")
    assert "recovery ended before configured recovery target was reached" in line
    said = line.split("last commit or abort at ", 1)[1].split(" ", 1)[0]
    last = datetime.fromisoformat(said)
    assert world.last_insert <= last < world.last_insert + timedelta(minutes=5), line
    assert not pgdata.exists()
    done = receivewal("recover", "--to", str(pgdata), "-D", str(world.archive),
                      "--target-time", late.isoformat(), "--target-beyond-archive",
                      "--no-sync")
    assert done.returncode == 0, done.stderr
    early = world.base / f"early-{next(_names)}"
    done = receivewal("recover", "--to", str(early), "-D", str(world.archive),
                      "--target-time", (last - timedelta(microseconds=1)).isoformat(),
                      "--no-sync")
    assert done.returncode == 0, done.stderr


def test_the_backup_of_a_server_recovered_to_a_time_recovers_to_its_end(world: World) -> None:
    """The loop as a DBA runs it: recover to a time between rows 10 and 11, the server
    promoted; its WAL streamed into a second archive and a backup of it taken there (its
    postgresql.auto.conf holds that recovery's target, as recover wrote it); rows written
    after that backup; then recover latest from the second archive: every row is there (before:
    it stopped at the first recovery's target, right after the backup, without them)."""
    first = f"generation-{next(_names)}"
    done = receivewal("recover", "--to", str(world.base / first), "-D", str(world.archive),
                      "--target-time", world.between, "--restore-command-prefix", world.prefix,
                      "--no-sync", timeout=180)
    assert done.returncode == 0, done.stderr
    give_to_postgres(world.base / first)
    server = start_recovered(world.base, first)
    streamer = None
    try:
        assert server.sql("SELECT count(*) FROM t") == "10"
        assert "recovery_target_time" in (server.datadir / "postgresql.auto.conf").read_text()
        second = world.base / f"archive-{first}"
        second.mkdir()
        streamer = start_streaming("-D", str(second), "-d", server.dsn,
                                   log=world.base / f"{first}-stream.log")
        done = receivewal("backup", "-D", str(second), "-d", server.dsn, "--fast", timeout=180)
        assert done.returncode == 0, done.stderr
        backup_id = backup_id_of(done.stdout)
        for n in range(100, 106):
            server.sql(f"INSERT INTO t VALUES ({n})")
        archived(server, second)
        readable_by_postgres(second)
    finally:
        if streamer is not None:
            stop(streamer)
        server.stop("immediate")
    name = f"generation-{next(_names)}"
    done = receivewal("recover", "--to", str(world.base / name), "-D", str(second),
                      "--restore-command-prefix", world.prefix, "--no-sync", timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"backup {backup_id} "), done.stdout
    give_to_postgres(world.base / name)
    recovered = start_recovered(world.base, name)
    try:
        assert recovered.sql("SELECT count(*) FROM t") == "16"
    finally:
        recovered.stop("immediate")
    assert "removed from postgresql.auto.conf (the backup's): recovery_target_time = " \
        in done.stdout, done.stdout


def test_a_hole_in_the_archive_after_the_backup_is_refused(world: World, tmp_path: Path
                                                          ) -> None:
    """Issue 32, item 3: with a segment after the newest backup's end missing from a copy of
    the archive while a later one is there, ``recover`` exits 1 before anything is written,
    one line naming the missing segment and the next one held (PostgreSQL would stop at the
    hole: restore exits 126 there)."""
    for _ in range(2):  # two complete segments after every backup (no row of t changes)
        world.pg.sql("SELECT txid_current()")
        archived(world.pg, world.archive)
    copy = tmp_path / "archive"
    shutil.copytree(world.archive, copy, ignore=shutil.ignore_patterns("*.partial"))
    complete = sorted(n for n in os.listdir(copy) if re.fullmatch(r"[0-9A-F]{24}", n))
    missing, following = complete[-2:]
    (copy / missing).unlink()
    pgdata = tmp_path / "recovered"
    done = receivewal("recover", "--to", str(pgdata), "-D", str(copy), "--no-sync")
    assert done.returncode == 1, done.stdout
    line = done.stderr.strip()
    assert "\n" not in line, line
    assert "Traceback" not in line, line
    assert line.startswith("receivewal: error: the archive has a hole: "), line
    assert f"{missing} is missing" in line, line
    assert f"(next: {following})" in line, line
    assert not pgdata.exists()
