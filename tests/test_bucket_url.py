"""The pure parts of object storage: s3:// URLs, and retries with backoff and full jitter."""

from __future__ import annotations

import pytest

from receivewal.archive.objectstore import (
    BucketUrl,
    RetryPolicy,
    backoff_delay,
    parse_bucket_url,
    with_retries,
)
from receivewal.errors import ConfigurationError, ObjectNotFound, StoreError

SEGMENT = "000000010000000000000001"


@pytest.mark.parametrize(("url", "bucket", "prefix", "key"), [
    ("s3://wal-archive/prod/main", "wal-archive", "prod/main", f"prod/main/{SEGMENT}"),
    ("s3://wal-archive/prod/main/", "wal-archive", "prod/main", f"prod/main/{SEGMENT}"),
    ("s3://wal-archive", "wal-archive", "", SEGMENT),
    ("s3://wal-archive/", "wal-archive", "", SEGMENT),
    ("s3://my.bucket-1/a", "my.bucket-1", "a", f"a/{SEGMENT}"),
])
def test_parse_bucket_url_splits_bucket_and_prefix(url: str, bucket: str, prefix: str,
                                                   key: str) -> None:
    """The prefix may be empty; keys are PREFIX/<file name>; the URL prints back normalised."""
    parsed = parse_bucket_url(url)
    assert parsed == BucketUrl(bucket, prefix)
    assert parsed.key(SEGMENT) == key
    assert parse_bucket_url(str(parsed)) == parsed


@pytest.mark.parametrize(("url", "reason"), [
    ("/var/lib/wal", "not an s3:// URL"),
    ("s3a://bucket/prefix", "not an s3:// URL"),
    ("S3://bucket/prefix", "not an s3:// URL"),
    ("s3://", "no bucket name"),
    ("s3:///prefix", "no bucket name"),
    ("s3://ab/prefix", "not a valid bucket name"),
    ("s3://Upper/prefix", "not a valid bucket name"),
    ("s3://bucket_underscore/x", "not a valid bucket name"),
    ("s3://bucket/a//b", "empty path segment"),
    ("s3://bucket/a/../b", "'.' or '..'"),
    ("s3://bucket/a?versionId=1", "query or fragment"),
    ("s3://bucket/a#b", "query or fragment"),
    ("s3://user@bucket/a", "credentials in it"),
    ("s3://bucket/a\nb", "control character"),
])
def test_parse_bucket_url_refuses_bad_input_saying_why(url: str, reason: str) -> None:
    """A bad URL is a configuration error that quotes the URL and the reason."""
    with pytest.raises(ConfigurationError, match="invalid object storage URL") as info:
        parse_bucket_url(url)
    assert reason in str(info.value)


def test_backoff_delay_has_full_jitter_under_a_growing_cap() -> None:
    """Attempt n waits uniformly in [0, min(max, base * 2**n)): full jitter."""
    policy = RetryPolicy(attempts=10, base_delay=0.5, max_delay=4.0)
    assert [backoff_delay(policy, n, random=lambda: 1.0) for n in range(6)] == \
        [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff_delay(policy, 3, random=lambda: 0.0) == 0.0
    assert backoff_delay(policy, 2, random=lambda: 0.25) == 0.5


def test_with_retries_retries_only_retryable_errors_then_gives_up() -> None:
    """A retryable error is tried `attempts` times with sleeps between; the last one is raised;
    a non-retryable error is raised at once."""
    policy = RetryPolicy(attempts=3, base_delay=1.0, max_delay=10.0)
    calls: list[int] = []
    sleeps: list[float] = []

    def failing() -> None:
        calls.append(len(calls))
        raise StoreError(f"store down (call {len(calls)})")

    with pytest.raises(StoreError, match="call 3"):
        with_retries(failing, policy, sleep=sleeps.append, random=lambda: 1.0)
    assert len(calls) == 3
    assert sleeps == [1.0, 2.0]

    def missing() -> None:
        calls.append(len(calls))
        raise ObjectNotFound("no such key")

    calls.clear()
    with pytest.raises(ObjectNotFound):
        with_retries(missing, policy, sleep=sleeps.append)
    assert calls == [0]


def test_with_retries_returns_the_first_success() -> None:
    """An action that fails once then succeeds returns its value after one sleep."""
    results: list[StoreError | str] = [StoreError("blip"), "done"]
    sleeps: list[float] = []

    def flaky() -> str:
        result = results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    assert with_retries(flaky, RetryPolicy(), sleep=sleeps.append) == "done"
    assert len(sleeps) == 1
