"""A backup counts only if it is there (issue 32 §1-2), against real PostgreSQL 15 servers and
a real SeaweedFS.

§1: an archive that ``receivewal stream`` wrote (1 MiB segments) holds three backups, built once
for the module; each case copies it (into a directory, or uploads it to a prefix of its own)
and breaks the newest backup's ``base.tar``: removed, or cut to another size than its record
says. ``cleanup --keep-backups 1`` then keeps the newest backup that is there and the WAL
from its start, names the broken one and counts it not, and ``recover`` (latest) starts from
the good one.

§2: two ``backup --encrypt-to`` into one bucket made to take the same ID (as two that listed
the prefix in the same second): the second refuses the ID the first claimed, exits != 0 and
removes nothing of the first's, which verify then reads whole.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.agekeys import new_identity_file
from support.backups import replication_link
from support.seaweed import SeaweedS3
from support.servers import PgServer, make_shared_dir
from support.streams import receivewal, start_streaming, stop, wait_for

from receivewal.archive.identity import IDENTITY_FILE
from receivewal.backup.backupdir import BACKUPS
from receivewal.backup.command import BackupRequest
from receivewal.backup.record import BackupRecord
from receivewal.backup.transfer import take_backup
from receivewal.replication.commands import identify_server
from receivewal.wal.lsn import segment_of
from receivewal.wal.names import wal_file_name

pytestmark = pytest.mark.server

SEGMENT = 1 << 20


@dataclass
class Three:
    base: Path
    pristine: Path  # the archive directory with its three backups
    backups: list[BackupRecord] = field(default_factory=list)  # oldest first
    last: str = ""  # the newest segment the archive holds


def holds(archive: Path, wal_name: str) -> bool:
    return (archive / wal_name).is_file()


@pytest.fixture(scope="module")
def three() -> Iterator[Three]:
    base = make_shared_dir("receivewal-present-")
    primary = PgServer(base, "primary")
    streamer = None
    try:
        primary.init(initdb_args=("--wal-segsize=1",))
        primary.start()
        archive = base / "archive"
        archive.mkdir()
        streamer = start_streaming("-D", str(archive), "-d", primary.dsn, "--no-sync",
                                   log=base / "stream.log")
        built = Three(base, archive)
        primary.sql("CREATE TABLE rows (n int)")
        for n in range(3):
            primary.sql(f"INSERT INTO rows VALUES ({n})")
            primary.switch_wal()
            with replication_link(primary) as conn:
                built.backups.append(take_backup(
                    conn, BackupRequest(label=f"b{n}", fast=True), archive,
                    identify_server(conn), sync=False))
            primary.switch_wal()
        end = primary.switch_wal()
        built.last = primary.sql(f"SELECT pg_walfile_name('{end}')")
        wait_for(lambda: holds(archive, built.last), timeout=120, what=f"{built.last} archived")
        assert stop(streamer) == 0
        streamer = None
        ids = [r.backup_id for r in built.backups]
        assert len(set(ids)) == 3, ids
        yield built
    finally:
        if streamer is not None:
            streamer.kill()
            streamer.wait(timeout=30)
        primary.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def upload(seaweed: SeaweedS3, archive: Path, prefix: str) -> None:
    """The archive's files as the uploader and a bucket backup leave them at ``prefix``."""
    client = seaweed.client()
    names = [str(p.relative_to(archive)) for p in archive.rglob("*") if p.is_file()]
    names = [n for n in names if not n.startswith(".") or n == IDENTITY_FILE]

    def put(name: str) -> None:
        client.put_object(Bucket=seaweed.bucket, Key=f"{prefix}/{name}",
                          Body=(archive / name).read_bytes())

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(put, names))


def listed_bucket(seaweed: SeaweedS3, prefix: str) -> list[str]:
    pages = seaweed.client().get_paginator("list_objects_v2").paginate(
        Bucket=seaweed.bucket, Prefix=prefix + "/")
    return sorted(item["Key"][len(prefix) + 1:] for page in pages
                  for item in page.get("Contents", ()))


def main_archive(record: BackupRecord) -> str:
    return next(a.name for a in record.archives if a.tablespace_oid is None)


