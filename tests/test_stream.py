"""receivewal stream against real servers: byte-identical archives, crash safety, feedback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.archives import assert_consecutive
from support.servers import PgServer, pg_bin
from support.streams import (
    PARTIAL,
    assert_identical_to_server,
    complete_segments,
    lsn_to_int,
    pg_waldump,
    receivewal,
    slot_restart_lsn,
    start_receivewal,
    stop,
    wait_for,
    wal_files,
)

from receivewal.archive.syncer import HOLD_ENV

pytestmark = pytest.mark.server
SEG = 16 << 20


@pytest.mark.shared_server
def test_streams_segments_through_slot_byte_identical_with_endpos(pg: PgServer,
                                                                  archive_dir: Path,
                                                                  receive_path: str) -> None:
    """Five+ segments through a slot with --endpos/--no-loop: identical files, last .partial,
    on each receive loop (streaming_started says which ran)."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    pg.generate_wal(5)
    endpos = pg.mid_segment_lsn()
    done = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                      "-E", endpos, "-n")
    assert done.returncode == 0, done.stderr
    names = assert_identical_to_server(archive_dir, pg)
    assert len(names) >= 5
    assert_consecutive(names)
    files = wal_files(archive_dir)
    assert files[-1].endswith(PARTIAL)
    assert files[-1].removesuffix(PARTIAL) > names[-1]
    # the .partial holds exactly the server's bytes up to endpos
    partial = (archive_dir / files[-1]).read_bytes()
    offset = lsn_to_int(endpos) % (16 << 20)
    server_copy = (pg.pg_wal / files[-1].removesuffix(PARTIAL)).read_bytes()
    assert partial[:offset] == server_copy[:offset]
    first = names[0]
    start = f"{int(first[8:16], 16):X}/{int(first[16:24], 16) << 24:X}"
    last_end = names[-1]
    end = f"{int(last_end[8:16], 16):X}/{(int(last_end[16:24], 16) + 1) << 24:X}"
    dump = pg_waldump(archive_dir, start, end)
    assert dump.returncode == 0, dump.stderr
    events = [json.loads(line) for line in done.stderr.splitlines()]
    started = [e for e in events if e["event"] == "streaming_started"]
    assert [e["receive_path"] for e in started] == [receive_path]
    assert "endpos_reached" in [e["event"] for e in events]


@pytest.mark.shared_server
def test_restart_continues_where_the_archive_stands(pg: PgServer, archive_dir: Path) -> None:
    """A second run resumes from the .partial left by the first and completes it."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    pg.generate_wal(1)
    first_end = pg.mid_segment_lsn()
    assert receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                      "-E", first_end, "-n").returncode == 0
    partial_before = [n for n in wal_files(archive_dir) if n.endswith(PARTIAL)]
    assert len(partial_before) == 1
    pg.generate_wal(2)
    second_end = pg.mid_segment_lsn()
    done = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                      "-E", second_end, "-n")
    assert done.returncode == 0, done.stderr
    names = assert_identical_to_server(archive_dir, pg)
    assert partial_before[0].removesuffix(PARTIAL) in names
    assert_consecutive(names)


@pytest.mark.shared_server
def test_sigkill_mid_stream_under_load_loses_nothing(pg: PgServer, archive_dir: Path,
                                                     tmp_path: Path) -> None:
    """SIGKILL at several points while pgbench writes; restarts end byte-identical, no gap."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    subprocess.run([pg_bin("pgbench"), "-i", "-q", "-s", "2", "-h", "127.0.0.1",
                    "-p", str(pg.port), "-U", "postgres", "postgres"],
                   check=True, capture_output=True)
    load = subprocess.Popen([pg_bin("pgbench"), "-T", "30", "-c", "2", "-n", "-h", "127.0.0.1",
                             "-p", str(pg.port), "-U", "postgres", "postgres"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = tmp_path / "receivewal.log"
    try:
        for kill_after in (0.2, 1.0, 2.5, 0.5):
            proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                                    "-s", "1", "--reconnect-delay", "0.2", stderr_path=log)
            time.sleep(kill_after)
            pg.generate_wal(1)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
    finally:
        load.terminate()
        load.wait(timeout=60)
    endpos = pg.mid_segment_lsn()
    done = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                      "-E", endpos, "-n")
    assert done.returncode == 0, done.stderr + log.read_text()
    names = assert_identical_to_server(archive_dir, pg)
    assert len(names) >= 4
    assert_consecutive(names)


