"""Retention across a promotion, against real PostgreSQL 15 servers (issue 28): two backups on
timeline 1, a standby promoted to timeline 2 while the old primary went on writing timeline 1,
an archive of both. ``cleanup --keep-backups 1`` removes the older backup and timeline 1's WAL
before the kept backup, nothing else; and the kept timeline-1 backup then recovers from the
cleaned archive alone, along timeline 2, to the end of the archive."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.backups import give_to_postgres, replication_link, start_recovered
from support.postgres_user import install_for_postgres, readable_by_postgres
from support.recovery import complete_segments
from support.servers import PgServer, make_shared_dir

from receivewal.backup.catalog import read_catalog
from receivewal.backup.choice import RecoveryTarget, choose_backup
from receivewal.backup.cleanup import apply_plan, read_contents, read_histories
from receivewal.backup.command import BackupRequest
from receivewal.backup.directory import BACKUPS
from receivewal.backup.record import BackupRecord
from receivewal.backup.retention import KeepBackups, plan_retention
from receivewal.backup.settings import recovery_settings, restore_command
from receivewal.backup.transfer import take_backup
from receivewal.backup.unpack import unpack_backup, write_recovery
from receivewal.replication.commands import identify_server
from receivewal.wal.lsn import segment_of

pytestmark = pytest.mark.server

SEGMENT = 1 << 20


@dataclass
class Promoted:
    base: Path
    archive: Path
    older: BackupRecord
    kept: BackupRecord
    command: str


def backup(pg: PgServer, archive: Path, label: str) -> BackupRecord:
    with replication_link(pg) as conn:
        return take_backup(conn, BackupRequest(label=label, fast=True), archive,
                           identify_server(conn), sync=False)


@pytest.fixture(scope="module")
def promoted() -> Iterator[Promoted]:
    base = make_shared_dir("receivewal-timelines-")
    primary = PgServer(base, "primary")
    standby: PgServer | None = None
    try:
        primary.init(initdb_args=("--wal-segsize=1",))
        primary.start()
        archive = base / "archive"
        archive.mkdir()
        primary.sql("CREATE TABLE rows (what text)")
        primary.generate_wal(3)
        older = backup(primary, archive, "older")
        primary.generate_wal(3)
        kept = backup(primary, archive, "kept")
        primary.sql("INSERT INTO rows VALUES ('a on 1')")
        standby = primary.make_standby("standby")
        primary.sql("INSERT INTO rows VALUES ('b on 1')")
        lsn = primary.current_lsn()
        while standby.sql(f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'") != "t":
            time.sleep(0.05)
        standby.promote()
        standby.sql("INSERT INTO rows VALUES ('c on 2')")
        standby.switch_wal()
        primary.sql("INSERT INTO rows VALUES ('x on the abandoned 1')")
        primary.switch_wal()
        standby.stop()
        primary.stop()
        for segment in complete_segments(primary):
            shutil.copy(segment, archive / segment.name)
        for segment in complete_segments(standby):
            if segment.name.startswith("00000002"):
                shutil.copy(segment, archive / segment.name)
        shutil.copy(standby.pg_wal / "00000002.history", archive)
        (archive / ".receivewal-archive.json").write_text(json.dumps(
            {"system_identifier": kept.system_identifier, "wal_segment_size": SEGMENT,
             "timeline": 1}))
        yield Promoted(base, archive, older, kept, install_for_postgres(base))
    finally:
        primary.stop("immediate")
        if standby is not None:
            standby.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def test_cleanup_keeps_what_the_timeline_1_backup_and_timeline_2_need(promoted: Promoted) -> None:
    archive = promoted.archive
    before = sorted(p.name for p in archive.iterdir() if p.is_file())
    plan = plan_retention(read_contents(archive, 2, SEGMENT), KeepBackups(1))
    assert plan.removed_backups == [promoted.older.backup_id]
    first_kept = segment_of(promoted.kept.start_lsn, SEGMENT)
    expected = [name for name in before if len(name) == 24 and name.startswith("00000001")
                and int(name[8:16], 16) * 4096 + int(name[16:], 16) < first_kept]
    assert expected, "WAL before the kept backup to remove"
    assert plan.removed_files == expected
    assert any(name.startswith("00000002") for name in before)
    apply_plan(archive, plan)
    after = sorted(p.name for p in archive.iterdir() if p.is_file())
    assert after == sorted(set(before) - set(expected))
    assert [e.backup_id for e in read_catalog(archive)] == [promoted.kept.backup_id]

    # the kept backup recovers from what is left, along timeline 2, to the end
    records = [e.record for e in read_catalog(archive) if e.record is not None]
    histories = read_histories(archive, after)
    present = {name for name in after if len(name) == 24}
    choice = choose_backup(records, RecoveryTarget(), 2, histories,
                           has_wal=present.__contains__)
    assert choice.record == promoted.kept
    pgdata = promoted.base / "recovered"
    unpack_backup(archive / BACKUPS / choice.record.backup_id, choice.record, pgdata)
    readable_by_postgres(archive)
    write_recovery(pgdata, recovery_settings(RecoveryTarget(), "promote",
                                             restore_command(promoted.command, str(archive))))
    give_to_postgres(pgdata)
    server = start_recovered(promoted.base, "recovered")
    try:
        assert server.sql("SELECT string_agg(what, ',' ORDER BY what) FROM rows") == \
            "a on 1,b on 1,c on 2"
        assert server.timeline() == 3
    finally:
        server.stop("immediate")
