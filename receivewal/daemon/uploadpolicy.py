"""How patient the daemon's uploads are, the WAL archive's
(:mod:`receivewal.walreceiver.uploader`) and the change log's
(:mod:`receivewal.logicalreceiver.changeuploads`) alike: each request short, one attempt
inside, and the uploader's own loop retrying with backoff.

For the tests only: ``RECEIVEWAL_TEST_UPLOAD_RETRY`` sets the longest wait between tries, in
seconds (30 otherwise); ``RECEIVEWAL_TEST_UPLOAD_TIMEOUT`` the seconds each request waits to
connect and to read.
"""

from __future__ import annotations

from collections.abc import Mapping

from receivewal.archive.objectstore import Patience, RetryPolicy, backoff_delay
from receivewal.errors import ReceivewalError

RETRY_ENV = "RECEIVEWAL_TEST_UPLOAD_RETRY"
TIMEOUT_ENV = "RECEIVEWAL_TEST_UPLOAD_TIMEOUT"
#: Each request of the uploads: 5 s to connect (and for each send), 20 s without a byte of the
#: answer, one attempt: a hanging store is an ``upload_failed`` within ~25 s, then retried.
PATIENCE = Patience(connect=5.0, read=20.0, attempts=1)
ONE_TRY = RetryPolicy(attempts=1)  # the bucket's own retries: none, the uploader's loop retries


def retry_policy(environ: Mapping[str, str]) -> RetryPolicy:
    """The retry policy of the uploads (the tests shorten its waits through RETRY_ENV)."""
    if RETRY_ENV not in environ:
        return RetryPolicy()
    longest = float(environ[RETRY_ENV])
    return RetryPolicy(attempts=2, base_delay=longest / 4, max_delay=longest)


def retry_delay(policy: RetryPolicy, exc: ReceivewalError, attempt: int) -> float:
    """The wait after failed try ``attempt`` (0-based): backoff for what waiting may cure,
    else the longest."""
    return backoff_delay(policy, attempt) if exc.retryable else policy.max_delay


def upload_patience(environ: Mapping[str, str]) -> Patience:
    """How long each request of the uploads waits (the tests shorten it through TIMEOUT_ENV)."""
    if TIMEOUT_ENV not in environ:
        return PATIENCE
    seconds = float(environ[TIMEOUT_ENV])
    return Patience(connect=seconds, read=seconds, attempts=1)