@pytest.mark.shared_server
def test_slot_restart_lsn_never_passes_archived_wal_and_feedback_shape(
        pg: PgServer, archive_dir: Path, tmp_path: Path, receive_path: str) -> None:
    """With a slot: restart_lsn stays within what the archive holds; replay_lsn is NULL (on
    each receive loop: status replies between runs of WAL). Checked first while the syncer
    holds the first .partial's fsync and rename (a slow disk, held at will): the archive lists
    no segment file yet, its WAL is under the temporary name."""
    reserved = lsn_to_int(pg.sql("SELECT lsn FROM pg_create_physical_replication_slot('arch', "
                                 "true)"))
    hold = tmp_path / "hold"
    hold.touch()
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                            "-s", "0.2", env={HOLD_ENV: str(hold)},
                            stderr_path=tmp_path / "log")
    try:
        wait_for(lambda: list(archive_dir.glob(".*.partial.*receivewal-tmp")),
                 what="WAL written under the first .partial's temporary name")
        pg.sql("CREATE TABLE IF NOT EXISTS t (x int, pad text)")
        for _ in range(5):
            assert wal_files(archive_dir) == []  # held: not yet durable under its name
            assert_slot_within_archive(pg, archive_dir, reserved)
            time.sleep(0.1)
        hold.unlink()
        for _ in range(6):
            pg.sql("CREATE TABLE IF NOT EXISTS t (x int, pad text)")
            pg.sql("INSERT INTO t SELECT g, repeat('y', 300) FROM generate_series(1, 20000) g")
            for _ in range(5):
                assert_slot_within_archive(pg, archive_dir, reserved)
                time.sleep(0.1)
        row = pg.sql("SELECT write_lsn IS NOT NULL, flush_lsn IS NOT NULL, replay_lsn IS NULL, "
                     "application_name FROM pg_stat_replication")
        assert row == "t|t|t|receivewal"
    finally:
        hold.unlink(missing_ok=True)  # a held fsync would keep it from stopping
        assert stop(proc) == 0
    assert f'"receive_path": "{receive_path}"' in (tmp_path / "log").read_text()


def assert_slot_within_archive(server: PgServer, directory: Path, reserved: int) -> None:
    """The slot's restart_lsn is not beyond the WAL the archive's segment files hold.

    Until the walsender has taken a flush position from receivewal, restart_lsn is the
    server's own reservation at the slot's creation (``reserved``), which receivewal never
    reported: the walsender sets pg_stat_replication's flush_lsn before it moves the slot, so
    a flush_lsn still NULL after the slot was read means the slot had not moved. From the
    first report on, restart_lsn is receivewal's flush position."""
    restart = slot_restart_lsn(server, "arch")
    if server.sql("SELECT count(*) FROM pg_stat_replication WHERE flush_lsn IS NULL") == "1":
        assert restart == reserved, "restart_lsn moved without a flush report"
        return
    archived = archived_position(directory, server, reserved - reserved % SEG)
    assert restart <= archived, (
        f"slot ahead of archive: restart_lsn {restart:X}, archive matches the "
        f"server to {archived:X}; files {sorted(os.listdir(directory))}")


def archived_position(directory: Path, server: PgServer, start: int) -> int:
    """The end of the WAL the archive's segment files hold that matches the server byte for
    byte; ``start`` (where streaming began: nothing before it is the archive's to hold) while
    there is no segment file yet, only the first .partial's temporary name."""
    position = start
    for name in wal_files(directory):
        try:
            ours = (directory / name).read_bytes()
        except FileNotFoundError:  # completed (renamed) since the listing
            ours = (directory / name.removesuffix(PARTIAL)).read_bytes()
        theirs = (server.pg_wal / name.removesuffix(PARTIAL)).read_bytes()
        begins = (int(name[8:16], 16) * 256 + int(name[16:24], 16)) * SEG
        same = 0
        step = 8192
        while same < SEG and ours[same:same + step] == theirs[same:same + step]:
            same += step
        while same < SEG and ours[same] == theirs[same]:  # to the exact byte
            same += 1
        position = begins + same
    return position


@pytest.mark.shared_server
def test_without_slot_flush_is_not_reported(pg: PgServer, archive_dir: Path,
                                            tmp_path: Path) -> None:
    """No slot and no --synchronous: write is reported, flush and replay stay NULL."""
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-s", "0.2",
                            stderr_path=tmp_path / "log")
    try:
        wait_for(lambda: pg.sql("SELECT count(*) FROM pg_stat_replication "
                                "WHERE write_lsn IS NOT NULL") == "1", what="status update")
        row = pg.sql("SELECT flush_lsn IS NULL, replay_lsn IS NULL FROM pg_stat_replication")
        assert row == "t|t"
    finally:
        assert stop(proc) == 0


