"""Every PostgreSQL major a user runs (issue 33): 15 from the system's packages, 17 and 18 from
the wheels of the test extra. Before, the WAL readers knew PostgreSQL 15's page magic only
(0xD110; 17 writes 0xD116, 18 0xD118): restore refused every segment of a 17 or 18 archive
with exit 126 and every recovery failed, verify called a good archive NOT recoverable, and a
restarted daemon rejected every file it had written and streamed it again.

One server per major for the module (1 MiB segments): a slot, a base backup, marker rows each
in a segment of its own, streamed by ``receivewal stream`` into an archive. A segment of a
major receivewal does not know is refused with one line naming its magic and the majors known.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.backups import give_to_postgres, start_recovered
from support.postgres_user import install_for_postgres, readable_by_postgres
from support.recovery import copy_of, recover_or_stop
from support.servers import SERVER_MAJORS, PgServer, make_shared_dir
from support.streams import (
    assert_identical_to_server,
    complete_segments,
    log_events,
    receivewal,
    start_streaming,
    stop,
)
from support.walgen import name_of, wal_segment

from receivewal.wal.majors import PAGE_MAGICS, known_majors, server_major_problem
from receivewal.wal.pageheader import XLOG_BLCKSZ
from receivewal.wal.pages import check_pages

pytestmark = pytest.mark.server

SEGMENT = 1 << 20
MARKERS = 4


@dataclass(frozen=True)
class Setup:
    major: int
    base: Path
    primary: PgServer  # running, with the slot "arch"
    backup: PgServer  # a base backup taken after the slot, stopped
    archive: Path  # streamed by receivewal past the last marker row
    command: str  # the restore_command prefix, runnable by the server user
    first_run: str  # the first stream run's stderr


def stream(setup_archive: Path, primary: PgServer) -> subprocess.CompletedProcess[str]:
    """``receivewal stream`` through the slot to a position past the server's newest rows."""
    endpos = primary.endpos_inside_the_wal()
    return receivewal("stream", "-D", str(setup_archive), "-d", primary.dsn, "-S", "arch",
                      "-E", endpos, "-n", "--log-format", "json")


@pytest.fixture(scope="module", params=SERVER_MAJORS, ids=[f"pg{m}" for m in SERVER_MAJORS])
def setup(request: pytest.FixtureRequest) -> Iterator[Setup]:
    major: int = request.param
    base = make_shared_dir(f"receivewal-pg{major}-")
    primary = PgServer(base, "primary", major)
    try:
        primary.init(initdb_args=("--wal-segsize=1",))
        primary.start()
        assert primary.sql("SHOW server_version_num")[:2] == str(major)
        primary.sql("SELECT pg_create_physical_replication_slot('arch', true)")
        backup = primary.base_backup("backup")
        primary.sql("CREATE TABLE marker (n int)")
        primary.sql("CREATE TABLE filler (id bigint, pad text)")
        for n in range(1, MARKERS + 1):
            primary.sql(f"INSERT INTO marker VALUES ({n})")
            primary.sql("INSERT INTO filler SELECT g, repeat('x', 150) "
                        "FROM generate_series(1, 2500) g")
            primary.switch_wal()
        archive = base / "archive"
        archive.mkdir()
        done = stream(archive, primary)
        assert done.returncode == 0, done.stderr[-3000:]
        yield Setup(major, base, primary, backup, archive, install_for_postgres(base),
                    done.stderr)
    finally:
        primary.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def test_streaming_is_byte_for_byte(setup: Setup) -> None:
    """The archive's complete segments are the server's own files, the markers' among them."""
    names = assert_identical_to_server(setup.archive, setup.primary)
    assert len(names) >= MARKERS


