"""``receivewal backup`` and ``receivewal logical`` load at start-up only what they need before
they connect (issue 36 items 1 and 4, as ``stream``'s start-up in test_stream_startup.py): a
backup without a retention policy never loads retention's removal, ``cleanup``, the change
log's store, the daemon's state file nor the logging library (console output); ``logical``
never loads the WAL archive's receiver, and its snapshot only with ``--snapshot``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.servers import PgServer
from support.streams import start_streaming, stop

#: What a backup needs only after it is complete, and only with a policy (or with
#: --log-format json, structlog).
AFTER_A_BACKUP = (
    "receivewal.commands.cleanup",
    "receivewal.retention.plan", "receivewal.retention.removal",
    "receivewal.retention.archivecleanup", "receivewal.retention.summary",
    "receivewal.logical.store", "receivewal.daemon.state",
    "structlog",
)
PROBE = (
    "import json, sys\n"
    "from receivewal.commands.cli import main\n"
    "try:\n"
    "    status = main(sys.argv[1:])\n"
    "except SystemExit as exc:\n"
    "    status = exc.code\n"
    f"print(json.dumps([status, sorted(m for m in {AFTER_A_BACKUP!r} if m in sys.modules)]))\n"
)


@pytest.mark.server
@pytest.mark.shared_server
def test_a_backup_without_a_retention_policy_loads_nothing_of_retention(
        pg: PgServer, tmp_path: Path) -> None:
    """``backup -D ARCHIVE --fast`` (no --keep-backups, no --recovery-window, console
    output), into an archive a stream daemon fills, completes and exits 0 having loaded none
    of cleanup, retention's plan and removal, the change log's store, the daemon's state file
    and structlog."""
    archive = tmp_path / "archive"
    archive.mkdir()
    streamer = start_streaming("-D", str(archive), "-d", pg.dsn, log=tmp_path / "stream.log")
    try:
        done = subprocess.run(
            [sys.executable, "-c", PROBE, "backup", "-D", str(archive), "-d", pg.dsn, "--fast",
             "--compress", "none", "--no-sync"],
            capture_output=True, text=True, timeout=180, check=False)
    finally:
        stop(streamer)
    assert done.stdout, done.stderr
    status, loaded = json.loads(done.stdout.splitlines()[-1])
    assert (status, loaded) == (0, []), done.stderr
    assert "complete" in done.stdout


def test_the_logical_command_loads_nothing_of_the_wal_archives_receiver() -> None:
    """Importing ``receivewal logical``'s command (its options, the daemon, the change log's
    receiver) loads no module of the WAL archive's receiver and not the snapshot's."""
    probe = ("import json, sys\n"
             "from receivewal.commands.logical import logical_command\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.startswith("
             "('receivewal.walreceiver', 'receivewal.logicalreceiver.snapshot', "
             "'receivewal.logical.snapshot', 'receivewal.commands.stream')))))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    assert json.loads(done.stdout) == []
