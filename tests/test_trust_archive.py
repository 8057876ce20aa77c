"""The archive cannot be tricked: a second writer, stray files, symlinks, malformed identity
files, crashes while a -Z segment is restreamed or a segment is preallocated.

Each test reproduces a case of issue 11 against real files (and a real server where the case
needs one): nothing the directory holds may make receivewal skip, lose or misreport WAL.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
from pathlib import Path

import pytest
from support.archives import (
    assert_consecutive,
    decoded,
    partial_files,
    proven_segment,
    segment_files,
)
from support.dropin import DROPIN
from support.servers import PgServer
from support.streams import (
    assert_identical_to_server,
    log_events,
    lsn_to_int,
    receivewal,
    slot_restart_lsn,
    start_receivewal,
    stop,
    wait_for,
    wal_files,
)

from receivewal.archive.compression import CompressSpec
from receivewal.archive.directory import Archive
from receivewal.archive.durable import TEMP_SUFFIX, temporary_name
from receivewal.archive.files import CRASH_ENV, PREALLOCATE_ENV, preallocate
from receivewal.archive.layout import older_islands
from receivewal.archive.writer import open_segment_writer
from receivewal.commands.pg_receivewal import PgReceivewalMessages
from receivewal.daemon.state import State, write_state
from receivewal.errors import ArchiveError
from receivewal.replication.commands import ServerInfo
from receivewal.wal.names import SegmentFile
from receivewal.walreceiver.startpoint import (
    ArchiveWarning,
    OlderIsland,
    SegmentFileRejected,
    read_archive,
)

SEGMENT = 16 << 20
KILLED = -9


def slot_restart(pg: PgServer) -> int:
    """The restart_lsn of the tests' slot."""
    return slot_restart_lsn(pg, "arch")


# -- 1. one writer per archive ------------------------------------------------------------------
@pytest.mark.shared_server
@pytest.mark.server
def test_second_writer_is_refused_before_touching_anything(pg: PgServer, archive_dir: Path,
                                                           tmp_path: Path) -> None:
    """A second ``stream`` (or drop-in) on a directory in use exits 1 naming the holder, and
    the first keeps streaming an archive identical to the server's."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    pg.sql("SELECT pg_create_physical_replication_slot('other', true)")
    first = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                             "-s", "0.2", stderr_path=tmp_path / "first.log")
    try:
        wait_for(lambda: any(n.endswith(".partial") for n in wal_files(archive_dir)),
                 what="the first writer's .partial")
        expected = f"archive {archive_dir} is in use by pid {first.pid} on {socket.gethostname()}"
        for slot in ("arch", "other"):
            second = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", slot, "-n")
            assert second.returncode == 1, second.stderr
            assert expected in second.stderr
            assert "Traceback" not in second.stderr
        dropin = subprocess.run([str(DROPIN), "-D", str(archive_dir), "-d", pg.dsn, "-S",
                                 "other", "-n"], capture_output=True, text=True, timeout=60,
                                check=False)
        assert dropin.returncode == 1, dropin.stderr
        assert expected in dropin.stderr
        pg.generate_wal(2)
        target = lsn_to_int(pg.current_lsn())
        wait_for(lambda: slot_restart(pg) >= target, what="the first writer to catch up")
    finally:
        assert stop(first) == 0
    assert "could not complete segment" not in (tmp_path / "first.log").read_text()
    names = assert_identical_to_server(archive_dir, pg)
    assert len(names) >= 2
    assert_consecutive(names)
    state = json.loads((archive_dir / ".receivewal-state.json").read_text())
    assert state["pid"] == first.pid


# -- 2. a stray file never makes it skip WAL ------------------------------------------------------
def switch_until(pg: PgServer, lsn: int) -> None:
    """Switch segments until the server's insert position is at or past ``lsn``."""
    while lsn_to_int(pg.current_lsn()) < lsn:
        pg.switch_wal()


