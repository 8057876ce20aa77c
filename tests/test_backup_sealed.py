"""``backup --encrypt-to`` and ``recover``/``verify --identity`` as a user runs them (issue 28
§4), against a real PostgreSQL 15 and SeaweedFS: ``stream --encrypt-to`` seals the WAL archive
(and what it uploads), a sealed backup goes into the directory and one into the bucket; a
recovery to a time between two marker rows with the identity file reaches 'before' and not
'after', its restore_command decrypting the WAL; without the key, or with another, recover
fails in one line before PGDATA is touched. The ``age`` command line decrypts the stored tars
(which tar lists) and the manifest."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import zstandard
from support.agekeys import KeyPair, age_command, age_keygen
from support.backups import give_to_postgres, start_recovered
from support.postgres_user import S3_PACKAGES, install_for_postgres, readable_by_postgres
from support.seaweed import SeaweedS3
from support.servers import PgServer, make_shared_dir
from support.streams import receivewal, start_streaming, stop, wait_for

from receivewal.archive.recipients import recipient_set
from receivewal.commands.catalog import ENCRYPT_TO_ENV
from receivewal.wal.names import encrypted_file_name

pytestmark = pytest.mark.server


@dataclass
class World:
    base: Path
    pg: PgServer
    seaweed: SeaweedS3
    archive: Path
    url: str
    key: KeyPair
    other: KeyPair
    local_id: str
    bucket_id: str
    target: str
    prefix: str

    def run(self, *args: str, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
        return receivewal(*args, env={**self.seaweed.env(), **(env or {})}, timeout=180)


def backup_id_of(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert " complete: " in first, done.stdout
    return first.split()[1]


@pytest.fixture(scope="module")
def world(seaweed: SeaweedS3) -> Iterator[World]:
    base = make_shared_dir("receivewal-sealedbackup-")
    pg = PgServer(base, "primary")
    streamer = None
    try:
        pg.init(initdb_args=("--wal-segsize=1",))
        pg.start()
        pg.sql("CREATE TABLE marker (what text)")
        pg.sql("CREATE TABLE filler AS SELECT g AS id, repeat('x', 100) AS pad "
               "FROM generate_series(1, 20000) g")
        key, other = age_keygen(base / "key.txt"), age_keygen(base / "other.txt")
        key.path.chmod(0o644)  # the server user runs restore_command (a test's key only)
        archive = base / "archive"
        archive.mkdir()
        url = f"s3://{seaweed.bucket}/sealed-backups"
        log = base / "stream.log"
        streamer = start_streaming("-D", str(archive), "-d", pg.dsn, "--upload-to", url,
                                   "--encrypt-to", key.recipient, log=log, env=seaweed.env())
        world = World(base, pg, seaweed, archive, url, key, other, "", "", "",
                      install_for_postgres(base, ("pyrage", *S3_PACKAGES)))
        world.local_id = backup_id_of(world.run(
            "backup", "-D", str(archive), "-d", pg.dsn, "--fast", "--label", "sealed",
            "--encrypt-to", key.recipient))
        world.bucket_id = backup_id_of(world.run(  # the recipients from the environment
            "backup", "-D", url, "-d", pg.dsn, "--fast", "--label", "sealed-bucket",
            env={ENCRYPT_TO_ENV: f"{key.recipient} {other.recipient}"}))
        pg.sql("INSERT INTO marker VALUES ('before')")
        time.sleep(1.1)
        world.target = pg.sql("SELECT clock_timestamp()")
        time.sleep(1.1)
        pg.sql("INSERT INTO marker VALUES ('after')")
        last = pg.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
        pg.switch_wal()
        sealed_name = encrypted_file_name(last, recipient_set([key.recipient]).fingerprint)
        wait_for((archive / sealed_name).exists, timeout=60,
                 what=f"{last} archived and sealed")
        readable_by_postgres(archive)
        yield world
    finally:
        if streamer is not None:
            stop(streamer)
        pg.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def age_decrypt(key: Path, data: bytes) -> bytes:
    done = subprocess.run([age_command(), "-d", "-i", str(key)], input=data,
                          capture_output=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def tar_names(stored: bytes, key: Path) -> list[str]:
    """The members of a sealed ``.tar.zst.age`` as tar lists them."""
    tar = zstandard.ZstdDecompressor().decompressobj().decompress(age_decrypt(key, stored))
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        return archive.getnames()


def test_sealed_files_decrypt_with_age_and_tar_lists_them(world: World) -> None:
    backup = world.archive / "backups" / world.local_id
    assert sorted(p.name for p in backup.iterdir()) == [
        "backup.json", "backup_manifest.age", "backup_manifest.age.recipients",
        "base.tar.zst.age", "base.tar.zst.age.recipients"]
    record = json.loads((backup / "backup.json").read_text())
    assert record["encryption"] == {"format": "age", "recipients": [world.key.recipient]}
    assert world.key.recipient in (backup / "base.tar.zst.age.recipients").read_text()
    assert "PG_VERSION" in tar_names((backup / "base.tar.zst.age").read_bytes(), world.key.path)
    manifest = json.loads(age_decrypt(world.key.path,
                                      (backup / "backup_manifest.age").read_bytes()))
    assert manifest["PostgreSQL-Backup-Manifest-Version"] == 1
    identity = json.loads((world.archive / ".receivewal-archive.json").read_text())
    assert json.dumps(identity).count(world.key.recipient) >= 1
    # the bucket's backup: streamed up sealed to both recipients; the other key reads it too
    client = world.seaweed.client()
    prefix = world.url.split("/", 3)[3]

    def get(name: str) -> bytes:
        body = client.get_object(Bucket=world.seaweed.bucket,
                                 Key=f"{prefix}/backups/{world.bucket_id}/{name}")["Body"]
        return bytes(body.read())

    assert "PG_VERSION" in tar_names(get("base.tar.zst.age"), world.other.path)
    listed = get("base.tar.zst.age.recipients").decode()
    assert world.key.recipient in listed
    assert world.other.recipient in listed
    bucket_record = json.loads(get("backup.json"))
    assert sorted(bucket_record["encryption"]["recipients"]) == sorted(
        [world.key.recipient, world.other.recipient])


def test_recover_without_the_key_fails_before_writing(world: World) -> None:
    """No identity, or one that is none of the recipients: one line naming the file, exit 1,
    the data directory left as it was (absent, or empty)."""
    missing = world.base / "never-written"
    done = world.run("recover", "--to", str(missing), "-D", str(world.archive),
                     "--target-time", world.target)
    assert done.returncode == 1, done.stdout
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "backup_manifest.age\" is encrypted to" in done.stderr, done.stderr
    assert "--identity FILE" in done.stderr
    assert not missing.exists()
    empty = world.base / "empty"
    empty.mkdir()
    done = world.run("recover", "--to", str(empty), "-D", str(world.archive),
                     "--target-time", world.target, "--identity", str(world.other.path))
    assert done.returncode == 1, done.stdout
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "backup_manifest.age" in done.stderr, done.stderr
    assert str(world.other.path) in done.stderr, done.stderr
    assert list(empty.iterdir()) == []


def recover_and_check(world: World, archive: str, expect_id: str, name: str) -> None:
    """The backup decrypted while it is unpacked; the server's restore_command gets the
    identity file and decrypts the sealed WAL: 'before' is there, 'after' is not."""
    pgdata = world.base / name
    env = " ".join(f"{k}={v}" for k, v in world.seaweed.env().items())
    done = world.run("recover", "--to", str(pgdata), "-D", archive,
                     "--target-time", world.target, "--identity", str(world.key.path),
                     "--restore-command-prefix", f"{env} {world.prefix}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"backup {expect_id} "), done.stdout
    conf = (pgdata / "postgresql.auto.conf").read_text()
    assert f"--identity {world.key.path.absolute()} %f %p" in conf, conf
    give_to_postgres(pgdata)
    try:
        server = start_recovered(world.base, name)
    except subprocess.CalledProcessError as exc:
        log = world.base / f"{name}.log"
        raise AssertionError(log.read_text() if log.exists() else str(exc)) from exc
    try:
        assert server.sql("SELECT string_agg(what, ',') FROM marker") == "before"
        assert server.sql("SELECT count(*) FROM filler") == "20000"
        assert "recovery stopping before commit" in server.logfile.read_text()
    finally:
        server.stop("immediate")


def test_recover_to_a_time_with_the_identity(world: World) -> None:
    recover_and_check(world, str(world.archive), world.local_id, "recovered")


def test_recover_to_a_time_from_the_bucket_with_the_identity(world: World) -> None:
    """The bucket's backup (sealed to two recipients) and its sealed WAL, read with one key."""
    recover_and_check(world, world.url, world.bucket_id, "recovered-bucket")


