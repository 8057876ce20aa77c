"""After a point-in-time recovery the same archive goes on with the new primary (issue 31,
item 2), against real PostgreSQL 15 servers.

The archive streamed timeline 1 past the point where the recovered server's timeline 2 forked
from it, as every WAL archive does after a PITR: ``receivewal stream`` pointed at the promoted
server (a new slot, the same directory) keeps timeline 1's files as they are, writes
``00000002.history`` and streams timeline 2 from the segment of the fork; ``verify`` says the
two-timeline archive is recoverable, and a later recovery follows timeline 2 through
``receivewal restore``. What is refused, before anything is written: a server whose timeline
history contradicts the archive's own (another branch that took the same timeline ID)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from support.backups import give_to_postgres, start_recovered
from support.postgres_user import install_for_postgres, readable_by_postgres
from support.servers import IS_ROOT, PgServer
from support.streams import (
    complete_segments,
    log_events,
    lsn_to_int,
    receivewal,
    start_streaming,
    stop,
    wait_for,
    wal_files,
)

from receivewal.wal.lsn import format_lsn

pytestmark = [pytest.mark.server, pytest.mark.slow]

SEGMENT = 16 << 20


def contents(archive: Path) -> dict[str, str]:
    """Every WAL and history file of the archive directory and a digest of its bytes (not
    the daemon's lock, state and identity records, nor the backups)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(archive.iterdir()) if p.is_file() and not p.name.startswith(".")}


def segno(name: str) -> int:
    """A WAL file name's segment number (16 MB segments)."""
    return int(name[8:16], 16) * 256 + int(name[16:24], 16)


def wait_archived(archive: Path, name: str) -> None:
    """Wait until the complete segment ``name`` is in the archive."""
    wait_for(lambda: name in complete_segments(archive), timeout=90, what=f"{name} archived")


def test_the_archive_goes_on_with_a_server_recovered_to_before_its_end(
        pg: PgServer, archive_dir: Path, server_base: Path, tmp_path: Path) -> None:
    """Stream, back up, write past a target, recover to the target and promote (timeline 2
    forks inside what the archive holds of timeline 1): the daemon with a new slot on the
    promoted server streams timeline 2 from the fork's segment; timeline 1's files stay
    byte for byte; timeline 2's segments equal the server's; verify says recoverable; and a
    recovery of the latest timeline from the old backup follows timeline 2."""
    archive = archive_dir
    first = start_streaming("-D", str(archive), "-d", pg.dsn, log=tmp_path / "tl1.log")
    try:
        done = receivewal("backup", "-D", str(archive), "-d", pg.dsn, "--fast",
                          "--label", "before-pitr", timeout=180)
        assert done.returncode == 0, done.stderr
        pg.sql("CREATE TABLE rows (what text)")
        pg.sql("INSERT INTO rows VALUES ('a on 1')")
        target = pg.current_lsn()
        pg.sql("INSERT INTO rows VALUES ('b on 1, after the target')")
        pg.generate_wal(2)  # timeline 1 goes on well past the target in the archive
        last = pg.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
        pg.switch_wal()
        wait_archived(archive, last)
    finally:
        assert stop(first) == 0
    pg.stop("fast")  # the primary is gone

    readable_by_postgres(archive)
    pgdata = server_base / "recovered"
    done = receivewal("recover", "--to", str(pgdata), "-D", str(archive), "--target-lsn",
                      target, "--restore-command-prefix", install_for_postgres(server_base),
                      timeout=180)
    assert done.returncode == 0, done.stderr
    give_to_postgres(pgdata)
    recovered = start_recovered(server_base, "recovered")
    try:
        assert recovered.timeline() == 2
        assert recovered.sql("SELECT string_agg(what, ',') FROM rows") == "a on 1"
        fork = (recovered.pg_wal / "00000002.history").read_text()
        fork_lsn = lsn_to_int(fork.split()[1])
        assert lsn_to_int(target) <= fork_lsn
        tl1 = {n for n in wal_files(archive) if n.startswith("00000001")}
        archive_end = max(segno(n) for n in tl1)
        assert fork_lsn // SEGMENT < archive_end, "the fork lies inside what the archive holds"
        before = contents(archive)
        assert "00000002.history" not in before

        recovered.sql("INSERT INTO rows VALUES ('c on 2')")
        log = tmp_path / "tl2.log"
        second = start_streaming("-D", str(archive), "-d", recovered.dsn, "-S", "after_pitr",
                                 "--create-slot-if-missing", log=log)
        try:
            recovered.generate_wal(1, table="on_two")
            last2 = recovered.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
            recovered.switch_wal()
            wait_archived(archive, last2)
        finally:
            assert stop(second) == 0
        started = [e for e in log_events(log.read_text()) if e["event"] == "streaming_started"]
        assert started[0]["timeline"] == 2, started
        assert started[0]["start_lsn"] == format_lsn(fork_lsn // SEGMENT * SEGMENT), started

        # restarted (as systemd does), it resumes where timeline 2 stands, not at the fork
        resumed_at = next(n for n in wal_files(archive)
                          if n.startswith("00000002") and n.endswith(".partial"))
        log = tmp_path / "tl2-again.log"
        third = start_streaming("-D", str(archive), "-d", recovered.dsn, "-S", "after_pitr",
                                log=log)
        try:
            recovered.sql("INSERT INTO rows VALUES ('d on 2')")
            last3 = recovered.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
            recovered.switch_wal()
            wait_archived(archive, last3)
        finally:
            assert stop(third) == 0
        started = [e for e in log_events(log.read_text()) if e["event"] == "streaming_started"]
        assert (started[0]["timeline"], started[0]["start_lsn"]) == \
            (2, format_lsn(segno(resumed_at) * SEGMENT)), started

        after = contents(archive)
        assert {n: d for n, d in after.items() if n.startswith("00000001")} == \
            {n: d for n, d in before.items() if n.startswith("00000001")}, \
            "timeline 1's files stay as they were"
        assert (archive / "00000002.history").read_text() == fork
        tl2 = sorted(n for n in complete_segments(archive) if n.startswith("00000002"))
        assert segno(tl2[0]) == fork_lsn // SEGMENT, "timeline 2 starts at the fork's segment"
        assert [segno(n) for n in tl2] == list(range(segno(tl2[0]), segno(tl2[0]) + len(tl2)))
        for name in tl2:
            assert (archive / name).read_bytes() == (recovered.pg_wal / name).read_bytes(), name
        expected = recovered.sql("SELECT string_agg(what, ',' ORDER BY what) FROM rows")
    finally:
        recovered.stop("immediate")

    checked = receivewal("verify", str(archive), timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "verdict: recoverable end to end" in checked.stdout, checked.stdout

    # a recovery of the newest timeline from the timeline-1 backup follows timeline 2
    readable_by_postgres(archive)
    again = server_base / "again"
    prefix = install_for_postgres(server_base, lib_name="lib2")
    done = receivewal("recover", "--to", str(again), "-D", str(archive),
                      "--restore-command-prefix", prefix, timeout=180)
    assert done.returncode == 0, done.stderr
    give_to_postgres(again)
    server = start_recovered(server_base, "again")
    try:
        assert server.sql("SELECT string_agg(what, ',' ORDER BY what) FROM rows") == expected
        assert expected == "a on 1,c on 2,d on 2"
        assert server.timeline() == 3
        served = server.logfile.read_text()
        assert f'restored log file "{tl2[0]}" from archive' in served
    finally:
        server.stop("immediate")


def test_a_server_whose_history_contradicts_the_archive_is_refused_before_any_write(
        pg: PgServer, archive_dir: Path, tmp_path: Path) -> None:
    """Two standbys of one primary both promoted: A onto timeline 2, streamed into the archive;
    B onto its own timeline 2 (forked later), then onto timeline 3. The archive's
    00000002.history says timeline 2 forked from 1 where B's history says otherwise: the
    daemon refuses B at once (exit 1, one line naming both points) and writes nothing: no
    00000003.history, every file as it was."""
    archive = archive_dir
    a = pg.make_standby("a")
    b = pg.make_standby("b")
    try:
        pg.generate_wal(1)
        lsn = pg.current_lsn()
        for standby in (a, b):
            wait_for(lambda s=standby: s.sql(
                f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'") == "t", what="replay")
        a.promote()
        a.sql("CREATE TABLE on_a (x int)")
        end_a = a.endpos_inside_the_wal()
        done = receivewal("stream", "-D", str(archive), "-d", a.dsn, "-E", end_a, "-n")
        assert done.returncode == 0, done.stderr
        assert "00000002.history" in {p.name for p in archive.iterdir()}

        pg.generate_wal(1)  # B follows the old primary further, then is promoted
        lsn = pg.current_lsn()
        wait_for(lambda: b.sql(f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'") == "t",
                 what="replay")
        pg.stop("fast")
        b.promote()
        b.sql("CREATE TABLE on_b (x int)")
        b.stop("fast")  # once more: a standby without a source, promoted onto timeline 3
        signal = b.datadir / "standby.signal"
        signal.touch()
        if IS_ROOT:
            shutil.chown(signal, "postgres", "postgres")
        b.configure({"primary_conninfo": "''"})
        b.start()
        b.promote()
        assert b.timeline() == 3
        b.sql("CREATE TABLE on_b3 (x int)")

        before = contents(archive)
        done = receivewal("stream", "-D", str(archive), "-d", b.dsn, "-n")
    finally:
        a.stop("immediate")
        b.stop("immediate")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    refusal = next(e["error"] for e in log_events(done.stderr) if e["event"] == "failed")
    assert isinstance(refusal, str)
    assert refusal.startswith("the archive's 00000002.history says timeline 2 forked from "
                              "timeline 1 at "), refusal
    assert "but the server's history says timeline 2 forked from timeline 1 at" in refusal
    assert contents(archive) == before, "nothing written"
    assert not (archive / "00000003.history").exists()
    assert not [n for n in wal_files(archive) if n.startswith("00000003")]
