"""Timelines: following a promotion, restarting on an older timeline, PITR through the switch,
hot standby feedback on a slot, and failover across a two-host connection string."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.servers import PgServer
from support.streams import (
    PARTIAL,
    complete_segments,
    lsn_to_int,
    receivewal,
    start_receivewal,
    stop,
    wait_for,
    wal_files,
)

pytestmark = [pytest.mark.server, pytest.mark.slow]


def wait_replayed(primary: PgServer, standby: PgServer) -> None:
    """Wait until the standby has replayed everything the primary wrote so far."""
    target = lsn_to_int(primary.current_lsn())
    wait_for(lambda: lsn_to_int(standby.current_lsn()) >= target, what="standby replay")


def assert_timeline_archive(archive: Path, promoted: PgServer) -> None:
    """The layout after following a promotion: history, old .partial, identical tl 2 files."""
    names = wal_files(archive)
    assert "00000002.history" in {p.name for p in archive.iterdir()}
    history = (archive / "00000002.history").read_text()
    assert history == (promoted.pg_wal / "00000002.history").read_text()
    tl1_partial = [n for n in names if n.startswith("00000001") and n.endswith(PARTIAL)]
    assert len(tl1_partial) == 1, names
    tl2 = [n for n in complete_segments(archive) if n.startswith("00000002")]
    assert tl2, names
    for name in tl2:
        assert (archive / name).read_bytes() == (promoted.pg_wal / name).read_bytes(), name
    # the tl 2 segments start at the segment holding the switch point and have no gap
    switch_seg = tl1_partial[0][8:24]
    numbers = sorted(int(n[8:16], 16) * 256 + int(n[16:24], 16) for n in tl2)
    assert numbers[0] == int(switch_seg[:8], 16) * 256 + int(switch_seg[8:], 16)
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))


def promote_and_write(primary: PgServer, standby: PgServer) -> str:
    """Promote the standby, write on the new timeline, switch; return an endpos after it."""
    primary.stop("fast")
    standby.promote()
    standby.generate_wal(2, table="after_promotion")
    standby.sql("CREATE TABLE IF NOT EXISTS tail2 (x int)")
    standby.sql("INSERT INTO tail2 SELECT generate_series(1, 1000)")
    return standby.current_lsn()


def test_follows_promotion_of_cascading_source_without_restart(
        pg: PgServer, archive_dir: Path, tmp_path: Path, receive_path: str) -> None:
    """Streaming from a standby that is promoted: continue on timeline 2 on the same run, on
    each receive loop."""
    standby = pg.make_standby("standby")
    pg.generate_wal(2)
    wait_replayed(pg, standby)
    log = tmp_path / "log"
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", standby.dsn, "-s", "0.5",
                            stderr_path=log)
    try:
        wait_for(lambda: any(n.endswith(PARTIAL) for n in wal_files(archive_dir)),
                 what="streaming to start")
        pg.generate_wal(1)
        wait_replayed(pg, standby)
        endpos = lsn_to_int(promote_and_write(pg, standby))
        wait_for(lambda: any(n.startswith("00000002") for n in complete_segments(archive_dir))
                 and standby.sql("SELECT write_lsn FROM pg_stat_replication") != ""
                 and lsn_to_int(standby.sql("SELECT write_lsn FROM pg_stat_replication"))
                 >= endpos, timeout=60, what="timeline 2 to be archived")
    finally:
        assert stop(proc) == 0
        standby.stop("immediate")
    text = log.read_text()
    assert "timeline_switched" in text
    assert text.count('"streaming_started"') == 2  # tl 1 then tl 2, one process, one connection
    assert text.count(f'"receive_path": "{receive_path}"') == 2
    assert "disconnected" not in text
    assert_timeline_archive(archive_dir, standby)


def test_restart_on_older_timeline_follows_to_the_new_one(pg: PgServer,
                                                           archive_dir: Path) -> None:
    """Archive stops on timeline 1, server is on 2: stream 1 to the switch, then follow."""
    standby = pg.make_standby("standby")
    pg.generate_wal(2)
    wait_replayed(pg, standby)
    pg.mid_segment_lsn()
    wait_replayed(pg, standby)
    first_end = standby.current_lsn()
    done = receivewal("stream", "-D", str(archive_dir), "-d", standby.dsn, "-E", first_end, "-n")
    assert done.returncode == 0, done.stderr
    assert all(n.startswith("00000001") for n in wal_files(archive_dir))
    pg.generate_wal(1)
    wait_replayed(pg, standby)
    try:
        endpos = promote_and_write(pg, standby)
        done = receivewal("stream", "-D", str(archive_dir), "-d", standby.dsn, "-E", endpos, "-n")
        assert done.returncode == 0, done.stderr
        assert "timeline_switched" in done.stderr
        assert_timeline_archive(archive_dir, standby)
    finally:
        standby.stop("immediate")


@pytest.mark.parametrize("segments", [3, 0])
def test_archive_past_the_fork_goes_on_with_the_promoted_standby(pg: PgServer,
                                                                  archive_dir: Path,
                                                                  segments: int) -> None:
    """The archive holds timeline 1 past the point where the server's timeline 2 forked from
    it (the old primary went on writing, ``segments`` segments on, or within the fork's
    segment: a ``.partial`` holding WAL past the fork): timeline 1's files stay as they are,
    and timeline 2 is streamed from the segment holding the fork, equal to the server's own
    files (issue 31: this was refused, "the archive continues timeline 1 at ...")."""
    standby = pg.make_standby("standby")
    pg.generate_wal(1)
    before_fork = pg.endpos_inside_the_wal()
    assert receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-E", before_fork,
                      "-n").returncode == 0
    wait_replayed(pg, standby)
    standby.promote()
    endpos = standby.endpos_inside_the_wal()
    # the old primary goes on writing timeline 1 past the fork, into the archive
    pg.generate_wal(segments)
    ahead = pg.mid_segment_lsn()
    assert receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-E", ahead,
                      "-n").returncode == 0
    tl1 = {n: (archive_dir / n).read_bytes() for n in wal_files(archive_dir)}
    try:
        done = receivewal("stream", "-D", str(archive_dir), "-d", standby.dsn, "-E", endpos,
                          "-n")
        assert done.returncode == 0, done.stderr
        assert "timeline_forked_inside_archive" in done.stderr, done.stderr
        fork = lsn_to_int((standby.pg_wal / "00000002.history").read_text().split()[1])
        assert (archive_dir / "00000002.history").read_text() == \
            (standby.pg_wal / "00000002.history").read_text()
        assert {n: (archive_dir / n).read_bytes() for n in wal_files(archive_dir)
                if n.startswith("00000001")} == tl1
        if not segments:  # the old timeline's .partial, past the fork, kept as it was
            assert [n for n in tl1 if n.endswith(PARTIAL)] == \
                [f"00000001{0:08X}{fork >> 24:08X}{PARTIAL}"]
        tl2 = [n for n in wal_files(archive_dir) if n.startswith("00000002")]
        assert tl2[0].removesuffix(PARTIAL)[8:] == f"{0:08X}{fork >> 24:08X}"
        for name in tl2:
            body = (archive_dir / name).read_bytes()
            server = (standby.pg_wal / name.removesuffix(PARTIAL)).read_bytes()
            if name.endswith(PARTIAL):  # up to the end it received
                server = server[:lsn_to_int(endpos) % (16 << 20)]
                body = body[:len(server)]
            assert body == server, name
    finally:
        standby.stop("immediate")


def test_pitr_from_archive_replays_through_the_timeline_switch(
        pg: PgServer, archive_dir: Path, server_base: Path, tmp_path: Path) -> None:
    """restore_command reading the archive recovers a base backup across timeline 1 -> 2."""
    standby = pg.make_standby("standby")
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", standby.dsn, "-s", "0.5",
                            stderr_path=tmp_path / "log")
    try:
        wait_for(lambda: any(n.endswith(PARTIAL) for n in wal_files(archive_dir)),
                 what="streaming to start")
        backup = pg.base_backup("restored")
        pg.sql("CREATE TABLE accounts (id int PRIMARY KEY, balance numeric)")
        pg.sql("INSERT INTO accounts SELECT g, g * 1.5 FROM generate_series(1, 50000) g")
        pg.generate_wal(1)
        wait_replayed(pg, standby)
        promote_and_write(pg, standby)
        standby.sql("UPDATE accounts SET balance = balance + 1 WHERE id % 7 = 0")
        standby.sql("INSERT INTO accounts SELECT g, 0 FROM generate_series(50001, 60000) g")
        standby.switch_wal()
        last = standby.sql("SELECT pg_walfile_name(pg_current_wal_lsn() - 1)")
        wait_for(lambda: last in complete_segments(archive_dir) or
                 any(n > last for n in complete_segments(archive_dir)),
                 timeout=60, what="the last switched segment to be archived")
    finally:
        assert stop(proc) == 0
    expected = standby.sql("SELECT count(*), sum(balance) FROM accounts")
    standby.stop("immediate")

    restore = server_base / "restore.sh"
    restore.write_text(f'#!/bin/sh\nexec cp "{archive_dir}/$1" "$2"\n')
    restore.chmod(0o755)
    archive_dir.chmod(0o755)
    for path in archive_dir.iterdir():
        path.chmod(0o644)
    try:
        backup.recover_from_archive(f"{restore} %f %p")
        assert backup.sql("SELECT count(*), sum(balance) FROM accounts") == expected
        assert backup.timeline() == 3
    finally:
        backup.stop("immediate")


def test_feedback_clears_slot_xmin_left_by_a_standby(pg: PgServer, archive_dir: Path,
                                                    tmp_path: Path) -> None:
    """A standby pinned the slot's xmin; the receiver taking the slot over clears it."""
    pg.sql("SELECT pg_create_physical_replication_slot('sb', true)")
    standby = pg.make_standby("standby", slot="sb", conf={
        "hot_standby_feedback": "on", "wal_receiver_status_interval": "1"})
    try:
        pg.sql("CREATE TABLE churn (x int)")
        wait_for(lambda: pg.sql("SELECT xmin IS NOT NULL FROM pg_replication_slots "
                                "WHERE slot_name = 'sb'") == "t", what="standby to pin xmin")
    finally:
        standby.stop("fast")
    wait_for(lambda: pg.sql("SELECT active FROM pg_replication_slots WHERE slot_name = 'sb'")
             == "f", what="slot to be released")

    off = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "sb",
                           "-s", "0.3", "--no-hot-standby-feedback",
                           stderr_path=tmp_path / "off.log")
    try:
        wait_for(lambda: pg.sql("SELECT flush_lsn IS NOT NULL FROM pg_stat_replication") == "t",
                 what="status updates")
        first = pg.sql("SELECT reply_time FROM pg_stat_replication")
        wait_for(lambda: pg.sql(f"SELECT reply_time > '{first}'::timestamptz + interval '0.5 s' "
                                "FROM pg_stat_replication") == "t",
                 what="two more status updates (every 0.3 s) without feedback")
        assert pg.sql("SELECT xmin IS NOT NULL FROM pg_replication_slots "
                      "WHERE slot_name = 'sb'") == "t"
    finally:
        assert stop(off) == 0
    wait_for(lambda: pg.sql("SELECT active FROM pg_replication_slots WHERE slot_name = 'sb'")
             == "f", what="slot to be released")

    on = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "sb",
                          "-s", "0.3", stderr_path=tmp_path / "on.log")
    try:
        wait_for(lambda: pg.sql("SELECT xmin IS NULL FROM pg_replication_slots "
                                "WHERE slot_name = 'sb'") == "t", timeout=20,
                 what="the receiver's feedback to clear xmin")
    finally:
        assert stop(on) == 0


