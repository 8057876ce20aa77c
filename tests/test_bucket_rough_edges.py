"""Rough edges of an archive in a bucket, against a real SeaweedFS: a foreign prefix under
``backups/`` (a ``manual-copy/`` an operator put there) is no backup of ours, so ``cleanup``
neither counts it nor removes it, while an abandoned backup of ours goes as before; a backup
given up while the store refuses connections names the multipart upload whose abort failed,
which is really left behind in the store."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from support.seaweed import SeaweedS3
from support.streams import receivewal
from support.tcpproxy import TcpProxy

from receivewal.archive.bucket import Bucket
from receivewal.archive.compression import NO_COMPRESSION
from receivewal.archive.objectstore import Patience, RetryPolicy
from receivewal.backup.receipt import ArchiveInfo
from receivewal.backup.upload import BucketBackup

pytestmark = pytest.mark.server


def keys(seaweed: SeaweedS3, prefix: str) -> list[str]:
    listed = seaweed.client().list_objects_v2(Bucket=seaweed.bucket, Prefix=f"{prefix}/")
    return sorted(item["Key"] for item in listed.get("Contents", ()))


def put(seaweed: SeaweedS3, key: str, body: bytes = b"leftover") -> None:
    seaweed.client().put_object(Bucket=seaweed.bucket, Key=key, Body=body)


def test_cleanup_neither_counts_nor_removes_a_foreign_prefix_under_backups(
        seaweed: SeaweedS3) -> None:
    """``backups/manual-copy/`` (with a record copied from elsewhere) and ``backups/old/``
    beside an abandoned backup of ours: cleanup names neither foreign prefix and leaves their
    objects alone; the abandoned backup (its ID a time 8 days back and more) is removed."""
    prefix = "foreign"
    ours = "20200101T000000Z"
    put(seaweed, f"{prefix}/backups/{ours}/base.tar.zst")
    for name in ("manual-copy/base.tar.zst", "manual-copy/backup.json", "old/x",
                 "20200101T000000Z-copy/base.tar"):
        put(seaweed, f"{prefix}/backups/{name}")
    foreign = [k for k in keys(seaweed, prefix) if f"/{ours}/" not in k]
    done = receivewal("cleanup", "-D", f"s3://{seaweed.bucket}/{prefix}", "--keep-backups", "1",
                      env=seaweed.env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"backup {ours}: removed: an abandoned backup" in done.stdout, done.stdout
    for name in ("manual-copy", "old", "20200101T000000Z-copy"):
        assert f"backup {name}:" not in done.stdout, done.stdout
    assert keys(seaweed, prefix) == foreign


@pytest.fixture
def refusing(seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> Iterator[TcpProxy]:
    """A proxy in front of the store, which this process reaches the store through."""
    proxy = TcpProxy(seaweed.ports["s3.port"])
    for key, value in seaweed.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{proxy.port}")
    yield proxy
    proxy.close()


def test_a_backup_given_up_with_the_store_refusing_names_the_upload_left_behind(
        seaweed: SeaweedS3, refusing: TcpProxy) -> None:
    """An archive's multipart upload under way, then the store refuses every connection: the
    backup given up cannot abort it, and says so naming the object (it used to say nothing
    while the docs promise that what stays is named); the upload is there in the store."""
    prefix = "refused"
    bucket = Bucket.connect(f"s3://{seaweed.bucket}/{prefix}",
                            retry=RetryPolicy(attempts=2, base_delay=0.1),
                            patience=Patience(connect=2.0, read=5.0, attempts=1))
    target = BucketBackup.create(bucket, datetime(2034, 1, 1, tzinfo=UTC), NO_COMPRESSION)
    target.begin_archive(ArchiveInfo("base.tar", None, "", ""))
    target.archive_bytes(memoryview(b"x" * 1024))
    refusing.close()  # connections refused from now on
    left = target.abort()
    where = f"s3://{seaweed.bucket}/{prefix}/backups/{target.backup_id}/base.tar"
    assert [line for line in left if where in line and "multipart upload" in line], left
    key = f"{prefix}/backups/{target.backup_id}/base.tar"
    uploads = seaweed.client().list_multipart_uploads(Bucket=seaweed.bucket,
                                                      Prefix=f"{prefix}/").get("Uploads", [])
    assert [u["Key"] for u in uploads] == [key]
    for upload in uploads:
        seaweed.client().abort_multipart_upload(Bucket=seaweed.bucket, Key=upload["Key"],
                                                UploadId=upload["UploadId"])