@pytest.mark.shared_server
def test_synchronous_reports_flush_without_slot(pg: PgServer, archive_dir: Path,
                                                tmp_path: Path) -> None:
    """--synchronous reports a flush position at once after data arrives."""
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "--synchronous",
                            "-s", "100", stderr_path=tmp_path / "log")
    try:
        wait_for(lambda: pg.sql("SELECT count(*) FROM pg_stat_replication") == "1",
                 what="replication connection")
        pg.sql("CREATE TABLE s (x int)")
        lsn = lsn_to_int(pg.current_lsn())
        wait_for(lambda: (v := pg.sql("SELECT flush_lsn FROM pg_stat_replication")) != ""
                 and lsn_to_int(v) >= lsn, timeout=20, what="flush_lsn to pass the insert")
    finally:
        assert stop(proc) == 0


@pytest.mark.shared_server
def test_sigterm_keeps_fsynced_partial_and_exits_zero(pg: PgServer, archive_dir: Path,
                                                      tmp_path: Path) -> None:
    """SIGTERM: the open segment stays .partial with the received bytes, exit code 0."""
    log = tmp_path / "log"
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-s", "0.2",
                            stderr_path=log)
    wait_for(lambda: any(n.endswith(PARTIAL) for n in wal_files(archive_dir)), what="partial")
    pg.sql("CREATE TABLE u (x int)")
    lsn = pg.current_lsn()
    wait_for(lambda: pg.sql("SELECT write_lsn >= '" + lsn + "' FROM pg_stat_replication")
             == "t", what="WAL to arrive")
    assert stop(proc, signal.SIGTERM) == 0
    partial = [n for n in wal_files(archive_dir) if n.endswith(PARTIAL)]
    assert len(partial) == 1
    offset = lsn_to_int(lsn) % (16 << 20)
    ours = (archive_dir / partial[0]).read_bytes()
    theirs = (pg.pg_wal / partial[0].removesuffix(PARTIAL)).read_bytes()
    assert ours[:offset] == theirs[:offset]
    assert "stop_requested" in log.read_text()


@pytest.mark.shared_server
def test_create_and_drop_slot_act_and_exit(pg: PgServer) -> None:
    """--create-slot (with --reserve-wal) and --drop-slot do their job and exit 0."""
    assert receivewal("stream", "-d", pg.dsn, "-S", "s1", "--create-slot",
                      "--reserve-wal").returncode == 0
    assert pg.sql("SELECT restart_lsn IS NOT NULL FROM pg_replication_slots "
                  "WHERE slot_name = 's1'") == "t"
    again = receivewal("stream", "-d", pg.dsn, "-S", "s1", "--create-slot")
    assert again.returncode == 1
    assert "already exists" in again.stderr
    assert receivewal("stream", "-d", pg.dsn, "-S", "s1", "--create-slot",
                      "--if-not-exists").returncode == 0
    assert receivewal("stream", "-d", pg.dsn, "-S", "s2", "--create-slot").returncode == 0
    assert pg.sql("SELECT restart_lsn IS NULL FROM pg_replication_slots "
                  "WHERE slot_name = 's2'") == "t"
    assert receivewal("stream", "-d", pg.dsn, "-S", "s1", "--drop-slot").returncode == 0
    assert pg.sql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 's1'") == "0"


@pytest.mark.shared_server
def test_refuses_archive_of_another_cluster(pg: PgServer, archive_dir: Path,
                                            server_base: Path) -> None:
    """An archive made from one cluster is refused for another; no archive file is touched.

    Only the daemon's own files change: the state file records the error for ``receivewal
    status`` and the lock file names the process that held the archive.
    """
    pg.generate_wal(1)
    endpos = pg.mid_segment_lsn()
    assert receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-E", endpos,
                      "-n").returncode == 0
    def archive_files() -> dict[str, int]:
        return {p.name: p.stat().st_mtime_ns for p in archive_dir.iterdir()
                if p.name not in (".receivewal-state.json", ".receivewal.lock")}

    before = archive_files()
    other = PgServer(server_base, "other")
    other.init()
    other.start()
    try:
        done = receivewal("stream", "-D", str(archive_dir), "-d", other.dsn, "-n")
    finally:
        other.stop("immediate")
    assert done.returncode == 1
    assert "belongs to database system" in done.stderr
    assert archive_files() == before


def test_no_loop_exits_one_when_the_server_goes_away(pg: PgServer, archive_dir: Path) -> None:
    """--no-loop: a lost connection ends the program with exit code 1."""
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-n")
    wait_for(lambda: pg.sql("SELECT count(*) FROM pg_stat_replication") == "1",
             what="replication connection")
    pg.stop("fast")
    assert proc.wait(timeout=30) == 1
    assert complete_segments(archive_dir) == []