def test_two_host_failover_creates_slot_and_leaves_no_gap(pg: PgServer, archive_dir: Path,
                                                          tmp_path: Path) -> None:
    """host=a,b target_session_attrs=read-write: after failover, continue on the new primary."""
    standby = pg.make_standby("standby")
    dsn = (f"host=127.0.0.1,127.0.0.1 port={pg.port},{standby.port} user=postgres "
           "target_session_attrs=read-write")
    log = tmp_path / "log"
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", dsn, "-S", "arch",
                            "--create-slot-if-missing", "-s", "0.3", "--reconnect-delay", "0.2",
                            "--reconnect-delay-max", "1", stderr_path=log)
    try:
        wait_for(lambda: pg.sql("SELECT count(*) FROM pg_replication_slots "
                                "WHERE slot_name = 'arch' AND active") == "1",
                 what="slot created on the first host")
        pg.generate_wal(2)
        wait_replayed(pg, standby)
        endpos = lsn_to_int(promote_and_write(pg, standby))
        wait_for(lambda: standby.sql("SELECT count(*) FROM pg_replication_slots "
                                     "WHERE slot_name = 'arch' AND active") == "1",
                 timeout=60, what="slot created on the new primary")
        wait_for(lambda: (v := standby.sql("SELECT flush_lsn FROM pg_stat_replication"))
                 != "" and lsn_to_int(v) >= endpos, timeout=60, what="catch up")
    finally:
        assert stop(proc) == 0
        standby.stop("immediate")
    text = log.read_text()
    assert "replication_slot_created" in text
    assert "reconnecting" in text
    assert_timeline_archive(archive_dir, standby)
    tl1 = [n for n in complete_segments(archive_dir) if n.startswith("00000001")]
    numbers = [int(n[16:24], 16) for n in tl1]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))


