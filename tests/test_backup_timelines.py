"""Retention across a promotion, against real PostgreSQL 15 servers (issue 28): two backups on
timeline 1, a standby promoted to timeline 2 while the old primary went on writing timeline 1,
an archive of both. ``cleanup --keep-backups 1`` removes the older backup and timeline 1's WAL
before the kept backup, nothing else; and the kept timeline-1 backup then recovers from the
cleaned archive alone, along timeline 2, to the end of the archive."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.backups import give_to_postgres, replication_link, start_recovered
from support.postgres_user import install_for_postgres, readable_by_postgres
from support.recovery import complete_segments
from support.seaweed import SeaweedS3
from support.servers import PgServer, make_shared_dir, pg_bin

from receivewal.backup.backupdir import BACKUPS
from receivewal.backup.catalog import read_catalog
from receivewal.backup.command import BackupRequest
from receivewal.backup.record import BackupRecord
from receivewal.backup.transfer import take_backup
from receivewal.commands.cleanup import after_backup
from receivewal.daemon.state import State, write_state
from receivewal.recovery.choice import RecoveryTarget, TargetKind, choose_backup
from receivewal.recovery.recoveryconf import recovery_settings, restore_command
from receivewal.recovery.unpack import unpack_backup, write_recovery
from receivewal.replication.commands import identify_server
from receivewal.retention.plan import KeepBackups, plan_retention
from receivewal.retention.removal import apply_plan, read_contents, read_histories
from receivewal.wal.lsn import format_lsn, parse_lsn, segment_of

pytestmark = pytest.mark.server

SEGMENT = 1 << 20


@dataclass
class Promoted:
    base: Path
    archive: Path
    older: BackupRecord
    kept: BackupRecord
    command: str
    target: str  # an LSN on timeline 2 between 'c on 2' and 'd on 2'


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
        target = standby.current_lsn()
        standby.sql("INSERT INTO rows VALUES ('d on 2, after the target')")
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
        yield Promoted(base, archive, older, kept, install_for_postgres(base), target)
    finally:
        primary.stop("immediate")
        if standby is not None:
            standby.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def copy_of(promoted: Promoted, name: str) -> Path:
    """A copy of the promoted archive (each test removes from its own)."""
    archive = promoted.base / name
    shutil.copytree(promoted.archive, archive)
    return archive


def test_cleanup_keeps_what_the_timeline_1_backup_and_timeline_2_need(promoted: Promoted) -> None:
    archive = copy_of(promoted, "planned")
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
            "a on 1,b on 1,c on 2,d on 2, after the target"
        assert server.timeline() == 3
    finally:
        server.stop("immediate")


def run_cleanup(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "receivewal", "cleanup", *args],
                          capture_output=True, text=True, check=False, timeout=60)


def listed(archive: Path) -> list[str]:
    return sorted(p.name for p in archive.iterdir() if p.is_file())


def backup_ids(archive: Path) -> list[str]:
    return [e.backup_id for e in read_catalog(archive)]


def before_kept(promoted: Promoted, names: list[str]) -> list[str]:
    """Timeline 1's segments before the kept backup's: what --keep-backups 1 removes."""
    first_kept = segment_of(promoted.kept.start_lsn, SEGMENT)
    return [name for name in names if len(name) == 24 and name.startswith("00000001")
            and int(name[8:16], 16) * 4096 + int(name[16:], 16) < first_kept]


def test_cleanup_command_keeps_one_and_the_archive_still_recovers(promoted: Promoted) -> None:
    """``cleanup --keep-backups 1`` as a user runs it: --dry-run prints the plan and removes
    nothing; then the same plan is carried out (the older backup, timeline 1's WAL before the
    kept backup; nothing the kept timeline-1 backup or the current timeline 2 needs), and a
    PITR from the kept backup with ``receivewal restore`` as restore_command reaches a target
    on timeline 2."""
    archive = copy_of(promoted, "command")
    before = listed(archive)
    expected = before_kept(promoted, before)
    assert len(expected) >= 2
    dry = run_cleanup("-D", str(archive), "--keep-backups", "1", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert listed(archive) == before
    assert backup_ids(archive) == sorted([promoted.older.backup_id, promoted.kept.backup_id])
    done = run_cleanup("-D", str(archive), "--keep-backups", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout == dry.stdout.replace("would remove", "removed").replace(
        "; --dry-run: nothing was removed", "")
    lines = done.stdout.splitlines()
    assert f"backup {promoted.older.backup_id}: removed: older than the 1 newest complete " \
           "backups" in lines
    assert f"backup {promoted.kept.backup_id}: kept: one of the 1 newest complete backups" \
           in lines
    assert f"{expected[0]} .. {expected[-1]} ({len(expected)} files): removed: needed by no " \
           "kept backup" in done.stdout
    assert "00000002.history: kept: a history file" in lines
    assert lines[-1].startswith(f"removed 1 backup and {len(expected)} WAL files (")
    assert listed(archive) == sorted(set(before) - set(expected))
    assert backup_ids(archive) == [promoted.kept.backup_id]

    verified = subprocess.run([sys.executable, "-m", "receivewal", "verify", str(archive)],
                              capture_output=True, text=True, check=False, timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    again = run_cleanup("-D", str(archive), "--keep-backups", "1")
    assert again.stdout.splitlines()[-1].startswith("removed 0 backups and 0 WAL files")

    pgdata = promoted.base / "pitr"
    unpack_backup(archive / BACKUPS / promoted.kept.backup_id, promoted.kept, pgdata)
    readable_by_postgres(archive)
    target = RecoveryTarget(TargetKind.LSN, lsn=parse_lsn(promoted.target))
    write_recovery(pgdata, recovery_settings(target, "promote",
                                             restore_command(promoted.command, str(archive))))
    give_to_postgres(pgdata)
    server = start_recovered(promoted.base, "pitr")
    try:
        assert server.sql("SELECT string_agg(what, ',' ORDER BY what) FROM rows") == \
            "a on 1,b on 1,c on 2"
        assert server.timeline() == 3
    finally:
        server.stop("immediate")


def test_partial_history_and_the_slots_wal_stay(promoted: Promoted) -> None:
    """A .partial and the history file stay whatever the policy, and so does the WAL from
    the restart position of the slot the daemon's state file records."""
    archive = copy_of(promoted, "slot")
    removable = before_kept(promoted, listed(archive))
    partial = removable[0] + ".partial"
    shutil.copy(archive / removable[0], archive / partial)
    restart = (int(removable[2][16:], 16) + int(removable[2][8:16], 16) * 4096) * SEGMENT + 40
    now = time.time()
    write_state(archive, State(pid=os.getpid(), hostname="here", started_at=now,
                               updated_at=now, phase="streaming", slot="archiver",
                               slot_restart_lsn=restart, timeline=2))
    done = run_cleanup("-D", str(archive), "--keep-backups", "1")
    assert done.returncode == 0, done.stderr
    assert f"{partial}: kept: a .partial" in done.stdout.splitlines()
    assert f"kept: the replication slot restarts at {format_lsn(restart)}" in done.stdout
    left = listed(archive)
    assert [name for name in removable if name not in left] == removable[:2]
    assert {partial, "00000002.history", *removable[2:]} <= set(left)


