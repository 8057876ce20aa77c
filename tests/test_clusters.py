"""Servers made from the session's initdb template are distinct systems, as initdb's are."""

from __future__ import annotations

import fcntl
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support import clusters
from support.clusters import set_system_identifier
from support.servers import PgServer, as_server_user, pg_bin, server_user_ids
from support.streams import wait_for

from receivewal.wal.pageheader import parse_long_header

pytestmark = [pytest.mark.server]


def controldata_sysid(server: PgServer) -> str:
    """The system identifier pg_controldata reads (it checks pg_control's CRC)."""
    out = subprocess.run([pg_bin("pg_controldata"), "-D", str(server.datadir)], check=True,
                         capture_output=True, text=True).stdout
    assert "WARNING" not in out, out
    match = re.search(r"Database system identifier:\s+(\d+)", out)
    assert match, out
    return match.group(1)


@pytest.mark.parametrize("initdb_args", [(), ("--wal-segsize=1",)])
def test_each_server_is_a_system_of_its_own(server_base: Path,
                                            initdb_args: tuple[str, ...]) -> None:
    """Two servers made one after the other (a copy of one template each) have different
    system identifiers; each one's pg_control (CRC valid) and the long header of the WAL it
    wrote carry the identifier the server reports, and a row written in one is not in the
    other."""
    servers = [PgServer(server_base, name) for name in ("one", "two")]
    sysids = []
    for server in servers:
        server.init(initdb_args=initdb_args)
        server.start()
    try:
        for server in servers:
            sysid = server.sql("SELECT system_identifier FROM pg_control_system()")
            assert controldata_sysid(server) == sysid
            name = server.sql("SELECT pg_walfile_name(pg_switch_wal())")
            header = parse_long_header((server.pg_wal / name).read_bytes())
            assert header is not None
            assert str(header.system_identifier) == sysid
            sysids.append(sysid)
        servers[0].sql("CREATE TABLE only_here (x int)")
        assert servers[1].sql("SELECT count(*) FROM pg_class WHERE relname = 'only_here'") == "0"
    finally:
        for server in servers:
            server.stop("immediate")
    assert sysids[0] != sysids[1]


def test_a_changed_system_identifier_keeps_pg_control_valid(server_base: Path) -> None:
    """set_system_identifier rewrites pg_control with a valid CRC: pg_controldata reads the
    new value without a warning."""
    server = PgServer(server_base, "stopped")
    server.init()
    set_system_identifier(server.datadir, 7_000_000_000_000_000_123)
    assert controldata_sysid(server) == "7000000000000000123"


def test_a_template_is_made_again_once_its_minute_is_over(
        server_base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy never starts from an initdb much older than itself (initdb's checkpoint time is
    in its pg_control and WAL): after TEMPLATE_LIFETIME a new template is made by initdb, and
    the old one is removed."""
    monkeypatch.setenv(clusters.TEMPLATES_ENV, str(server_base))
    initdb = [pg_bin("initdb"), "-U", "postgres", "-A", "trust", "--no-sync"]
    ids = server_user_ids()
    now = time.time()  # one minute for both calls, however long the first initdb takes
    first = clusters.template(initdb, (), as_server_user([]), ids, now=now)
    assert clusters.template(initdb, (), as_server_user([]), ids, now=now) == first
    later = now + clusters.TEMPLATE_LIFETIME
    second = clusters.template(initdb, (), as_server_user([]), ids, now=later)
    assert second != first
    assert (second / "global" / "pg_control").exists()
    assert not first.exists()


def waiting_for_lock(path: Path) -> int:
    """How many flock requests wait for the lock of file ``path`` now (``->`` lines of
    /proc/locks naming its inode)."""
    inode = f":{path.stat().st_ino} "
    return sum(1 for line in Path("/proc/locks").read_text().splitlines()
               if "->" in line and "FLOCK" in line and inode in line)


def test_a_template_being_copied_is_not_removed_by_the_next_minutes(
        server_base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Processes sharing the template directory (pytest-xdist's workers): while one copies a
    template (holding the shared lock), another that makes the next minute's template waits
    to remove the old one until the copy is done."""
    monkeypatch.setenv(clusters.TEMPLATES_ENV, str(server_base))
    initdb = [pg_bin("initdb"), "-U", "postgres", "-A", "trust", "--no-sync"]
    ids = server_user_ids()
    now = time.time()
    first = clusters.template(initdb, (), as_server_user([]), ids, now=now)
    later = now + clusters.TEMPLATE_LIFETIME
    made: list[Path] = []
    maker = threading.Thread(target=lambda: made.append(
        clusters.template(initdb, (), as_server_user([]), ids, now=later)))
    lock = server_base / ".lock"
    with clusters.templates_locked(fcntl.LOCK_SH):
        maker.start()
        wait_for(lambda: waiting_for_lock(lock) == 1, what="the maker to wait for the lock")
        assert (first / "global" / "pg_control").exists()
    maker.join(timeout=120)
    assert made == [made[0]]
    assert made[0] != first
    assert not first.exists()
