"""Who may read the archive: the owner, and the archive directory's group when the directory
lets it in (g+rx), so that PostgreSQL's user, added to that group, can run restore."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.dropin import PG_RECEIVEWAL, install_dropin
from support.servers import IS_ROOT, PgServer
from support.streams import receivewal

pytestmark = [pytest.mark.server]


def modes(directory: Path) -> dict[str, int]:
    """Every file of the archive and its permission bits."""
    return {name: stat.S_IMODE((directory / name).stat().st_mode)
            for name in os.listdir(directory)}


@pytest.mark.parametrize(("directory_mode", "file_mode"), [(0o750, 0o640), (0o700, 0o600)],
                         ids=["0750", "0700"])
@pytest.mark.shared_server
def test_files_are_group_readable_exactly_when_the_directory_lets_its_group_in(
        pg: PgServer, archive_dir: Path, directory_mode: int, file_mode: int) -> None:
    """From a server whose data directory is 0700: in a 0750 archive directory the segment
    files, the identity, state and lock files are 0640; in a 0700 one they stay 0600 (the rule
    of pg_receivewal, which follows the server's data_directory_mode)."""
    archive_dir.chmod(directory_mode)
    done = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-n",
                      "-E", pg.mid_segment_lsn())
    assert done.returncode == 0, done.stderr
    found = modes(archive_dir)
    assert {".receivewal-archive.json", ".receivewal-state.json", ".receivewal.lock",
            } < found.keys(), found
    assert any(name.endswith(".partial") for name in found), found
    assert found == dict.fromkeys(found, file_mode)


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """This process's umask (which the programs it starts inherit) set to ``mask``."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def tree_modes(directory: Path) -> dict[str, int]:
    """The permission bits of ``directory`` and of everything under it, as PostgreSQL's
    ``check_mode_recursive`` walks it ("." is the directory itself)."""
    found = {".": stat.S_IMODE(directory.lstat().st_mode)}
    for root, dirs, files in os.walk(directory):
        for name in [*dirs, *files]:
            path = Path(root, name)
            found[str(path.relative_to(directory))] = stat.S_IMODE(path.lstat().st_mode)
    return found


@pytest.fixture(params=["0700", "0750"], ids=["data-dir-0700", "data-dir-0750 (initdb -g)"])
def on_timeline_2(request: pytest.FixtureRequest, server_base: Path) -> Iterator[PgServer]:
    """A server on timeline 2 (promoted from standby mode with no primary: a history file to
    fetch), whose data directory is 0700, or 0750 when initdb gave its group access (-g)."""
    server = PgServer(server_base, "tl2")
    # a standby's max_connections may not be below what the control file records (initdb's,
    # at most 100)
    server.init({"max_connections": "100"}, initdb_args=("-g",) if request.param == "0750"
                else ())
    (server.datadir / "standby.signal").touch()
    if IS_ROOT:
        shutil.chown(server.datadir / "standby.signal", "postgres", "postgres")
    server.start()
    server.promote()
    yield server
    server.stop("immediate")


def test_every_file_follows_pg_receivewals_mode_rule_under_umask_0077(
        on_timeline_2: PgServer, tmp_path: Path) -> None:
    """Under umask 0077 (as PostgreSQL's TAP test runs pg_receivewal: check_mode_recursive of
    the stream directory), the drop-in's files (segments, the .partial, the history file,
    what -Z lz4 converts, the identity, state and lock files) get the mode pg_receivewal 15
    gives its own files next to it from the same server: 0600, or 0640 when the server's data
    directory allows group access; the directory is left 0700."""
    server = on_timeline_2
    group = stat.S_IMODE(server.datadir.stat().st_mode) == 0o750
    with umask(0o077):
        theirs, ours = tmp_path / "theirs", tmp_path / "ours"
        theirs.mkdir()
        ours.mkdir()
        dropin = install_dropin(tmp_path / "bin")
        endpos = server.endpos_inside_the_wal()
        for program, directory in ((PG_RECEIVEWAL, theirs), (dropin, ours)):
            done = subprocess.run([str(program), "-D", str(directory), "-d", server.dsn, "-n",
                                   "-E", endpos], capture_output=True, text=True, timeout=120,
                                  check=False)
            assert done.returncode == 0, done.stderr
        server.switch_wal()  # the .partial completes; lz4 converts it and adds one
        done = subprocess.run([str(dropin), "-D", str(ours), "-d", server.dsn, "-n", "-Z", "lz4",
                               "-E", server.endpos_inside_the_wal()],
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
    file_mode = 0o640 if group else 0o600
    their_modes, our_modes = tree_modes(theirs), tree_modes(ours)
    assert "00000002.history" in their_modes
    assert their_modes == {".": 0o700} | dict.fromkeys(set(their_modes) - {"."}, file_mode)
    assert {".receivewal.lock", ".receivewal-archive.json", ".receivewal-state.json",
            "00000002.history"} < our_modes.keys()
    assert any(name.endswith(".lz4.partial") for name in our_modes), our_modes
    assert our_modes == {".": 0o700} | dict.fromkeys(set(our_modes) - {"."}, file_mode)