def test_files_waiting_for_their_upload_stay(promoted: Promoted) -> None:
    """Segments the upload record does not cover yet (stream --upload-to's backlog) stay;
    and the policy set in the environment, as ``receivewal backup`` applies it, does the
    same as the command."""
    archive = copy_of(promoted, "backlog")
    removable = before_kept(promoted, listed(archive))
    (archive / ".receivewal-uploaded.json").write_text(json.dumps(
        {"version": 1, "destination": "s3://bucket/wal", "segment": removable[1],
         "history": []}))
    assert after_backup(archive, {}) is None
    report = after_backup(archive, {"RECEIVEWAL_KEEP_BACKUPS": "1"})
    assert report is not None
    assert report.plan.removed_backups == [promoted.older.backup_id]
    assert list(report.removed_files) == removable[:2]
    waiting = [v for v in report.plan.files if v.name in removable[2:]]
    assert waiting
    assert all(v.reason == "waiting for its upload to s3://bucket/wal"
                           for v in waiting)
    assert set(removable[2:]) <= set(listed(archive))


def pg_archivecleanup(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([pg_bin("pg_archivecleanup"), *args], capture_output=True, text=True,
                          check=False, timeout=60)


@pytest.mark.parametrize("options", [(), ("-x", ".gz")])
def test_the_archive_cleanup_form_agrees_with_pg_archivecleanup(promoted: Promoted,
                                                                options: tuple[str, ...]
                                                                ) -> None:
    """``cleanup -D DIR OLDESTKEPTWALFILE`` removes what pg_archivecleanup removes from the
    same directory (the promoted archive's names, a .partial, a compressed segment, a backup
    history file), but a .partial (and, without -x, receivewal removes a compressed segment
    too): with -n, and for real."""
    names = listed(promoted.archive)
    segments = [name for name in names if len(name) == 24]
    extra = [segments[1] + ".partial", segments[2] + ".gz",
             segments[3] + ".00000028.backup", "00000002.history"]
    arguments = [segments[len(segments) // 2], segments[-1],
                 segments[4] + ".00000028.backup", segments[5] + ".partial"]
    for number, argument in enumerate(arguments):
        theirs, ours = (promoted.base / f"pgac-{number}-{who}{len(options)}"
                        for who in ("pg", "rw"))
        for directory in (theirs, ours):
            directory.mkdir()
            for name in [*names, *extra]:
                (directory / name).touch()
        pg_dry = pg_archivecleanup("-n", *options, str(theirs), argument)
        rw_dry = run_cleanup("-n", *options, "-D", str(ours), argument)
        assert pg_dry.returncode == rw_dry.returncode == 0, (pg_dry.stderr, rw_dry.stderr)
        pg_would = {Path(line).name for line in pg_dry.stdout.splitlines()}
        rw_would = {Path(line).name for line in rw_dry.stdout.splitlines()}
        assert pg_would, argument
        partials = {name for name in pg_would if name.endswith(".partial")}
        # without -x pg_archivecleanup passes a compressed segment over; receivewal judges it
        compressed = {segments[2] + ".gz"} if segments[2] in pg_would and not options \
            else set()
        assert rw_would == (pg_would - partials) | compressed
        assert pg_archivecleanup(*options, str(theirs), argument).returncode == 0
        assert run_cleanup(*options, "-D", str(ours), argument).returncode == 0
        assert set(listed(ours)) == (set(listed(theirs)) | partials) - compressed
        assert rw_would
        assert not rw_would & set(listed(ours))


def test_cleanup_of_the_same_archive_in_a_bucket(promoted: Promoted, seaweed: SeaweedS3) -> None:
    """The archive uploaded to a bucket (SeaweedFS): ``cleanup -D s3://...`` makes the plan a
    directory gets (--dry-run deletes nothing), and deletes the same files and backup."""
    client = seaweed.client()
    prefix = "timelines/db1"
    uploaded = sorted(str(path.relative_to(promoted.archive))
                      for path in promoted.archive.rglob("*") if path.is_file())
    for name in uploaded:
        client.put_object(Bucket=seaweed.bucket, Key=f"{prefix}/{name}",
                          Body=(promoted.archive / name).read_bytes())

    def stored() -> list[str]:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=seaweed.bucket,
                                                                   Prefix=prefix + "/")
        return sorted(item["Key"][len(prefix) + 1:] for page in pages
                      for item in page.get("Contents", ()))

    url = f"s3://{seaweed.bucket}/{prefix}"
    env = {**os.environ, **seaweed.env()}
    command = [sys.executable, "-m", "receivewal", "cleanup", "-D", url, "--keep-backups", "1"]
    dry = subprocess.run([*command, "--dry-run"], capture_output=True, text=True, env=env,
                         check=False, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert stored() == uploaded
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == dry.stdout.replace("would remove", "removed").replace(
        "; --dry-run: nothing was removed", "")
    local = copy_of(promoted, "like-the-bucket")
    assert run_cleanup("-D", str(local), "--keep-backups", "1").stdout == done.stdout
    expected = sorted(str(path.relative_to(local)) for path in local.rglob("*") if path.is_file())
    assert stored() == expected
    # by the directory's name: the kept backup, started in the same second, is "<older>-1"
    assert not [name for name in stored() if name.split("/")[:2] == ["backups",
                                                                     promoted.older.backup_id]]


def test_a_recovery_window(promoted: Promoted) -> None:
    """``--recovery-window``: a day keeps both backups (both ended inside it) and removes only
    the WAL before the older one; a second keeps the newest alone, as --keep-backups 1."""
    archive = copy_of(promoted, "window")
    before = listed(archive)
    first_older = segment_of(promoted.older.start_lsn, SEGMENT)
    older_only = [name for name in before_kept(promoted, before)
                  if int(name[8:16], 16) * 4096 + int(name[16:], 16) < first_older]
    assert older_only
    second = run_cleanup("-D", str(archive), "--recovery-window", "1s", "--dry-run")
    keep_one = run_cleanup("-D", str(archive), "--keep-backups", "1", "--dry-run")
    assert [line.split(": ")[:2] for line in second.stdout.splitlines()] == \
        [line.split(": ")[:2] for line in keep_one.stdout.splitlines()]
    day = run_cleanup("-D", str(archive), "--recovery-window", "1d")
    assert day.returncode == 0, day.stderr
    assert f"backup {promoted.older.backup_id}: kept: needed to recover to any time since " \
        in day.stdout
    assert backup_ids(archive) == sorted([promoted.older.backup_id, promoted.kept.backup_id])
    assert listed(archive) == sorted(set(before) - set(older_only))
