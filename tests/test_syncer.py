"""Overlapped durability: segments are fsynced and renamed in the background, and a flush
position is reported only once that is done."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from support.archives import assert_consecutive
from support.servers import PgServer
from support.streams import (
    PARTIAL,
    assert_identical_to_server,
    log_events,
    lsn_to_int,
    receivewal,
    slot_restart_lsn,
    start_receivewal,
    wait_for,
    wal_files,
)

from receivewal.archive.directory import Archive
from receivewal.archive.syncer import HOLD_ENV, PAUSE_ENV, SegmentSyncer, restart_point
from receivewal.archive.writer import SegmentWriter
from receivewal.errors import ArchiveError
from receivewal.wal.names import SegmentFile

SEG = 16 << 20


def test_restart_point_goes_back_over_consecutive_partials() -> None:
    """Two consecutive .partial files of one timeline: restream from the older one."""
    files = [SegmentFile(3, 1), SegmentFile(4, 1, partial=True), SegmentFile(5, 1, partial=True)]
    assert restart_point(files[2], files) == files[1]


def test_restart_point_keeps_a_lone_partial_and_complete_files() -> None:
    """A single .partial, a complete newest file, a partial of another timeline, a partial
    superseded by its complete file: nothing to go back over."""
    alone = [SegmentFile(3, 1), SegmentFile(4, 1, partial=True)]
    assert restart_point(alone[1], alone) == alone[1]
    complete = [SegmentFile(4, 1, partial=True), SegmentFile(5, 1)]
    assert restart_point(complete[1], complete) == complete[1]
    switched = [SegmentFile(4, 1, partial=True), SegmentFile(5, 2, partial=True)]
    assert restart_point(switched[1], switched) == switched[1]
    superseded = [SegmentFile(4, 1), SegmentFile(4, 1, "gzip", partial=True),
                  SegmentFile(5, 1, partial=True)]
    assert restart_point(superseded[2], superseded) == superseded[2]
    assert restart_point(None, []) is None


def test_syncer_runs_jobs_in_order_and_raises_a_failure_in_the_caller() -> None:
    """What the worker finished is told only as jobs finish, in order: the LSN every job
    before it reached and each completed segment with its end; a failed job's error reaches
    the caller and nothing submitted after it runs."""
    ran: list[int] = []
    syncer = SegmentSyncer()
    syncer.submit(200, lambda: ran.append(1), segment="a")
    syncer.submit(300, lambda: ran.append(2), segment="b")
    syncer.drain()
    assert ran == [1, 2]
    assert syncer.finished() == (300, [("a", 200), ("b", 300)])
    assert syncer.finished() == (300, [])  # each completed segment is told once
    assert not syncer.completing

    def fail() -> None:
        raise ArchiveError('could not complete segment "x": Input/output error')

    syncer.submit(400, fail, segment="c")
    syncer.submit(500, lambda: ran.append(3))
    with pytest.raises(ArchiveError, match="Input/output error"):
        syncer.close()
    assert ran == [1, 2]
    assert syncer.finished() == (300, [])


def test_the_writers_flushed_position_moves_on_its_own_thread_only(tmp_path: Path) -> None:
    """The flushed position has one holder, the writer's, moved on the caller's thread: a
    segment completed in the background moves it once the caller takes what the syncer
    finished (completed(), flush()), and never past that; the segment is told completed once
    it is in place under its final name, with the LSN it ends at."""
    seg = 1 << 20
    writer = SegmentWriter(Archive(tmp_path, sync=True), seg, 1, 0)
    try:
        assert writer.syncer is not None
        writer.write(0, b"x" * (seg + 100))
        assert writer.flushed == 0
        writer.syncer.drain()
        assert writer.flushed == 0, "the syncer's worker moved the writer's position"
        assert writer.completed() == [("000000010000000000000000", seg)]
        assert (tmp_path / "000000010000000000000000").stat().st_size == seg
        assert writer.flushed == seg
        assert writer.completed() == []
        assert writer.flush(wait=True) == writer.flushed == seg + 100
    finally:
        writer.close()


@pytest.mark.shared_server
@pytest.mark.server
def test_sigkill_during_background_fsync_reports_nothing_false_and_loses_nothing(
        pg: PgServer, archive_dir: Path, tmp_path: Path) -> None:
    """The syncer holds a completed segment before its fsync; meanwhile write moves past it
    but flush (and the slot's restart_lsn) stay before its end. SIGKILL there: the
    next run restreams it, completes it, and the archive equals the server's WAL."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    marker = tmp_path / "paused"
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                            "-s", "0.2", env={PAUSE_ENV: str(marker)},
                            stderr_path=tmp_path / "log")
    try:
        wait_for(lambda: pg.sql("SELECT count(*) FROM pg_stat_replication") == "1",
                 what="replication connection")
        pg.generate_wal(2)
        wait_for(lambda: marker.exists() and marker.read_text() != "", what="syncer paused")
        paused = marker.read_text()
        seg_start = (int(paused[8:16], 16) * 256 + int(paused[16:24], 16)) * SEG
        wait_for(lambda: lsn_to_int(pg.sql("SELECT write_lsn FROM pg_stat_replication"))
                 > seg_start + SEG, what="write reported past the paused segment")
        flush = lsn_to_int(pg.sql("SELECT flush_lsn FROM pg_stat_replication"))
        restart = lsn_to_int(pg.sql(
            "SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = 'arch'"))
        # a status may have fsynced part of it before it completed, never all of it
        assert flush < seg_start + SEG, "flush reported for a segment not yet fsynced"
        assert restart <= flush
        assert paused + PARTIAL in wal_files(archive_dir)  # never renamed before its fsync
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    endpos = pg.mid_segment_lsn()
    done = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                      "-E", endpos, "-n")
    assert done.returncode == 0, done.stderr
    names = assert_identical_to_server(archive_dir, pg)
    assert paused in names
    assert_consecutive(names)
    assert [n for n in wal_files(archive_dir) if n.endswith(PARTIAL)] == \
        [wal_files(archive_dir)[-1]]


