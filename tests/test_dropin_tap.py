"""PostgreSQL's own test of pg_receivewal passes on the drop-in.

``src/bin/pg_basebackup/t/020_pg_receivewal.pl``, from the Debian source package of the
installed PostgreSQL (fetched and cached at test time, see support.pgtap), run by the installed
TAP harness with the drop-in first on PATH as ``pg_receivewal``: its option checks, slot
creation and drop, streaming with --synchronous, gzip and lz4 compression, the resume from a
.partial, the file modes under umask 0077 (check_mode_recursive), the slot's restart_lsn as
starting point and a timeline switch on a promoted standby.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.pgtap import install_dropin_for_server_user, missing_tools, run_tap, tap_script
from support.servers import make_shared_dir

pytestmark = [pytest.mark.server]

SCRIPT = "src/bin/pg_basebackup/t/020_pg_receivewal.pl"


@pytest.fixture
def work() -> Iterator[Path]:
    """A directory the server user can write to, removed afterwards."""
    path = make_shared_dir("receivewal-tap-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_postgresqls_pg_receivewal_tap_test_passes_on_the_dropin(work: Path) -> None:
    """prove runs every subtest of 020_pg_receivewal.pl and each passes, none skipped, with
    pg_receivewal being the drop-in (its identity file is in the stream directory)."""
    missing = missing_tools()
    assert not missing, f"the TAP harness needs {', '.join(missing)}: run scripts/setup.sh " \
        "as root"
    script = tap_script(SCRIPT)
    bin_dir = install_dropin_for_server_user(work / "dropin")
    done = run_tap(script, work / "tap", bin_dir)
    output = done.stdout + done.stderr
    log = work / "tap" / "tmp_check" / "log" / "regress_log_020_pg_receivewal"
    detail = output[-4000:] + (log.read_text()[-6000:] if log.exists() else "")
    assert done.returncode == 0, detail
    assert "All tests successful." in output, detail
    plan = re.search(r"^1\.\.(\d+)$", done.stdout, re.MULTILINE)
    assert plan is not None, detail
    passed = re.findall(r"^ok \d+ - ", done.stdout, re.MULTILINE)
    assert len(passed) == int(plan.group(1)) >= 40, detail
    assert "# skip" not in done.stdout.lower(), detail
    stream_dirs = list((work / "tap" / "tmp_check").glob("t_020_pg_receivewal_primary_data/"
                                                         "archive_wal"))
    assert len(stream_dirs) == 1, detail
    assert (stream_dirs[0] / ".receivewal-archive.json").is_file()