@pytest.mark.server
def test_stray_file_named_like_a_newer_segment_does_not_skip_wal(pg: PgServer,
                                                                 archive_dir: Path) -> None:
    """Archive ends at 0B; a random file named ...11 is placed: streaming restarts at 0C, the
    stray file is reported by name, and the slot never passes what the archive holds."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    switch_until(pg, 0x14000000)
    first = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                       "-E", "0/C000000", "-n")
    assert first.returncode == 0, first.stderr
    assert max(wal_files(archive_dir)) == "00000001000000000000000B"
    stray = archive_dir / "000000010000000000000011"
    stray.write_bytes(os.urandom(SEGMENT))
    done = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                      "-E", "0/13000000", "-n")
    assert done.returncode == 0, done.stderr
    events = log_events(done.stderr)
    started = [e["start_lsn"] for e in events if e["event"] == "streaming_started"]
    assert started[0] == "0/C000000"
    assert any(e["event"] == "segment_file_rejected" and "000000010000000000000011" in
               str(e["file"]) for e in events), done.stderr
    names = assert_identical_to_server(archive_dir, pg)  # the stray file was replaced
    assert names[-1] == "000000010000000000000012"
    assert_consecutive(names)
    assert slot_restart(pg) <= 0x13000000




def test_resume_point_needs_content_proof_and_resumes_in_the_newest_run(tmp_path: Path) -> None:
    """Names are not trusted: a file whose header belongs to another segment or system, and
    random bytes are passed over, each named. Streaming resumes in the run of segments that
    ends at the archive's end; an older run before a hole is an island (issue 18 item 13)."""
    for segno in range(1, 5):
        (tmp_path / f"00000001000000000000000{segno}").write_bytes(proven_segment(segno))
    (tmp_path / "000000010000000000000009").write_bytes(proven_segment(9))  # after a hole
    archive = Archive(tmp_path)
    newest, rejected = archive.resume_point(SEGMENT, 7)
    assert newest is not None
    assert newest.segno == 9
    assert rejected == []
    assert older_islands((f.segno for f in archive.segment_names(SEGMENT)), 9) == [(1, 4, 8)]
    (tmp_path / "000000010000000000000009").write_bytes(os.urandom(SEGMENT))
    (tmp_path / "000000010000000000000004").write_bytes(proven_segment(3))  # wrong address
    (tmp_path / "000000010000000000000003").write_bytes(os.urandom(SEGMENT))
    newest, rejected = archive.resume_point(SEGMENT, 7)
    assert newest is not None
    assert newest.segno == 2
    assert rejected[0].file == "000000010000000000000009"
    assert "invalid magic number" in rejected[0].reason
    assert "page address 0/3000000, expected 0/4000000" in rejected[1].reason
    assert "invalid magic number" in rejected[2].reason
    newest, rejected = archive.resume_point(SEGMENT, 8)  # another system's archive
    assert newest is None
    assert "system identifier 7, expected 8" in rejected[-1].reason


def test_start_up_findings_are_typed_and_stated_as_events(tmp_path: Path) -> None:
    """What start-up reads in the archive comes back typed: the resume point, the files passed
    over with their reasons, the older islands, where to restream from (the oldest of two
    consecutive .partial files); and as the events that state them, in that order."""
    for segno in (1, 2, 5, 6):
        (tmp_path / f"00000001000000000000000{segno}").write_bytes(proven_segment(segno))
    (tmp_path / "000000010000000000000007.partial").write_bytes(proven_segment(7))
    (tmp_path / "000000010000000000000008.partial").write_bytes(bytes(SEGMENT))
    (tmp_path / "000000010000000000000009").write_bytes(os.urandom(SEGMENT))
    archive = Archive(tmp_path)
    info = ServerInfo("7", 1, 10 * SEGMENT, SEGMENT, 0o600, 150000)
    found = read_archive(archive, archive.segment_names(SEGMENT), info)
    assert found.newest == SegmentFile(8, 1, partial=True)
    assert found.restart == SegmentFile(7, 1, partial=True)
    assert [(r.file, "invalid magic number" in r.reason) for r in found.rejected] == \
        [("000000010000000000000009", True)]
    assert found.islands == [("000000010000000000000001", "000000010000000000000002",
                              "000000010000000000000003", "000000010000000000000004")]
    events = found.events()
    assert [type(event) for event in events] == [SegmentFileRejected, OlderIsland,
                                                 ArchiveWarning]
    assert events[1] == OlderIsland(*found.islands[0])
    assert events[2] == ArchiveWarning(
        "older island 000000010000000000000001 .. 000000010000000000000002 before a hole "
        "(000000010000000000000003 .. 000000010000000000000004 missing), not resumed from")


