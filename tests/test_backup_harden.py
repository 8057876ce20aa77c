"""``receivewal backup`` where it goes wrong, as a user runs it against a real PostgreSQL 15
and SeaweedFS: a byte of a data file changed on the way (a proxy between the command and the
server) is refused at receipt naming the file, and the backup given up leaves nothing in the
bucket or the directory; a tar member changed at rest in a bucket backup is named by verify;
a killed backup's objects are removed by cleanup once abandoned, a recent one's kept; -w and
-W as pg_basebackup's."""

from __future__ import annotations

import dataclasses
import io
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from support.seaweed import SeaweedS3
from support.servers import PgServer, make_shared_dir, server_user_ids
from support.streams import (
    RECEIVEWAL,
    receivewal,
    start_streaming,
    stop,
    wait_for,
)
from support.tcpproxy import TcpProxy

from receivewal.archive.bucket import Bucket
from receivewal.archive.compression import (
    NO_COMPRESSION,
    decompress_chunks,
    new_compressor,
    parse_compress_option,
)
from receivewal.backup.receipt import ArchiveInfo
from receivewal.backup.record import RECORD_CAP, record_from_json
from receivewal.backup.upload import BucketBackup
from receivewal.errors import ArchiveError, ObjectConflict, StoreError, StoreRefused

pytestmark = pytest.mark.server

MARKER = "harden_marker"  # a file in the data directory, which BASE_BACKUP sends as it is
PATTERN = b"receivewal-flip-me:"
PASSWORD = "pw-3141"  # noqa: S105 - the test role's password


