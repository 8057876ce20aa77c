"""``cleanup --keep-backups N`` on the whole matrix (issue 31 §3, issue 32 §8): {a directory, a
bucket (SeaweedFS)} x {plain, zstd, sealed (age)} x {one timeline, after a PITR}, on archives
that ``receivewal stream`` wrote from real PostgreSQL 15 servers.

The archives are built once for the module: a primary streamed by three daemons (plain, ``-Z
zstd``, ``--encrypt-to``: ``.FINGERPRINT.age`` files, one per segment), two backups
on timeline 1; then a point-in-time recovery of the newer one from the plain archive with
``receivewal restore`` as restore_command, promoted onto timeline 2 and streamed by three more
daemons (the sealed one with ``-Z zstd``: ``.zst.FINGERPRINT.age``), a backup on timeline 2;
its segments and history file added to the timeline-1 archives. Each case cleans a copy of its
pristine archive (in a directory, or uploaded to a prefix of its own). What must go is named
from the backups' start positions alone: every form of a segment that no kept backup needs,
and the removed backups' files; the rest stays. The dry run prints what the real run then
prints, removes nothing, and its list of files is what the real run removed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.agekeys import new_identity_file
from support.backups import give_to_postgres, replication_link, start_recovered
from support.postgres_user import install_for_postgres, readable_by_postgres
from support.seaweed import SeaweedS3
from support.servers import PgServer, make_shared_dir
from support.streams import receivewal, slot_restart_lsn, start_streaming, stop, wait_for

from receivewal.archive.identity import IDENTITY_FILE
from receivewal.backup.backupdir import BACKUPS
from receivewal.backup.command import BackupRequest
from receivewal.backup.record import BackupRecord
from receivewal.backup.transfer import take_backup
from receivewal.commands.cleanup import daemon_holds
from receivewal.daemon.state import State, write_state
from receivewal.recovery.choice import RecoveryTarget, TargetKind
from receivewal.recovery.recoveryconf import recovery_settings, restore_command
from receivewal.recovery.unpack import unpack_backup, write_recovery
from receivewal.replication.commands import identify_server
from receivewal.retention.plan import KeepBackups
from receivewal.retention.removal import apply_policy
from receivewal.wal.lsn import format_lsn, parse_lsn, segment_of
from receivewal.wal.names import (
    ENCRYPTED_SUFFIX,
    RECIPIENTS_SUFFIX,
    history_file_name,
    unsealed_name,
)
from receivewal.wal.timeline import parse_history

pytestmark = pytest.mark.server

SEGMENT = 1 << 20
PER_ID = (1 << 32) // SEGMENT
FORMS = ("plain", "zstd", "sealed")


@dataclass
class Matrix:
    base: Path
    primary: PgServer  # timeline 1's server, still running (the slot test)
    pristine: dict[tuple[str, str], Path] = field(default_factory=dict)  # (history, form)
    backups: dict[str, BackupRecord] = field(default_factory=dict)  # b0, b1 (1), b2 (2)


def backup(pg: PgServer, holder: Path, label: str) -> BackupRecord:
    """A backup of ``pg`` into ``holder/backups`` (copied into each archive later)."""
    with replication_link(pg) as conn:
        return take_backup(conn, BackupRequest(label=label, fast=True), holder,
                           identify_server(conn), sync=False)


def write_segments(pg: PgServer, count: int) -> None:
    """About ``count`` segments of WAL: a few rows, then a switch, ``count`` times."""
    for _ in range(count):
        pg.switch_wal()


def last_complete(pg: PgServer) -> str:
    """Switch WAL; the name of the segment the switch completed."""
    end = pg.switch_wal()
    return pg.sql(f"SELECT pg_walfile_name('{end}')")


def holds(directory: Path, wal_name: str) -> bool:
    """Whether the archive directory holds ``wal_name`` complete, in any form."""
    return any(name.split(".")[0] == wal_name
               and not name.endswith((".partial", RECIPIENTS_SUFFIX))
               for name in (p.name for p in directory.iterdir()))


Daemons = dict[str, tuple[Path, subprocess.Popen[bytes]]]  # form: its directory, its daemon


def stream_all(pg: PgServer, base: Path, stage: str,
               options: dict[str, tuple[str, ...]]) -> Daemons:
    """A ``receivewal stream`` of ``pg`` per form, each into a directory of its own."""
    daemons = {}
    for form, extra in options.items():
        directory = base / stage / form
        directory.mkdir(parents=True)
        daemons[form] = (directory, start_streaming(
            "-D", str(directory), "-d", pg.dsn, "--no-sync", *extra,
            log=base / f"{stage}-{form}.log"))
    return daemons


def stop_all(daemons: Daemons, last: str) -> None:
    for directory, _ in daemons.values():
        wait_for(lambda d=directory: holds(d, last), timeout=120,
                 what=f"{last} in {directory}")
    for _, proc in daemons.values():
        assert stop(proc) == 0


def add_backup(archive: Path, holder: Path, record: BackupRecord) -> None:
    shutil.copytree(holder / BACKUPS / record.backup_id, archive / BACKUPS / record.backup_id)


@pytest.fixture(scope="module")
def matrix() -> Iterator[Matrix]:
    base = make_shared_dir("receivewal-cleanupmatrix-")
    primary = PgServer(base, "primary")
    pitr: PgServer | None = None
    daemons: Daemons = {}
    try:
        primary.init(initdb_args=("--wal-segsize=1",))
        primary.start()
        key = new_identity_file(base / "key.txt")
        holder = base / "taken"
        holder.mkdir()
        built = Matrix(base, primary)
        primary.sql("CREATE TABLE rows (what text)")
        daemons = stream_all(primary, base, "tl1", {
            "plain": (), "zstd": ("-Z", "zstd"), "sealed": ("--encrypt-to", key.recipient)})
        write_segments(primary, 3)
        built.backups["b0"] = backup(primary, holder, "b0")
        write_segments(primary, 3)
        built.backups["b1"] = backup(primary, holder, "b1")
        write_segments(primary, 3)
        primary.sql("INSERT INTO rows VALUES ('before the target')")
        target = primary.current_lsn()
        write_segments(primary, 3)  # timeline 1 goes on past the target: the branch left behind
        stop_all(daemons, last_complete(primary))
        daemons = {}
        for form in FORMS:
            one = base / "pristine" / "one" / form
            shutil.copytree(base / "tl1" / form, one)
            for name in ("b0", "b1"):
                add_backup(one, holder, built.backups[name])
            built.pristine["one", form] = one

        # the PITR: the newer backup recovered to the target from the plain archive, promoted
        b1 = built.backups["b1"]
        pgdata = base / "pitr"
        unpack_backup(holder / BACKUPS / b1.backup_id, b1, pgdata)
        readable_by_postgres(base / "tl1" / "plain")
        write_recovery(pgdata, recovery_settings(
            RecoveryTarget(TargetKind.LSN, lsn=parse_lsn(target)), "promote",
            restore_command(install_for_postgres(base), str(base / "tl1" / "plain"))))
        give_to_postgres(pgdata)
        pitr = start_recovered(base, "pitr")
        assert pitr.sql("SELECT string_agg(what, ',') FROM rows") == "before the target"
        daemons = stream_all(pitr, base, "tl2", {
            "plain": (), "zstd": ("-Z", "zstd"),
            "sealed": ("--encrypt-to", key.recipient, "-Z", "zstd")})
        write_segments(pitr, 3)
        built.backups["b2"] = backup(pitr, holder, "b2")
        write_segments(pitr, 3)
        stop_all(daemons, last_complete(pitr))
        daemons = {}
        pitr.stop()
        assert built.backups["b2"].timeline == 2
        for form in FORMS:
            after = base / "pristine" / "pitr" / form
            shutil.copytree(built.pristine["one", form], after)
            for path in (base / "tl2" / form).iterdir():
                if path.is_file() and not path.name.startswith("."):
                    shutil.copy(path, after / path.name)
            add_backup(after, holder, built.backups["b2"])
            assert (after / history_file_name(2)).is_file()
            built.pristine["pitr", form] = after
        yield built
    finally:
        for _, proc in daemons.values():
            proc.kill()
            proc.wait(timeout=30)
        primary.stop("immediate")
        if pitr is not None:
            pitr.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def segment_named(name: str) -> tuple[int, int] | None:
    """(timeline, segment number) of a complete segment's file in any form, or of a sealed
    one's recipients file; None for anything else (a .partial, a history file, ...)."""
    stem = unsealed_name(name.removesuffix(RECIPIENTS_SUFFIX))
    for suffix in (".zst", ".lz4", ".gz"):
        stem = stem.removesuffix(suffix)
    if len(stem) != 24 or not all(c in "0123456789ABCDEF" for c in stem):
        return None
    return int(stem[:8], 16), int(stem[8:16], 16) * PER_ID + int(stem[16:], 16)