def test_verify_reads_sealed_backups_with_the_identity(world: World) -> None:
    for archive, backup_id in ((str(world.archive), world.local_id),
                               (world.url, world.bucket_id)):
        done = world.run("verify", "--identity", str(world.key.path), archive)
        assert f"backup {backup_id}: verified: " in done.stdout, done.stdout + done.stderr
        assert "backups: 1, 0 FAILED" in done.stdout, done.stdout
        assert done.returncode == 0, done.stdout + done.stderr
    done = world.run("verify", str(world.archive))
    assert f"backup {world.local_id}: sealed: its files were not checked: " in done.stdout, \
        done.stdout + done.stderr


def test_a_plain_backup_of_a_sealed_archive_without_the_key_is_warned_about(
        world: World) -> None:
    """A plain backup recovers without a key, but the archive's WAL is sealed: recover says
    the restore_command it wrote cannot read it. (Last: it adds a backup to the archive.)"""
    plain = backup_id_of(world.run("backup", "-D", str(world.archive), "-d", world.pg.dsn,
                                   "--fast", "--label", "plain"))
    pgdata = world.base / "plain-recovered"
    done = world.run("recover", plain, "--to", str(pgdata), "-D", str(world.archive),
                     "--no-sync")
    assert done.returncode == 0, done.stderr
    assert "--identity" not in (pgdata / "postgresql.auto.conf").read_text()
    assert "The archive's WAL is encrypted (to " in done.stdout, done.stdout
    assert f"{world.key.recipient}" in done.stdout
    assert "run recover again with --identity FILE" in done.stdout
