"""How the daemon's process ends: once it has stopped (here at --endpos), the interpreter's
final garbage collection over every imported module is skipped (``gc.freeze`` at exit). That
collection cost 0.1 to 0.25 s of CPU after the last byte on the development machine, counted in
every ``--endpos`` run's time; the archive is already durable and the lock released by then."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.servers import PgServer

pytestmark = pytest.mark.server

# The probe's own atexit handler is registered first, so it runs last (atexit is LIFO): it sees
# what the daemon left for the interpreter's finalization.
PROBE = """\
import atexit, gc, importlib, json, sys
atexit.register(lambda: print(json.dumps({"frozen": gc.get_freeze_count()})))
status = importlib.import_module(sys.argv[1]).main(sys.argv[2:])
print(json.dumps({"status": status}))
"""


def exit_probe(entry: str, *args: str) -> dict[str, int]:
    done = subprocess.run([sys.executable, "-c", PROBE, entry, *args], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()[-2:]]
    return {**lines[0], **lines[1]}


@pytest.mark.shared_server
@pytest.mark.parametrize("entry", ["receivewal.commands.cli", "receivewal.commands.pg_receivewal"])
def test_a_stream_that_stopped_at_endpos_leaves_no_final_collection(
        pg: PgServer, archive_dir: Path, entry: str) -> None:
    """Both entry points (``receivewal stream`` and the drop-in) exit with the heap frozen."""
    pg.generate_wal(1)
    command = ["stream", "--log-format", "json"] if entry.endswith(".cli") else []
    result = exit_probe(entry, *command, "-D", str(archive_dir), "-d", pg.dsn,
                        "-E", pg.mid_segment_lsn(), "-n")
    assert result["status"] == 0
    assert result["frozen"] > 0