def test_removed_wal_is_reported_as_a_gap_and_never_skipped(pg: PgServer, archive_dir: Path,
                                                            tmp_path: Path) -> None:
    """The server recycled WAL the archive needs: log gap_detected, keep retrying, write nothing."""
    pg.generate_wal(1)
    first_end = pg.mid_segment_lsn()
    assert receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-E", first_end,
                      "-n").returncode == 0
    before = sorted(wal_files(archive_dir))
    pg.sql("ALTER SYSTEM SET wal_keep_size = 0")
    pg.sql("SELECT pg_reload_conf()")
    for _ in range(3):
        pg.generate_wal(2)
        pg.sql("CHECKPOINT")
    needed = next(n for n in before if n.endswith(PARTIAL)).removesuffix(PARTIAL)
    assert not (pg.pg_wal / needed).exists()
    log = tmp_path / "log"
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn,
                            "--reconnect-delay", "0.1", "--reconnect-delay-max", "0.2",
                            stderr_path=log)
    try:
        wait_for(lambda: log.read_text().count('"gap_detected"') >= 2, timeout=30,
                 what="repeated gap reports")
    finally:
        assert stop(proc) == 0
    text = log.read_text()
    assert needed in text
    assert "not skipping ahead" in text
    assert sorted(wal_files(archive_dir)) == before
    status = receivewal("status", "-D", str(archive_dir), "--json")
    assert "has removed" in status.stdout