def test_verify_calls_the_archive_recoverable(setup: Setup) -> None:
    """``receivewal verify`` reads every record of the archive and exits 0 (recoverable).
    Before: 'invalid magic number D116, expected D110' on every page, NOT recoverable."""
    done = subprocess.run([sys.executable, "-m", "receivewal", "verify", str(setup.archive)],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "invalid magic" not in done.stdout + done.stderr


def test_restore_serves_a_pitr_that_reaches_every_marker(setup: Setup) -> None:
    """A copy of the base backup recovers from the archive through ``receivewal restore``
    (prefetch on: the filler checks too) and promotes with every marker row. Before: exit 126
    on the first segment, and the server stopped."""
    readable_by_postgres(setup.archive)
    server = copy_of(setup.backup, "recovered")
    try:
        promoted = recover_or_stop(
            server, f"RECEIVEWAL_PREFETCH_IDLE=3 {setup.command} -D {setup.archive} %f %p")
        log = server.logfile.read_text()
        assert promoted, log[-3000:]
        assert server.sql("SELECT count(*) FROM marker") == str(MARKERS)
        assert "receivewal restore: error" not in log
    finally:
        server.stop("immediate")
        shutil.rmtree(server.datadir, ignore_errors=True)


def test_a_restarted_daemon_accepts_its_own_files(setup: Setup) -> None:
    """A second ``receivewal stream`` run takes the files the first wrote as they are and
    resumes after them: no file rejected, the archive still the server's bytes. Before:
    every file rejected ('invalid magic number D116, expected D110'), streamed again."""
    before = complete_segments(setup.archive)
    setup.primary.switch_wal()
    done = stream(setup.archive, setup.primary)
    assert done.returncode == 0, done.stderr[-3000:]
    rejected = [e for e in log_events(done.stderr) if e["event"] == "segment_file_rejected"]
    assert rejected == []
    after = assert_identical_to_server(setup.archive, setup.primary)
    assert after[:len(before)] == before
    assert len(after) > len(before)


def test_backup_and_recover_reach_the_rows_written_after_the_backup(setup: Setup) -> None:
    """``receivewal backup`` while the daemon streams (BASE_BACKUP, the manifest of the
    server's version checked), then ``receivewal recover`` of it into a new PGDATA: the server
    recovers through ``receivewal restore`` and holds the row written after the backup."""
    daemon = start_streaming("-D", str(setup.archive), "-d", setup.primary.dsn, "-S", "arch",
                             log=setup.base / "daemon.log")
    try:
        done = receivewal("backup", "-D", str(setup.archive), "-d", setup.primary.dsn, "--fast",
                          "--wal-wait", "120", timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        setup.primary.sql("CREATE TABLE after_backup (n int)")
        setup.primary.sql("INSERT INTO after_backup VALUES (7)")
        setup.primary.switch_wal()
        setup.primary.switch_wal()
    finally:
        assert stop(daemon) == 0, (setup.base / "daemon.log").read_text()[-3000:]
    pgdata = setup.base / "from-backup"
    done = receivewal("recover", "latest", "--to", str(pgdata), "-D", str(setup.archive),
                      "--restore-command-prefix", setup.command, "--no-sync", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    readable_by_postgres(setup.archive)
    give_to_postgres(pgdata)
    server = start_recovered(setup.base, "from-backup", major=setup.major)
    try:
        assert server.sql("SELECT n FROM after_backup") == "7"
        assert server.sql("SELECT count(*) FROM marker") == str(MARKERS)
    finally:
        server.stop("immediate")


def run_restore(archive: Path, name: str, target: Path) -> subprocess.CompletedProcess[str]:
    """``receivewal restore -D archive name target`` without prefetch."""
    return subprocess.run([sys.executable, "-m", "receivewal", "restore", "-D", str(archive),
                           "--prefetch", "0", name, str(target)],
                          capture_output=True, text=True, check=False, timeout=60)


@pytest.mark.parametrize("major", sorted(PAGE_MAGICS))
def test_restore_serves_a_segment_of_each_known_major(tmp_path: Path, major: int) -> None:
    """A well-formed segment with the page magic of any major receivewal knows is served."""
    name = name_of(3, segment_size=SEGMENT)
    (tmp_path / name).write_bytes(wal_segment(3, segment_size=SEGMENT, magic=PAGE_MAGICS[major]))
    done = run_restore(tmp_path, name, tmp_path / "RECOVERYXLOG")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "RECOVERYXLOG").read_bytes() == (tmp_path / name).read_bytes()


def test_a_segment_of_an_unknown_major_is_refused_in_one_line(tmp_path: Path) -> None:
    """A segment whose pages carry 0xD120 (no major receivewal knows) is refused: exit 126 and
    one line naming the magic and the majors known, never served."""
    name = name_of(3, segment_size=SEGMENT)
    (tmp_path / name).write_bytes(wal_segment(3, segment_size=SEGMENT, magic=0xD120))
    done = run_restore(tmp_path, name, tmp_path / "RECOVERYXLOG")
    assert done.returncode == 126
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert name in lines[0]
    assert "invalid magic number D120" in lines[0]
    assert known_majors() in lines[0]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "RECOVERYXLOG").exists()


def test_a_page_of_another_major_inside_a_segment_is_refused() -> None:
    """Every page of a segment carries its first page's magic: a PostgreSQL 16 page inside a
    PostgreSQL 17 segment is a damaged page, named with the magic expected."""
    data = bytearray(wal_segment(3, segment_size=SEGMENT, magic=PAGE_MAGICS[17]))
    data[5 * XLOG_BLCKSZ:5 * XLOG_BLCKSZ + 2] = PAGE_MAGICS[16].to_bytes(2, "little")
    _, findings = check_pages(bytes(data), data_len=len(data), start_lsn=3 * SEGMENT,
                              segment_size=SEGMENT, timeline=1, partial=False)
    assert findings == [("bad_page_header", 3 * SEGMENT + 5 * XLOG_BLCKSZ,
                         "invalid magic number D113, expected D116 (PostgreSQL 17, as the "
                         "segment's first page)")]


@pytest.mark.parametrize(("server_version", "said"), [
    (150018, None), (160010, None), (170010, None), (180006, None),
    (140020, "the server is PostgreSQL 14; this receivewal knows the WAL of PostgreSQL 15 to 18"),
    (190001, "the server is PostgreSQL 19; this receivewal knows the WAL of PostgreSQL 15 to 18"),
])
def test_a_server_of_an_unknown_major_is_refused(server_version: int, said: str | None) -> None:
    """The daemon refuses a server whose WAL it cannot read back (its files would be refused
    on every restart, by restore and by verify), in one line naming both."""
    assert server_major_problem(server_version) == said
