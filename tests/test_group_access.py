"""Who may read the archive: the owner, and the archive directory's group when the directory
lets it in (g+rx), so that PostgreSQL's user, added to that group, can run restore."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from support.servers import PgServer
from support.streams import receivewal

pytestmark = [pytest.mark.server]


def modes(directory: Path) -> dict[str, int]:
    """Every file of the archive (the lock file aside) and its permission bits."""
    return {name: stat.S_IMODE((directory / name).stat().st_mode)
            for name in os.listdir(directory) if name != ".receivewal.lock"}


@pytest.mark.parametrize(("directory_mode", "file_mode"), [(0o750, 0o640), (0o700, 0o600)],
                         ids=["0750", "0700"])
def test_files_are_group_readable_exactly_when_the_directory_lets_its_group_in(
        pg: PgServer, archive_dir: Path, directory_mode: int, file_mode: int) -> None:
    """From a server whose data directory is 0700: in a 0750 archive directory the segment
    files, the identity and the state file are 0640; in a 0700 one they stay 0600 (the rule
    of pg_receivewal, which follows the server's data_directory_mode)."""
    archive_dir.chmod(directory_mode)
    done = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-n",
                      "-E", pg.mid_segment_lsn())
    assert done.returncode == 0, done.stderr
    found = modes(archive_dir)
    assert {".receivewal-archive.json", ".receivewal-state.json"} < found.keys(), found
    assert any(name.endswith(".partial") for name in found), found
    assert found == dict.fromkeys(found, file_mode)