def fork_of(archive: Path) -> int:
    """Where timeline 2 left timeline 1, as the archive's history file says."""
    return parse_history((archive / history_file_name(2)).read_text(), 2)[0].switchpoint


def expected(matrix: Matrix, history: str, keep: int, archive: Path, names: list[str]
             ) -> tuple[list[str], list[str]]:
    """The backups and WAL files ``--keep-backups keep`` removes: the backups beyond the
    newest ``keep``; the segments (and recipients files) before the oldest kept backup's start
    on its timeline, and every segment of a timeline no kept backup recovers along."""
    b0, b1, b2 = (matrix.backups[name] for name in ("b0", "b1", "b2"))
    first = {name: segment_of(r.start_lsn, SEGMENT) for name, r in matrix.backups.items()}
    if history == "one":
        assert keep == 1
        backups = [b0.backup_id]

        def goes(timeline: int, segno: int) -> bool:
            return timeline == 1 and segno < first["b1"]
    elif keep == 1:  # b2 alone, on timeline 2 after the fork: timeline 1 goes entirely
        assert segment_of(fork_of(archive), SEGMENT) <= first["b2"]
        backups = [b0.backup_id, b1.backup_id]

        def goes(timeline: int, segno: int) -> bool:
            return timeline == 1 or segno < first["b2"]
    else:  # b1 (timeline 1) and b2: timeline 1 from b1 on (to the fork and past it), all of 2
        backups = [b0.backup_id]

        def goes(timeline: int, segno: int) -> bool:
            return timeline == 1 and segno < first["b1"]
    files = [name for name in names if (found := segment_named(name)) is not None
             and goes(*found)]
    assert b2.timeline == 2
    return sorted(backups), sorted(files)