# -- 3. writing never follows a symlink -----------------------------------------------------------
def _victim(tmp_path: Path, size: int = 800) -> tuple[Path, bytes]:
    """A file outside the archive that a symlink in it points to."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious" * (size // 8))
    victim.chmod(0o644)
    return victim, victim.read_bytes()


@pytest.mark.parametrize("method", ["", "gzip", "zstd"])
def test_symlinked_partial_is_an_error_and_the_target_is_untouched(tmp_path: Path,
                                                                   method: str) -> None:
    """A symlink where the .partial should be: an error naming it; nothing reaches the target."""
    archive_dir = tmp_path / "archive"
    archive_dir.mkdir()
    victim, before = _victim(tmp_path, SEGMENT)  # the size of a preallocated .partial
    suffix = {"": "", "gzip": ".gz", "zstd": ".zst"}[method]
    link = archive_dir / f"000000010000000000000001{suffix}.partial"
    link.symlink_to(victim)
    writer = open_segment_writer(Archive(archive_dir), SEGMENT, 1, SEGMENT, CompressSpec(method))
    with pytest.raises(ArchiveError, match=str(link)):
        writer.write(SEGMENT, b"\x01" * 8192)
    writer.close()
    assert victim.read_bytes() == before
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert link.is_symlink()


def test_small_files_are_never_written_through_a_symlinked_temporary(tmp_path: Path) -> None:
    """State, identity and history files: a symlink at the old temporary name is not followed."""
    archive_dir = tmp_path / "archive"
    archive_dir.mkdir()
    victim, before = _victim(tmp_path)
    for name in (".receivewal-state.json.tmp", ".receivewal-archive.json.tmp",
                 "00000002.history.tmp"):
        (archive_dir / name).symlink_to(victim)
    write_state(archive_dir, State(pid=1, hostname="h", started_at=0.0, updated_at=0.0))
    archive = Archive(archive_dir)
    archive.write_file_durably(".receivewal-archive.json", b"{}\n")
    archive.write_file_durably("00000002.history", b"1\t0/3000000\tno recovery target\n")
    assert victim.read_bytes() == before
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert json.loads((archive_dir / ".receivewal-state.json").read_text())["pid"] == 1


# -- 7. a malformed identity file is one line, exit 1 ---------------------------------------------
@pytest.mark.shared_server
@pytest.mark.server
def test_malformed_identity_file_is_one_line_and_exit_one(pg: PgServer, archive_dir: Path
                                                          ) -> None:
    """Nested, wrongly typed or out-of-range identity values: exit 1, one line, no traceback."""
    sysid = pg.sql("SELECT system_identifier FROM pg_control_system()")
    bad = [
        "[" * 100000 + "]" * 100000,
        '{"system_identifier": {"a": 1}, "wal_segment_size": 16777216, "timeline": 1}',
        f'{{"system_identifier": "{sysid}", "wal_segment_size": -5, "timeline": 1}}',
        f'{{"system_identifier": "{sysid}", "wal_segment_size": 16777216, "timeline": 0}}',
        f'{{"system_identifier": "{sysid}", "wal_segment_size": 1e400, "timeline": 1}}',
        '{"system_identifier": "not a number", "wal_segment_size": 16777216, "timeline": 1}',
        "\xff\xfe garbage",
    ]
    identity = archive_dir / ".receivewal-archive.json"
    for text in bad:
        identity.write_text(text, errors="surrogateescape")
        done = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-n")
        assert done.returncode == 1, (text[:80], done.stderr[-2000:])
        assert "Traceback" not in done.stderr, done.stderr[-2000:]
        assert str(identity) in done.stderr
        assert segment_files(archive_dir) == []


# -- 8. -Z restart never destroys durable WAL -----------------------------------------------------
def held_end(directory: Path, pg: PgServer) -> int:
    """The end LSN of the WAL the archive's newest file holds, checked against the server."""
    newest = max(segment_files(directory), key=lambda n: (n[:24], not n.endswith(".partial")))
    start = (int(newest[8:16], 16) * 256 + int(newest[16:24], 16)) * SEGMENT
    data = decoded(directory / newest, truncated_ok=True)
    assert data == (pg.pg_wal / newest[:24]).read_bytes()[: len(data)], newest
    return start + len(data)


