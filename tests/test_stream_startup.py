"""``receivewal stream``'s start-up loads only what its options ask for (issue 36 item 5): a
plain stream (no --upload-to, --metrics-address, --encrypt-to, compression at rest,
--keep-local or --progress) reaches START_REPLICATION and its end position without the
libraries and the modules of those options. What it cannot leave out, and what that costs, is
measured in docs/benchmarks.md ("Start-up")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.servers import PgServer

pytestmark = pytest.mark.server

#: Loaded only by the options that need them.
OPTIONAL = (
    "boto3", "botocore",  # --upload-to
    "prometheus_client", "receivewal.daemon.endpoint",  # --metrics-address
    "receivewal.walreceiver.archivemeter",
    "pyrage", "receivewal.archive.encryption", "receivewal.archive.agestream",  # --encrypt-to
    "zstandard", "lz4",  # -Z/--compress
    "receivewal.walreceiver.uploader", "receivewal.archive.bucket",  # --upload-to
    "receivewal.walreceiver.localcopy",  # --keep-local
    "receivewal.daemon.progress",  # --progress, -v
)
PROBE = (
    "import json, sys\n"
    "from receivewal.commands.cli import main\n"
    "status = main(sys.argv[1:])\n"
    f"print(json.dumps([status, sorted(m for m in {OPTIONAL!r} if m in sys.modules)]))\n"
)


@pytest.mark.shared_server
def test_a_plain_stream_loads_no_optional_library_nor_module(pg: PgServer,
                                                              tmp_path: Path) -> None:
    """``stream -E NOW -n`` into a new directory streams to its end position and exits 0
    having loaded none of boto3, prometheus_client, pyrage, zstandard, lz4, nor the modules
    of the uploads, the metrics endpoint, encryption, --keep-local and the progress line."""
    pg.sql("SELECT pg_logical_emit_message(true, 'startup', 'x')")  # committed: past a start
    now = pg.sql("SELECT pg_current_wal_flush_lsn()")
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "stream", "-D", str(tmp_path), "-d", pg.dsn, "-E", now,
         "-n", "--log-format", "json"],
        capture_output=True, text=True, check=True, timeout=120)
    status, loaded = json.loads(done.stdout.splitlines()[-1])
    assert (status, loaded) == (0, [])
    assert any(path.suffix == ".partial" or len(path.name) == 24
               for path in tmp_path.iterdir())