@dataclass
class World:
    base: Path
    pg: PgServer
    seaweed: SeaweedS3
    archive: Path  # the stream daemon's directory
    url: str  # where it uploads
    prefix: str  # the url's prefix in the bucket
    bucket_id: str  # a complete backup in the bucket

    def run(self, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return receivewal(*args, env=self.seaweed.env(), **kwargs)  # type: ignore[arg-type]

    def objects(self, backup_id: str) -> list[str]:
        """The keys under one backup's prefix in the bucket."""
        listed = self.seaweed.client().list_objects_v2(
            Bucket=self.seaweed.bucket, Prefix=f"{self.prefix}/backups/{backup_id}/")
        return [item["Key"] for item in listed.get("Contents", ())]


@pytest.fixture(scope="module")
def world(seaweed: SeaweedS3) -> Iterator[World]:
    base = make_shared_dir("receivewal-backupharden-")
    pg = PgServer(base, "primary")
    streamer = None
    try:
        pg.init(initdb_args=("--wal-segsize=1",))
        with (pg.datadir / "pg_hba.conf").open("r+") as hba:  # the password role's lines first
            rest = hba.read()
            hba.seek(0)
            hba.write(f"host all rep_pw 127.0.0.1/32 scram-sha-256\n"
                      f"host replication rep_pw 127.0.0.1/32 scram-sha-256\n{rest}")
        pg.start()
        pg.sql(f"CREATE ROLE rep_pw LOGIN REPLICATION PASSWORD '{PASSWORD}'")
        marker = pg.datadir / MARKER
        marker.write_bytes(PATTERN * 4096)
        ids = server_user_ids()
        if ids is not None:
            os.chown(marker, *ids)
        archive = base / "archive"
        archive.mkdir()
        url = f"s3://{seaweed.bucket}/harden"
        log = base / "stream.log"
        streamer = start_streaming("-D", str(archive), "-d", pg.dsn, "--upload-to", url,
                                   log=log, env=seaweed.env())
        world = World(base, pg, seaweed, archive, url, "harden", "")
        done = world.run("backup", "-D", url, "-d", pg.dsn, "--fast", timeout=180)
        assert done.returncode == 0, done.stderr
        world.bucket_id = done.stdout.split()[1]
        yield world
    finally:
        if streamer is not None:
            stop(streamer)
        pg.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def flipping_proxy(pg: PgServer) -> TcpProxy:
    """A proxy to ``pg`` that changes one byte of the marker file's content, once, in what
    the server sends (the COPY stream's framing stays as it was)."""
    proxy = TcpProxy(pg.port)
    flipped: list[bool] = []

    def alter(data: bytes) -> bytes:
        at = data.find(PATTERN)
        if flipped or at < 0:
            return data
        flipped.append(True)
        return data[:at] + b"X" + data[at + 1:]

    proxy.alter_downstream = alter
    return proxy


def test_a_byte_changed_in_flight_is_refused_naming_the_file_and_nothing_stays(
        world: World) -> None:
    """Through the flipping proxy, to the bucket and to the directory: exit 1, the last line
    names the file whose checksum differs, no traceback, and the backup given up left no
    object (its uploaded tars removed) and no directory."""
    for archive in (world.url, str(world.archive)):
        proxy = flipping_proxy(world.pg)
        try:
            done = world.run("backup", "-D", archive, "-d",
                             f"host=127.0.0.1 port={proxy.port} user=postgres dbname=postgres",
                             "--fast", "--wal-wait", "5", timeout=120)
        finally:
            proxy.close()
        assert done.returncode == 1, done.stdout + done.stderr
        assert "Traceback" not in done.stderr
        error = done.stderr.strip().splitlines()[-1]
        match = re.fullmatch(r'receivewal: error: backup (\S+) does not match its manifest: '
                             rf'"{MARKER}" has SHA256 checksum [0-9a-f]{{64}} on receipt, '
                             r'[0-9a-f]{64} in the manifest', error)
        assert match, done.stderr
        backup_id = match.group(1)
        assert world.objects(backup_id) == []
        assert not (world.archive / "backups" / backup_id).exists()


def test_verify_names_a_member_changed_at_rest_in_a_bucket_backup(world: World) -> None:
    """The bucket backup verifies; once its base.tar.zst says '16' in PG_VERSION, verify
    exits 1 naming the file."""
    done = world.run("verify", world.url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"backup {world.bucket_id}: verified" in done.stdout
    client = world.seaweed.client()
    key = f"{world.prefix}/backups/{world.bucket_id}/base.tar.zst"
    stored = client.get_object(Bucket=world.seaweed.bucket, Key=key)["Body"].read()
    tar = b"".join(decompress_chunks(io.BytesIO(stored), "zstd"))
    at = tar.index(b"15\n", tar.index(b"PG_VERSION"))
    compressor = new_compressor(parse_compress_option("zstd"))
    changed = compressor.begin() + compressor.compress(tar[:at] + b"16" + tar[at + 2:]) \
        + compressor.finish()
    client.put_object(Bucket=world.seaweed.bucket, Key=key, Body=changed)
    done = world.run("verify", world.url)
    assert done.returncode == 1, done.stdout + done.stderr
    if len(changed) == len(stored):  # the members are read and checked against the manifest
        assert (f"backup {world.bucket_id}: FAILED: backup {world.bucket_id} does not match "
                'its manifest: "PG_VERSION" has SHA256 checksum') in done.stdout, done.stdout
    else:  # the listing already shows it is not the object written (issue 32 item 1)
        assert (f"backup {world.bucket_id}: FAILED: its record is there, not all its files: "
                f"base.tar.zst holds {len(changed)} bytes, its record says {len(stored)}"
                ) in done.stdout, done.stdout
    client.put_object(Bucket=world.seaweed.bucket, Key=key, Body=stored)  # for the next tests


def test_cleanup_removes_an_abandoned_bucket_backup_and_keeps_a_recent_one(
        world: World) -> None:
    """Objects without a record, as a SIGKILLed backup leaves them: under an ID that started
    8 days ago they are removed by cleanup, under one of an hour ago they stay (it may still
    be uploading)."""
    now = datetime.now(UTC)
    old = (now - timedelta(days=8)).strftime("%Y%m%dT%H%M%SZ")
    recent = (now - timedelta(hours=1)).strftime("%Y%m%dT%H%M%SZ")
    client = world.seaweed.client()
    for backup_id in (old, recent):
        for name in ("16384.tar.zst", "base.tar.zst"):
            client.put_object(Bucket=world.seaweed.bucket, Body=b"leftover",
                              Key=f"{world.prefix}/backups/{backup_id}/{name}")
    done = world.run("cleanup", "-D", world.url, "--keep-backups", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (f"backup {old}: removed: an abandoned backup (no record, started more than 7 "
            "days ago: abandoned)") in done.stdout, done.stdout
    assert (f"backup {recent}: kept: no record, and whether it is being written cannot be "
            "told: not removed") in done.stdout, done.stdout
    assert f"backup {world.bucket_id}: kept: " in done.stdout
    assert world.objects(old) == []
    assert len(world.objects(recent)) == 2


def test_a_backup_whose_objects_went_meanwhile_writes_no_record(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bucket backup whose archive was removed while it ran (cleanup took it for abandoned)
    fails at commit naming the object, writes no record, and removes what is left."""
    for key, value in world.seaweed.env().items():
        monkeypatch.setenv(key, value)
    bucket = Bucket.connect(world.url)
    record = record_from_json(bucket.get_bytes(f"backups/{world.bucket_id}/backup.json",
                                               RECORD_CAP), "the record")
    target = BucketBackup.create(bucket, datetime(2030, 1, 1, tzinfo=UTC), NO_COMPRESSION)
    target.begin_archive(ArchiveInfo("base.tar", None, "", ""))
    target.archive_bytes(memoryview(b"x" * 1024))
    target.end_archive()
    target.write_manifest(b"{}")
    bucket.delete(f"backups/{target.backup_id}/base.tar")
    with pytest.raises(ArchiveError, match=r"base\.tar was removed while the backup ran"):
        target.commit(dataclasses.replace(record, backup_id=target.backup_id))
    assert target.abort() == []
    assert world.objects(target.backup_id) == []


def test_a_backup_given_up_names_what_it_could_not_remove(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the store refuses to remove one of its objects, abort removes the others and
    names that one with the store's reason, in one line."""
    for key, value in world.seaweed.env().items():
        monkeypatch.setenv(key, value)
    bucket = Bucket.connect(world.url)
    target = BucketBackup.create(bucket, datetime(2031, 1, 1, tzinfo=UTC), NO_COMPRESSION)
    for name in ("16384.tar", "base.tar"):
        target.begin_archive(ArchiveInfo(name, None, "", ""))
        target.archive_bytes(memoryview(b"x" * 1024))
        target.end_archive()
    target.write_manifest(b"{}")
    real_delete = bucket.delete

    def refusing(name: str) -> None:
        if name.endswith("/base.tar"):
            raise StoreRefused("the store refused the request (AccessDenied)")
        real_delete(name)

    monkeypatch.setattr(bucket, "delete", refusing)
    left = target.abort()
    assert left == [f"could not remove {world.url}/backups/{target.backup_id}/base.tar of the "
                    "backup given up: the store refused the request (AccessDenied)"]
    # the ID stays claimed while an object of it stays (issue 32 item 2)
    assert [key.rsplit("/", 1)[1] for key in world.objects(target.backup_id)] == [
        "base.tar", "claim.json"]
    for name in ("base.tar", "claim.json"):
        real_delete(f"backups/{target.backup_id}/{name}")


def test_sigterm_aborts_the_bucket_upload_in_flight(world: World) -> None:
    """SIGTERM while the first archive is being uploaded (the server throttled to 32 kB/s):
    exit 1, and neither an object nor a multipart upload of the backup is left."""
    client = world.seaweed.client()
    where = f"{world.prefix}/backups/"

    def uploads() -> list[str]:
        listed = client.list_multipart_uploads(Bucket=world.seaweed.bucket, Prefix=where)
        return [item["Key"] for item in listed.get("Uploads", ())]

    before = uploads()
    proc = subprocess.Popen([*RECEIVEWAL, "backup", "-D", world.url, "-d", world.pg.dsn,
                             "--fast", "--max-rate", "32"], env={**os.environ,
                                                                 **world.seaweed.env()},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(uploads()) > len(before), timeout=60,
                 what="the backup's multipart upload")
        key = next(k for k in uploads() if k not in before)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1, stderr
    assert "base backup stopped before it was complete" in stderr
    assert key not in uploads()
    assert world.objects(key.removeprefix(where).split("/")[0]) == []


def test_no_password_and_a_forced_prompt_as_pg_basebackup(world: World) -> None:
    """A role that needs a password: with -w the backup never prompts and fails with
    libpq's reason; with -W the password is read first (no terminal: from standard input, as
    the drop-in reads it) and the backup completes."""
    dsn = f"host=127.0.0.1 port={world.pg.port} user=rep_pw dbname=postgres"
    env = {**os.environ, **world.seaweed.env()}
    env.pop("PGPASSWORD", None)
    argv = [*RECEIVEWAL, "backup", "-D", str(world.archive), "-d", dsn, "--fast"]
    refused = subprocess.run([*argv, "-w"], capture_output=True, text=True, timeout=60,
                             env=env, input="", start_new_session=True, check=False)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "Password:" not in refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("receivewal: error: "), refused.stderr
    assert "password" in last, refused.stderr
    done = subprocess.run([*argv, "-W"], capture_output=True, text=True, timeout=120, env=env,
                          input=f"{PASSWORD}\n", start_new_session=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.startswith("Password: ")
    assert " complete: " in done.stdout.splitlines()[0]
    assert PASSWORD not in done.stdout + done.stderr


def test_a_backup_given_up_never_removes_an_object_it_did_not_write(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer's object at the backup's name (two backups started in the same second
    on two hosts): the create-only upload refuses it, and abort leaves it as it was."""
    for key, value in world.seaweed.env().items():
        monkeypatch.setenv(key, value)
    bucket = Bucket.connect(world.url)
    target = BucketBackup.create(bucket, datetime(2032, 1, 1, tzinfo=UTC), NO_COMPRESSION)
    key = f"{world.prefix}/backups/{target.backup_id}/base.tar"
    client = world.seaweed.client()
    client.put_object(Bucket=world.seaweed.bucket, Key=key, Body=b"the other backup's")
    target.begin_archive(ArchiveInfo("base.tar", None, "", ""))
    target.archive_bytes(memoryview(b"x" * 1024))
    with pytest.raises(ObjectConflict):
        target.end_archive()
    assert target.abort() == []
    body = client.get_object(Bucket=world.seaweed.bucket, Key=key)["Body"].read()
    assert body == b"the other backup's"
    client.delete_object(Bucket=world.seaweed.bucket, Key=key)


def test_cleanup_aborts_the_multipart_uploads_of_an_abandoned_backup(world: World) -> None:
    """A SIGKILLed backup's unfinished multipart upload (its parts are stored, no object):
    under an ID of 8 days ago cleanup aborts it and names the backup; under a recent one it
    stays."""
    client = world.seaweed.client()
    now = datetime.now(UTC)
    old = (now - timedelta(days=8, minutes=5)).strftime("%Y%m%dT%H%M%SZ")
    recent = (now - timedelta(minutes=5)).strftime("%Y%m%dT%H%M%SZ")
    keys = {}
    for backup_id in (old, recent):
        key = f"{world.prefix}/backups/{backup_id}/base.tar.zst"
        upload = client.create_multipart_upload(Bucket=world.seaweed.bucket, Key=key)
        client.upload_part(Bucket=world.seaweed.bucket, Key=key, PartNumber=1,
                           UploadId=upload["UploadId"], Body=b"part" * 1024)
        keys[backup_id] = key

    def uploads() -> set[str]:
        listed = client.list_multipart_uploads(Bucket=world.seaweed.bucket,
                                               Prefix=f"{world.prefix}/backups/")
        return {item["Key"] for item in listed.get("Uploads", ())}

    assert set(keys.values()) <= uploads()
    done = world.run("cleanup", "-D", world.url, "--keep-backups", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"backup {old}: removed: an abandoned backup" in done.stdout, done.stdout
    assert keys[old] not in uploads()
    assert keys[recent] in uploads()
    client.abort_multipart_upload(Bucket=world.seaweed.bucket, Key=keys[recent], UploadId=next(
        item["UploadId"] for item in client.list_multipart_uploads(
            Bucket=world.seaweed.bucket, Prefix=keys[recent]).get("Uploads", ())))


def test_a_record_that_cannot_be_removed_keeps_its_files(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record was stored but its reply lost (an error), and the store then refuses to
    remove it: abort names it and removes nothing else (never a record without its files)."""
    for key, value in world.seaweed.env().items():
        monkeypatch.setenv(key, value)
    bucket = Bucket.connect(world.url)
    record = record_from_json(bucket.get_bytes(f"backups/{world.bucket_id}/backup.json",
                                               RECORD_CAP), "the record")
    target = BucketBackup.create(bucket, datetime(2033, 1, 1, tzinfo=UTC), NO_COMPRESSION)
    target.begin_archive(ArchiveInfo("base.tar", None, "", ""))
    target.archive_bytes(memoryview(b"x" * 1024))
    target.end_archive()
    target.write_manifest(b"{}")
    real_put, real_delete = bucket.put_new, bucket.delete

    def put_then_fail(name: str, source: Path | bytes) -> bool:
        real_put(name, source)
        raise StoreError("the store failed the request (the reply was lost)")

    def refusing(name: str) -> None:
        if name.endswith("/backup.json"):
            raise StoreRefused("the store refused the request (AccessDenied)")
        real_delete(name)

    monkeypatch.setattr(bucket, "put_new", put_then_fail)
    monkeypatch.setattr(bucket, "delete", refusing)
    with pytest.raises(StoreError):
        target.commit(dataclasses.replace(record, backup_id=target.backup_id,
                                          archives=tuple(target.stored),
                                          manifest_name=target.manifest_name))
    left = target.abort()
    assert len(left) == 1
    assert left[0].startswith(f"could not remove {world.url}/backups/{target.backup_id}/"
                              "backup.json of the backup given up: ")
    assert sorted(key.rsplit("/", 1)[1] for key in world.objects(target.backup_id)) == [
        "backup.json", "backup_manifest", "base.tar", "claim.json"]
    for name in ("backup.json", "backup_manifest", "base.tar", "claim.json"):
        real_delete(f"backups/{target.backup_id}/{name}")