@pytest.mark.shared_server
@pytest.mark.server
@pytest.mark.parametrize("method", ["gzip", "lz4", "zstd"])
def test_compressed_restart_keeps_durable_wal_at_every_step(pg: PgServer, archive_dir: Path,
                                                           method: str) -> None:
    """SIGKILL at each step of resuming a -Z .partial: what is on disk still holds everything
    the slot claims, and the old .partial is not shortened."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    base = ("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch", "-Z", method,
            "-s", "0.1")
    pg.generate_wal(1)
    for point in ("compressed_restart", "first_write", "first_flush"):
        done = receivewal(*base, "-E", pg.mid_segment_lsn(), "-n")
        assert done.returncode == 0, done.stderr
        held = held_end(archive_dir, pg)
        assert slot_restart(pg) <= held
        pg.mid_segment_lsn()
        killed = receivewal(*base, env={CRASH_ENV: point})
        assert killed.returncode == KILLED, (point, killed.stderr[-2000:])
        assert held_end(archive_dir, pg) >= held, point
        assert slot_restart(pg) <= held_end(archive_dir, pg), point
    done = receivewal(*base, "-E", pg.mid_segment_lsn(), "-n")
    assert done.returncode == 0, done.stderr
    assert len(partial_files(archive_dir)) == 1
    assert not [n for n in os.listdir(archive_dir) if n.endswith(".receivewal-tmp")]


def test_the_lock_holder_removes_the_temporaries_of_every_version(tmp_path: Path) -> None:
    """At start-up the lock holder removes the temporary files a crash left: of the one naming
    rule (this process's, another's) and of earlier versions (the writer's fixed name,
    mkstemp's random one, the writable-directory probe), and nothing else."""
    seg = "000000010000000000000003.partial"
    leftovers = [temporary_name(seg), temporary_name(seg, "4242-0badcafe"),
                 f".{seg}.receivewal-tmp", ".receivewal-state.json.k3j2_x0q.receivewal-tmp",
                 ".receivewal-probe-a1b2c3d4"]
    kept = ["000000010000000000000001", seg, ".receivewal-archive.json", "notes.tmp"]
    for name in leftovers + kept:
        (tmp_path / name).write_bytes(b"x")
    archive = Archive(tmp_path)
    try:
        assert sorted(archive.lock().removed) == sorted(leftovers)
    finally:
        archive.unlock()
    assert sorted(os.listdir(tmp_path)) == sorted([*kept, ".receivewal.lock"])


# -- 9. preallocation a crash cannot leave half done ----------------------------------------------
@pytest.mark.parametrize("zeros", [False, True])
def test_preallocate_reserves_the_whole_segment(tmp_path: Path, zeros: bool) -> None:
    """The fallocate system call, or zeros in large blocks: a full-size, allocated file."""
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        preallocate(fd, SEGMENT, zeros=zeros)
    finally:
        os.close(fd)
    assert path.stat().st_size == SEGMENT
    assert path.stat().st_blocks * 512 >= SEGMENT
    assert path.read_bytes() == bytes(SEGMENT)


@pytest.mark.shared_server
@pytest.mark.server
def test_killed_during_preallocation_restart_works(pg: PgServer, archive_dir: Path) -> None:
    """SIGKILL while zero-filling a new segment (the fallback path): no short .partial is left,
    and the next run starts and archives byte-identical segments."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    killed = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                        env={PREALLOCATE_ENV: "zeros", CRASH_ENV: "preallocating"})
    assert killed.returncode == KILLED, killed.stderr[-2000:]
    assert wal_files(archive_dir) == []  # no .partial of the wrong size: only a temporary
    assert [n for n in os.listdir(archive_dir) if n.startswith(".000000010")
            and ".partial." in n and n.endswith(TEMP_SUFFIX)]
    pg.generate_wal(1)
    done = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                      "-E", pg.mid_segment_lsn(), "-n", env={PREALLOCATE_ENV: "zeros"})
    assert done.returncode == 0, done.stderr
    assert_identical_to_server(archive_dir, pg)
    for name in wal_files(archive_dir):
        assert (archive_dir / name).stat().st_size == SEGMENT
    assert not [n for n in os.listdir(archive_dir) if n.endswith(".receivewal-tmp")]


def test_dropin_says_which_segment_file_it_passed_over() -> None:
    """The drop-in prints a rejected file as pg_receivewal words its warnings."""
    line = PgReceivewalMessages(0).event_line(SegmentFileRejected(
        "000000010000000000000011", "invalid magic number 1234, expected D110"))
    assert line == ('warning: segment file "000000010000000000000011" invalid magic number '
                    "1234, expected D110, skipping")