def listed_directory(archive: Path) -> list[str]:
    return sorted(str(p.relative_to(archive)) for p in archive.rglob("*") if p.is_file())


def upload(seaweed: SeaweedS3, archive: Path, prefix: str) -> None:
    """The archive's files as the uploader and a bucket backup leave them at ``prefix``:
    the WAL, history and recipients files, the identity object, the backups (no daemon
    files: the state file stays with the daemon)."""
    client = seaweed.client()

    def put(name: str) -> None:
        client.put_object(Bucket=seaweed.bucket, Key=f"{prefix}/{name}",
                          Body=(archive / name).read_bytes())

    names = [name for name in listed_directory(archive)
             if not name.startswith(".") or name == IDENTITY_FILE]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(put, names))


def listed_bucket(seaweed: SeaweedS3, prefix: str) -> list[str]:
    pages = seaweed.client().get_paginator("list_objects_v2").paginate(
        Bucket=seaweed.bucket, Prefix=prefix + "/")
    return sorted(item["Key"][len(prefix) + 1:] for page in pages
                  for item in page.get("Contents", ()))


#: (where, history, keep): every archive once in a directory and once in a bucket; after the
#: PITR, keeping the timeline-1 backup too (all of timeline 1 from its start stays) in a
#: directory alone (the bucket's plan is the same planner's, proven on the other two)
CASES = [pytest.param(where, history, keep, id=f"{where}-{name}")
         for where in ("directory", "bucket")
         for history, keep, name in (("one", 1, "one-timeline"), ("pitr", 1, "pitr-keep1"),
                                     ("pitr", 2, "pitr-keep2"))
         if (where, keep) != ("bucket", 2)]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("where", "history", "keep"), CASES)
