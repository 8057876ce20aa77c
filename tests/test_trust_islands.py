"""A stray old segment at the oldest end of the archive, before a hole (issue 18 item 13): the
daemon resumes from the newest run of consecutive segments, the one that ends at the archive's
end, never from the island (whose WAL the server has removed: it looped on gap_detected), and
``verify`` and ``status`` report the island.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.servers import PgServer, read_segment
from support.streams import (
    log_events,
    lsn_to_int,
    receivewal,
    start_receivewal,
    stop,
    wait_for,
    wal_files,
)

from receivewal.archive.directory import Archive
from receivewal.check.verify import verify_archive
from receivewal.wal.lsn import format_lsn

SEGMENT = 16 << 20
STRAY = "000000010000000000000001"


def flushed_by_receiver(pg: PgServer) -> int:
    """The flush position receivewal reported to the server (0 when not connected)."""
    text = pg.sql("SELECT flush_lsn FROM pg_stat_replication")
    return lsn_to_int(text) if text else 0


def status(directory: Path) -> subprocess.CompletedProcess[str]:
    """``receivewal status -D DIRECTORY``."""
    return subprocess.run([sys.executable, "-m", "receivewal", "status", "-D", str(directory)],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.server
def test_stray_old_segment_before_a_hole_is_reported_not_resumed_from(
        pg: PgServer, archive_dir: Path, tmp_path: Path) -> None:
    """The server's first segment, long removed from its pg_wal, lies in the archive before a
    hole: the daemon resumes after the newest run (no gap_detected, no request for removed
    WAL), logs older_island, status says WARNING naming the island, verify reports it (and
    with --start after the hole, the archive is recoverable)."""
    pg.configure({"wal_keep_size": "0"})  # the server removes WAL nobody needs
    pg.restart()
    pg.switch_wal()
    stray = read_segment(pg, STRAY)
    for _ in range(3):
        pg.switch_wal()
        pg.sql("CHECKPOINT")
    assert pg.sql("SELECT count(*) FROM pg_ls_waldir() WHERE name <= '000000010000000000000002'"
                  ) == "0"
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    first = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch", "-n",
                       "-E", pg.mid_segment_lsn())
    assert first.returncode == 0, first.stderr
    newest = max(wal_files(archive_dir))
    (archive_dir / STRAY).write_bytes(stray)
    resume = Archive(archive_dir).segment_names(SEGMENT)
    assert min(f.segno for f in resume) == 1
    assert len(resume) >= 2
    assert min(f.segno for f in resume if f.segno > 1) > 2  # a hole after the stray file

    log = tmp_path / "second.log"
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                            "-s", "0.2", stderr_path=log)
    try:
        pg.switch_wal()
        target = lsn_to_int(pg.current_lsn())
        wait_for(lambda: flushed_by_receiver(pg) >= target or "gap_detected" in log.read_text(),
                 what="the daemon to stream or to find a gap")
        checked = status(archive_dir)
    finally:
        assert stop(proc) == 0
    events = log_events(log.read_text())
    assert [e for e in events if e["event"] == "gap_detected"] == []
    started = [e["start_lsn"] for e in events if e["event"] == "streaming_started"]
    newest_start = int(newest[8:16], 16) * (1 << 32) + int(newest[16:24], 16) * SEGMENT
    assert started[0] == format_lsn(newest_start)
    (island,) = [e for e in events if e["event"] == "older_island"]
    assert island["first"] == island["last"] == STRAY
    assert checked.returncode == 1, checked.stdout  # WARNING
    assert checked.stdout.startswith("RECEIVEWAL WARNING")
    assert STRAY in checked.stdout.splitlines()[0]
    assert json.loads(status_json(archive_dir))["state"]["archive_warning"]

    report, _ = verify_archive(archive_dir, jobs=1)
    (found,) = [p for p in report.problems if p.kind == "older_island"]
    assert found.file == STRAY
    assert found.severity == "warning"
    assert "000000010000000000000002" in found.detail  # the hole begins there
    assert not report.recoverable  # from the island's start, recovery stops at the hole
    after, _ = verify_archive(archive_dir, jobs=1, start_lsn=newest_start)
    assert [p.describe() for p in after.problems if p.severity == "error"] == []
    assert after.recoverable  # from a base backup after the hole it is


def status_json(directory: Path) -> str:
    """``receivewal status --json -D DIRECTORY``'s output."""
    return subprocess.run([sys.executable, "-m", "receivewal", "status", "--json", "-D",
                           str(directory)], capture_output=True, text=True, timeout=60,
                          check=False).stdout