@pytest.mark.parametrize("damage", ["removed", "truncated"])
@pytest.mark.parametrize("where", ["directory", "bucket"])
def test_retention_and_recover_count_only_a_backup_whose_files_are_there(
        three: Three, store: SeaweedS3, *, where: str, damage: str) -> None:
    oldest, good, broken = three.backups
    tar = f"{BACKUPS}/{broken.backup_id}/{main_archive(broken)}"
    case = f"{where}-{damage}"
    if where == "directory":
        archive = three.base / "cases" / case
        shutil.copytree(three.pristine, archive)
        location = str(archive)
        if damage == "removed":
            (archive / tar).unlink()
        else:
            with (archive / tar).open("r+b") as fh:
                fh.truncate(len(fh.read()) // 2)

        def listing() -> list[str]:
            return sorted(str(p.relative_to(archive)) for p in archive.rglob("*")
                          if p.is_file())
    else:
        prefix = f"present/{case}"
        upload(store, three.pristine, prefix)
        location = f"s3://{store.bucket}/{prefix}"
        client = store.client()
        if damage == "removed":
            client.delete_object(Bucket=store.bucket, Key=f"{prefix}/{tar}")
        else:  # the object written again, cut short
            data = (three.pristine / tar).read_bytes()
            client.delete_object(Bucket=store.bucket, Key=f"{prefix}/{tar}")
            client.put_object(Bucket=store.bucket, Key=f"{prefix}/{tar}",
                              Body=data[:len(data) // 2])

        def listing() -> list[str]:
            return listed_bucket(store, prefix)

    done = receivewal("cleanup", "-D", location, "--keep-backups", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    said = [line for line in lines if line.startswith(f"backup {broken.backup_id}: ")]
    assert len(said) == 1, done.stdout
    assert said[0].startswith(f"backup {broken.backup_id}: kept: not counted as a backup"), said
    why = "is missing" if damage == "removed" else "bytes, its record says"
    assert main_archive(broken) in said[0], said
    assert why in said[0], said
    assert f"backup {good.backup_id}: kept: one of the 1 newest complete backups" in lines, \
        done.stdout
    assert any(line.startswith(f"backup {oldest.backup_id}: removed") for line in lines), \
        done.stdout

    after = listing()
    assert not any(name.startswith(f"{BACKUPS}/{oldest.backup_id}/") for name in after)
    assert any(name.startswith(f"{BACKUPS}/{broken.backup_id}/") for name in after)
    assert f"{BACKUPS}/{good.backup_id}/backup.json" in after
    first = segment_of(good.start_lsn, SEGMENT)
    last = int(three.last[16:], 16) + (int(three.last[8:16], 16) << 12)
    needed = [wal_file_name(good.timeline, segno, SEGMENT) for segno in range(first, last + 1)]
    assert len(needed) >= 3
    assert [name for name in needed if name not in after] == []
    assert wal_file_name(1, segment_of(oldest.start_lsn, SEGMENT), SEGMENT) not in after

    pgdata = three.base / "recovered" / case
    recovered = receivewal("recover", "latest", "--to", str(pgdata), "-D", location)
    assert recovered.returncode == 0, recovered.stderr
    assert recovered.stdout.startswith(f"backup {good.backup_id} "), recovered.stdout
    assert (pgdata / "PG_VERSION").is_file()

    named = receivewal("recover", broken.backup_id, "--to", str(pgdata) + "-named", "-D",
                       location)
    assert named.returncode != 0
    assert f"backup {broken.backup_id} is not complete: its record is there, not all its " \
           f"files: {main_archive(broken)}" in named.stderr, named.stderr
    assert "Traceback" not in named.stderr


def test_two_backups_given_one_id_leave_only_one_and_it_is_whole(store: SeaweedS3) -> None:
    """Two sealed backups into one bucket under the same ID (RECEIVEWAL_TEST_BACKUP_ID: as if
    both had listed ``backups/`` in the same second): the first claims the ID and completes;
    the second finds the claim, exits != 0 with one line naming it, and removes nothing (the
    first's recipients object was removed by such a loser once: its create-only put had found
    the same bytes and counted them as its own). The first verifies whole and recovers."""
    base = make_shared_dir("receivewal-sameid-")
    primary = PgServer(base, "primary")
    streamer = None
    try:
        primary.init(initdb_args=("--wal-segsize=1",))
        primary.start()
        archive = base / "archive"
        archive.mkdir()
        url = f"s3://{store.bucket}/same-id"
        streamer = start_streaming("-D", str(archive), "-d", primary.dsn, "--no-sync",
                                   "--upload-to", url, log=base / "stream.log")
        key = new_identity_file(base / "key.txt")
        backup_id = "20300101T000000Z"
        env = {"RECEIVEWAL_TEST_BACKUP_ID": backup_id}
        taken = [receivewal("backup", "-D", url, "-d", primary.dsn, "--fast", "--encrypt-to",
                            key.recipient, env=env, timeout=300) for _ in range(2)]
        first, second = taken
        assert first.returncode == 0, first.stderr
        assert first.stdout.startswith(f"backup {backup_id} complete: "), first.stdout
        assert second.returncode != 0, second.stdout

        checked = receivewal("verify", "--json", "--identity", str(key.path), url,
                             timeout=300)
        report = json.loads(checked.stdout)
        states = {b["backup_id"]: (b["state"], b["detail"]) for b in report["backups"]}
        assert list(states) == [backup_id], states
        assert states[backup_id][0] == "verified", states
        error = second.stderr.strip().splitlines()[-1]
        assert error == (f"receivewal: error: backup ID {backup_id} is taken: another backup "
                         f"claimed it ({url}/backups/{backup_id}/claim.json); nothing was "
                         "written"), second.stderr
        assert "Traceback" not in second.stderr
        recovered = receivewal("recover", "--to", str(base / "recovered"), "-D", url,
                               "--identity", str(key.path), timeout=300)
        assert recovered.returncode == 0, recovered.stderr
        assert recovered.stdout.startswith(f"backup {backup_id} "), recovered.stdout
    finally:
        if streamer is not None:
            stop(streamer)
        primary.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)