def test_cleanup_removes_exactly_what_no_kept_backup_needs(
        matrix: Matrix, store: SeaweedS3, *, where: str, form: str, history: str, keep: int,
) -> None:
    pristine = matrix.pristine[history, form]
    case = f"{where}-{form}-{history}-{keep}"
    if where == "directory":
        archive = matrix.base / "cases" / case
        shutil.copytree(pristine, archive)
        location = str(archive)

        def listing() -> list[str]:
            return listed_directory(archive)
    else:
        upload(store, pristine, f"matrix/{case}")
        location = f"s3://{store.bucket}/matrix/{case}"

        def listing() -> list[str]:
            return listed_bucket(store, f"matrix/{case}")
    before = listing()
    names = [name for name in before if "/" not in name]
    backups, files = expected(matrix, history, keep, pristine, names)
    assert len(files) >= 4, files
    if form == "sealed":  # sealed segments among them, one file each (no recipients file)
        assert any(name.endswith(ENCRYPTED_SUFFIX) for name in files), files
        assert not any(name.endswith(RECIPIENTS_SUFFIX) for name in files), files
    gone = sorted([*files, *(name for name in before
                             if name.split("/")[:2] in ([BACKUPS, b] for b in backups))])

    dry = receivewal("cleanup", "-D", location, "--keep-backups", str(keep), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert listing() == before
    if where == "directory":  # the dry run's list of files
        report = apply_policy(Path(location), KeepBackups(keep), dry_run=True)
    else:
        from receivewal.retention.removal import (  # noqa: PLC0415
            apply_policy as apply_policy_to_bucket,
        )

        report = apply_policy_to_bucket(location, KeepBackups(keep), dry_run=True)
    assert report.plan.removed_backups == backups
    assert list(report.removed_files) == files
    assert listing() == before

    done = receivewal("cleanup", "-D", location, "--keep-backups", str(keep))
    assert done.returncode == 0, done.stderr
    assert done.stdout == dry.stdout.replace("would remove", "removed").replace(
        "; --dry-run: nothing was removed", "")
    after = listing()
    assert sorted(set(before) - set(after)) == gone
    assert set(after) <= set(before)
    segments = sum(not name.endswith(RECIPIENTS_SUFFIX) for name in files)
    assert done.stdout.splitlines()[-1].startswith(
        f"removed {len(backups)} backup{'s' * (len(backups) != 1)} and {segments} WAL files")


def test_the_slot_hold_is_the_servers_position_when_a_connection_is_given(matrix: Matrix
                                                                          ) -> None:
    """Issue 31 §9: the state file records the slot's position as the daemon last reported
    it; once that daemon is gone the slot may have moved on (or been dropped) and the file
    never learns it, so cleanup kept WAL from a stale position for ever. With ``--dbname``
    cleanup reads the slot the state file names from the server (READ_REPLICATION_SLOT), on
    the archive's own cluster: its position there is what it holds; a slot the server no
    longer has holds nothing."""
    archive = matrix.base / "cases" / "slot"
    shutil.copytree(matrix.pristine["one", "plain"], archive)
    names = listed_directory(archive)
    _, files = expected(matrix, "one", 1, archive, names)
    stale = (segment_named(files[2]) or (0, 0))[1] * SEGMENT + 40  # inside the third to go
    now = time.time()
    write_state(archive, State(pid=os.getpid(), hostname="gone", started_at=now,
                               updated_at=now, phase="stopped", slot="archiver",
                               slot_restart_lsn=stale, timeline=1))
    pg = matrix.primary
    pg.sql("SELECT pg_create_physical_replication_slot('archiver', true)")
    try:  # where a receiver that confirmed everything leaves it
        pg.sql("SELECT pg_replication_slot_advance('archiver', pg_current_wal_lsn())")
        server = slot_restart_lsn(pg, "archiver")
        assert segment_of(server, SEGMENT) > segment_of(matrix.backups["b1"].start_lsn, SEGMENT)

        from_file = receivewal("cleanup", "-D", str(archive), "--keep-backups", "1", "-n")
        assert from_file.returncode == 0, from_file.stderr
        assert f"kept: the replication slot restarts at {format_lsn(stale)}" in from_file.stdout
        assert "removed 1 backup and 2 WAL files" in from_file.stdout.replace("would remove",
                                                                              "removed")
        # what backup --keep-backups applies: the state file's position, said as such
        held = apply_policy(archive, KeepBackups(1), daemon_holds(archive), dry_run=True)
        assert f"the replication slot restarts at {format_lsn(stale)}" in \
            {v.reason for v in held.plan.files}

        asked = receivewal("cleanup", "-D", str(archive), "--keep-backups", "1",
                           "--dbname", pg.dsn)
        assert asked.returncode == 0, asked.stderr
        assert "replication slot" not in asked.stdout
        assert asked.stdout.splitlines()[-1].startswith(
            f"removed 1 backup and {len(files)} WAL files")
        assert listed_directory(archive) == [name for name in names
                                             if name not in files and not name.startswith(
                                                 f"{BACKUPS}/{matrix.backups['b0'].backup_id}/")]
        assert f'replication slot "archiver" restarts at {format_lsn(server)}' in asked.stderr
    finally:
        pg.sql("SELECT pg_drop_replication_slot('archiver')")
    gone = receivewal("cleanup", "-D", str(archive), "--keep-backups", "1", "-n",
                      "--dbname", pg.dsn)
    assert gone.returncode == 0, gone.stderr
    assert 'replication slot "archiver" does not exist on the server' in gone.stderr
    assert "replication slot" not in gone.stdout

    # another cluster's server says nothing of this archive's slot: one line, nothing removed
    other = matrix.base / "cases" / "slot-other"
    shutil.copytree(matrix.pristine["one", "plain"], other)
    identity = json.loads((other / IDENTITY_FILE).read_text())
    ours, identity["system_identifier"] = identity["system_identifier"], "7000000000000000001"
    (other / IDENTITY_FILE).write_text(json.dumps(identity))
    write_state(other, State(pid=os.getpid(), hostname="gone", started_at=now, updated_at=now,
                             phase="stopped", slot="archiver", slot_restart_lsn=stale,
                             timeline=1))
    before = listed_directory(other)
    foreign = receivewal("cleanup", "-D", str(other), "--keep-backups", "1", "--dbname", pg.dsn)
    assert foreign.returncode == 1
    assert foreign.stderr.count("\n") == 1, foreign.stderr
    assert "belongs to database system 7000000000000000001, but the server is database " \
           f"system {ours}" in foreign.stderr
    assert listed_directory(other) == before