@pytest.mark.shared_server
@pytest.mark.server
def test_sigterm_while_the_disk_holds_every_fsync_stops_in_time_and_claims_nothing(
        pg: PgServer, archive_dir: Path, tmp_path: Path) -> None:
    """The syncer held (a disk that does not finish an fsync): SIGTERM still ends the daemon
    within its bound (it waited inside flush for ever, past the unit's TimeoutStopSec), exit 1
    with a line saying from where WAL is not durable; the slot never passed what is durable,
    and the next run completes the held segment from the server."""
    pg.sql("SELECT pg_create_physical_replication_slot('held', true)")
    hold, log = tmp_path / "hold", tmp_path / "log"
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "held",
                            "-s", "0.2", "--log-format", "json", stderr_path=log,
                            env={HOLD_ENV: str(hold), "RECEIVEWAL_TEST_STOP_SYNC": "1"})
    try:
        wait_for(lambda: pg.sql("SELECT count(*) FROM pg_stat_replication") == "1",
                 what="replication connection")
        held = pg.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
        wait_for(lambda: held + PARTIAL in wal_files(archive_dir), what="its .partial")
        hold.touch()  # from now on nothing becomes durable
        held_end = (int(held[8:16], 16) * 256 + int(held[16:24], 16) + 1) * SEG
        pg.generate_wal(1)
        wait_for(lambda: lsn_to_int(pg.sql("SELECT write_lsn FROM pg_stat_replication"))
                 > held_end, what="write reported past the held segment")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    assert code == 1
    failed = [e for e in log_events(log.read_text()) if e["event"] == "failed"]
    assert len(failed) == 1
    assert "not durable" in str(failed[0]["error"])
    assert "Traceback" not in log.read_text()
    assert held not in wal_files(archive_dir)  # never completed: its fsync never ran
    assert slot_restart_lsn(pg, "held") < held_end  # never told more than the disk holds
    hold.unlink()
    done = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "held",
                      "-E", pg.mid_segment_lsn(), "-n")
    assert done.returncode == 0, done.stderr
    assert held in assert_identical_to_server(archive_dir, pg)
