"""The object store's door (receivewal.archive.bucket) against a real S3 server (SeaweedFS).

Each test works under a prefix of its own in the module's server; nothing here mocks the
store's behaviour."""

from __future__ import annotations

import hashlib
import io
import itertools
from pathlib import Path

import pytest
from support.seaweed import SeaweedS3

from receivewal.archive.bucket import Bucket
from receivewal.archive.identity import IDENTITY_FILE, ArchiveIdentity, claim_identity
from receivewal.archive.objectstore import RetryPolicy
from receivewal.errors import (
    ArchiveError,
    ForeignArchive,
    ObjectConflict,
    ObjectNotFound,
    StoreAccessDenied,
    StoreError,
    StoreRefused,
)

pytestmark = pytest.mark.server

QUICK = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.05)
_prefixes = itertools.count()
SYSID_A = "7311231231231231231"
SYSID_B = "7399999999999999999"


@pytest.fixture
def bucket(seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    """A Bucket under a fresh prefix, configured through the environment only (boto3's chain)."""
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    return Bucket.connect(f"s3://{seaweed.bucket}/test-{next(_prefixes)}/wal", retry=QUICK)


def stored(seaweed: SeaweedS3, key: str) -> bytes:
    """The object's bytes as the store has them, read with a client of the test's own."""
    return bytes(seaweed.client().get_object(Bucket=seaweed.bucket, Key=key)["Body"].read())


def test_put_new_twice_with_the_same_bytes_succeeds(bucket: Bucket) -> None:
    """A retry after a lost reply finds its own object (same SHA-256) and counts as success."""
    name = "000000010000000000000001"
    bucket.put_new(name, b"segment bytes")
    bucket.put_new(name, b"segment bytes")
    assert bucket.get_bytes(name, max_size=1 << 20) == b"segment bytes"
    info = bucket.head(name)
    assert info.size == len(b"segment bytes")
    assert info.sha256 == hashlib.sha256(b"segment bytes").hexdigest()


def test_put_new_over_different_bytes_is_a_hard_error_and_leaves_the_object(
        bucket: Bucket, seaweed: SeaweedS3) -> None:
    """No overwrite, ever: a different object at the key is refused, naming the key."""
    name = "000000010000000000000002"
    bucket.put_new(name, b"the first upload")
    with pytest.raises(ObjectConflict, match=f"s3://{seaweed.bucket}/{bucket.key(name)}") as info:
        bucket.put_new(name, b"something else")
    assert not info.value.retryable
    assert stored(seaweed, bucket.key(name)) == b"the first upload"


def test_put_new_streams_a_file_and_get_writes_it_back(bucket: Bucket, tmp_path: Path) -> None:
    """A file goes up from disk and comes back byte for byte into a file object."""
    source = tmp_path / "000000010000000000000003"
    body = bytes(range(256)) * 4096 * 3  # 3 MiB
    source.write_bytes(body)
    bucket.put_new(source.name, source)
    out = io.BytesIO(b"leftover of an earlier attempt")
    out.seek(0)
    assert bucket.get(source.name, out, max_size=len(body)) == len(body)
    assert out.getvalue() == body


def test_get_refuses_an_object_over_the_size_cap(bucket: Bucket) -> None:
    """A reader never takes more than it asked for: an object over the cap is an error."""
    bucket.put_new("big", b"x" * 1000)
    with pytest.raises(ArchiveError, match="larger than 999 bytes"):
        bucket.get_bytes("big", max_size=999)


def test_get_of_a_missing_key_is_not_found(bucket: Bucket) -> None:
    """A definite "no such key" has its own type (restore turns it into exit 1)."""
    with pytest.raises(ObjectNotFound, match="000000010000000000000099") as info:
        bucket.get_bytes("000000010000000000000099", max_size=1 << 20)
    assert not info.value.retryable
    with pytest.raises(ObjectNotFound):
        bucket.head("000000010000000000000099")


def test_wrong_credentials_are_an_access_error_not_a_missing_key(
        seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rejected secret reads as an access problem (restore: 126), never as "not found"."""
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    wrong = Bucket.connect(f"s3://{seaweed.bucket}/wrong-credentials", retry=QUICK)
    with pytest.raises(StoreAccessDenied, match="SignatureDoesNotMatch") as info:
        wrong.get_bytes("000000010000000000000001", max_size=1 << 20)
    assert not isinstance(info.value, ObjectNotFound)
    with pytest.raises(StoreAccessDenied):
        wrong.head("000000010000000000000001")
    with pytest.raises(StoreAccessDenied):
        wrong.put_new("000000010000000000000001", b"x")


def test_a_stopped_store_is_a_retryable_error_and_a_restart_keeps_the_data(
        bucket: Bucket, seaweed: SeaweedS3) -> None:
    """The store down: every call fails with a retryable error; back up, the data is there."""
    bucket.put_new("before", b"put before the crash")
    seaweed.kill()
    try:
        for call in (lambda: bucket.put_new("during", b"x"),
                     lambda: bucket.get_bytes("before", max_size=100),
                     lambda: bucket.head("before")):
            with pytest.raises(StoreError, match=seaweed.endpoint) as info:
                call()
            assert info.value.retryable
            assert not isinstance(info.value, ObjectNotFound | StoreAccessDenied)
    finally:
        seaweed.start()
    assert bucket.get_bytes("before", max_size=100) == b"put before the crash"


def test_claim_prefix_refuses_another_cluster_naming_both(bucket: Bucket,
                                                          seaweed: SeaweedS3) -> None:
    """One cluster per prefix: the first claim writes the identity (and says so), the same
    cluster may claim again (another timeline too), another cluster is refused and nothing
    changes."""
    mine = ArchiveIdentity(SYSID_A, 16 * 1024 * 1024, 1)
    assert claim_identity(bucket, mine) is True
    assert claim_identity(bucket, mine) is False
    assert claim_identity(bucket, ArchiveIdentity(SYSID_A, 16 * 1024 * 1024, 2)) is False
    original = stored(seaweed, bucket.key(IDENTITY_FILE))
    with pytest.raises(ForeignArchive, match=f"{SYSID_A}.*{SYSID_B}") as info:
        claim_identity(bucket, ArchiveIdentity(SYSID_B, 16 * 1024 * 1024, 1))
    assert not info.value.retryable
    with pytest.raises(ForeignArchive, match=r"16777216.*67108864"):
        claim_identity(bucket, ArchiveIdentity(SYSID_A, 64 * 1024 * 1024, 1))
    assert stored(seaweed, bucket.key(IDENTITY_FILE)) == original


def test_list_names_reads_every_page(bucket: Bucket) -> None:
    """Listing follows the continuation tokens: 23 names with pages of 5."""
    names = [f"0000000100000000000000{i:02X}" for i in range(23)]
    for name in names:
        bucket.put_new(name, name.encode())
    assert bucket.list_names(page_size=5) == names


def test_put_new_compares_bytes_where_the_store_kept_no_checksum(bucket: Bucket,
                                                                seaweed: SeaweedS3) -> None:
    """An object planted without a SHA-256 (another tool's upload) is read back to compare:
    the same bytes are success, other bytes of the same size a conflict, the object unchanged."""
    client = seaweed.client()
    client.put_object(Bucket=seaweed.bucket, Key=bucket.key("planted"), Body=b"planted bytes")
    assert bucket.head("planted").sha256 is None
    bucket.put_new("planted", b"planted bytes")
    with pytest.raises(ObjectConflict, match="planted"):
        bucket.put_new("planted", b"PLANTED BYTES")
    assert stored(seaweed, bucket.key("planted")) == b"planted bytes"


def test_no_credentials_at_all_is_an_access_error(seaweed: SeaweedS3,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing in boto3's chain: the error says how to configure credentials."""
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    anonymous = Bucket.connect(f"s3://{seaweed.bucket}/no-credentials", retry=QUICK)
    with pytest.raises(StoreAccessDenied, match=r"no usable credentials.*AWS_ACCESS_KEY_ID"):
        anonymous.head("000000010000000000000001")


def test_a_missing_bucket_is_refused_not_a_missing_key(seaweed: SeaweedS3,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A bucket that does not exist is a refusal (not retryable), never "no such key"."""
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    nowhere = Bucket.connect("s3://no-such-bucket-here/wal", retry=QUICK)
    with pytest.raises(StoreRefused, match="no such bucket") as info:
        nowhere.get_bytes("000000010000000000000001", max_size=100)
    assert not info.value.retryable


def test_the_same_client_carries_on_after_the_store_is_killed_and_restarted(
        bucket: Bucket, seaweed: SeaweedS3) -> None:
    """A store killed (SIGKILL) and restarted on the same directory and ports keeps every
    object, and a Bucket connected before goes on using it without reconnecting."""
    bucket.put_new("000000010000000000000001", b"first")
    endpoint = seaweed.endpoint
    seaweed.restart()
    assert seaweed.endpoint == endpoint
    assert bucket.get_bytes("000000010000000000000001", max_size=100) == b"first"
    bucket.put_new("000000010000000000000002", b"second")
    assert bucket.list_names() == ["000000010000000000000001", "000000010000000000000002"]
