"""Object storage without the network: ``s3://BUCKET/PREFIX`` URLs parsed (which text names a
bucket is :func:`receivewal.archive.location.is_bucket_url`'s to say), the retry policy and the
bounds of a store call.

Pure functions, so that parsing an archive argument never imports boto3; and the watch over a
store call (:class:`StoreWatch`, :func:`bounded_call`): its retries, its wait that a stop
signal ends, the line that says what a long one waits for. The store itself
(boto3, requests, the error translation) is :mod:`receivewal.archive.bucket`. One piece of
process state lives here, for a command's stop signal: what the main thread waits for in the
store (:func:`waiting_for_store`), so that the handler can end that wait at once, and whether a
stop came (:func:`stop_store_calls`), after which the calls are hurried and soon refused.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from receivewal.archive.location import SCHEME, is_bucket_url
from receivewal.errors import ConfigurationError, ReceivewalError, StopRequested
from receivewal.secrets import redacted

# S3's rules for bucket names (3-63 characters: lowercase letters, digits, dots, hyphens,
# starting and ending with a letter or digit); a stricter store refuses more on its own.
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
T = TypeVar("T")


@dataclass(frozen=True)
class BucketUrl:
    """Where an archive lives in object storage: objects are ``PREFIX/<file name>``."""

    bucket: str
    prefix: str  # without leading or trailing slash; "" for the bucket's top level

    def key(self, name: str) -> str:
        """The object key of the file ``name``."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def url(self, name: str) -> str:
        """``s3://BUCKET/KEY`` of the file ``name``, for messages."""
        return f"{SCHEME}{self.bucket}/{self.key(name)}"

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{SCHEME}{self.bucket}"


def parse_bucket_url(text: str) -> BucketUrl:
    """Split ``s3://BUCKET/PREFIX`` (the prefix may be empty); ConfigurationError saying why."""
    def refuse(reason: str) -> ConfigurationError:
        return ConfigurationError(f'invalid object storage URL "{redacted(text[:200])!s}": '
                                  f"{reason} (expected s3://BUCKET/PREFIX)")

    if not is_bucket_url(text):
        raise refuse("not an s3:// URL")
    if _CONTROL.search(text):
        raise refuse("it contains a control character")
    if "?" in text or "#" in text:
        raise refuse("a query or fragment (? or #) is not part of a bucket URL")
    bucket, _, prefix = text[len(SCHEME):].partition("/")
    if "@" in bucket:  # s3://KEY:SECRET@bucket: never echoed, never used
        raise ConfigurationError("invalid object storage URL: credentials in it (USER@ or "
                                 "USER:PASSWORD@) are not accepted (not shown): give "
                                 "s3://BUCKET/PREFIX and the credentials as boto3 takes them "
                                 "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
                                 "or a role)")
    if not bucket:
        raise refuse("no bucket name")
    if not _BUCKET_NAME.fullmatch(bucket) or ".." in bucket:
        raise refuse(f"{bucket!r} is not a valid bucket name (3 to 63 lowercase "
                             "letters, digits, dots and hyphens)")
    prefix = prefix.removesuffix("/")
    parts = prefix.split("/") if prefix else []
    if any(part == "" for part in parts):
        raise refuse("an empty path segment (//) in the prefix")
    if any(part in {".", ".."} for part in parts):
        raise refuse("'.' or '..' as a path segment of the prefix")
    return BucketUrl(bucket, prefix)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a retryable store error is tried again."""

    attempts: int = 5  # calls in all, the first included
    base_delay: float = 0.5  # seconds: the cap of the first wait, doubled at each attempt
    max_delay: float = 30.0  # seconds: no wait is longer


@dataclass(frozen=True)
class Patience:
    """How long one request waits for the store, and how many attempts botocore makes inside
    it; receivewal's own retries (:class:`RetryPolicy`) come on top."""

    connect: float = 10.0  # seconds to connect, and for each send of the request (urllib3's)
    read: float = 60.0  # seconds without a byte of the answer
    attempts: int = 3
    notice: float | None = None  # seconds a call waits before a line says what it waits for


#: ``RECEIVEWAL_STORE_TIMEOUT``: the seconds a request of ``backup``, ``recover``, ``cleanup``,
#: ``verify`` and ``analyze`` waits for a byte of the store's answer.
STORE_TIMEOUT_ENV = "RECEIVEWAL_STORE_TIMEOUT"
STORE_TIMEOUT = 15.0
#: The commands' retries of a store call: 3 tries, so that a store that accepts connections and
#: never answers fails a call after about 3 x 15 s + 1.5 s, not 5 x 3 x 60 s (905 s, issue 32).
COMMAND_RETRY = RetryPolicy(attempts=3, base_delay=0.5, max_delay=4.0)
#: After a stop signal: each request waits this long at most (a backup's clean-up), and no store
#: call begins once STOP_GRACE seconds have passed since the signal.
HURRIED = Patience(connect=1.0, read=2.0, attempts=1)
STOP_GRACE = 3.0


def store_timeout(environ: Mapping[str, str]) -> float:
    """``RECEIVEWAL_STORE_TIMEOUT`` (a positive number of seconds; anything else, or nothing,
    is :data:`STORE_TIMEOUT`)."""
    try:
        value = float(environ.get(STORE_TIMEOUT_ENV, "") or STORE_TIMEOUT)
    except ValueError:
        return STORE_TIMEOUT
    return value if 0 < value < 1e6 else STORE_TIMEOUT


def command_patience(environ: Mapping[str, str]) -> Patience:
    """How long a command's request waits (:func:`store_timeout`), one try per request inside
    botocore (:data:`COMMAND_RETRY` retries), and a line after at most 10 s of waiting."""
    seconds = store_timeout(environ)
    return Patience(connect=min(seconds, 5.0), read=seconds, attempts=1,
                    notice=min(10.0, max(seconds / 2, 0.5)))


class StoreWaitEnded(BaseException):
    """Raised by a stop signal's handler in the main thread while it waits on the store: a
    BaseException, so that the store's library (which wraps every Exception raised while it
    sends a request) lets it through; :func:`waiting_for_store` turns it into StopRequested."""


class _MainThreadCalls:
    """What the main thread waits for in the store (innermost last), and when a stop signal
    asked for the calls to end: for the signal's handler, which runs in the main thread."""

    def __init__(self) -> None:
        self.waiting: list[str] = []
        self.stopped_at: float | None = None


_CALLS = _MainThreadCalls()


@contextlib.contextmanager
def waiting_for_store(what: str) -> Iterator[None]:
    """Around a store call: in the main thread, ``what`` is what a stop signal interrupts
    (:func:`stop_store_calls`); once the stop's grace has passed, no call begins
    (StopRequested)."""
    stopped_at = _CALLS.stopped_at
    if stopped_at is not None and time.monotonic() - stopped_at > STOP_GRACE:
        raise StopRequested(f"stopped: {what} was not asked once the stop signal came")
    main = threading.current_thread() is threading.main_thread()
    if main:
        _CALLS.waiting.append(what)
    try:
        yield
    except StoreWaitEnded as exc:
        raise StopRequested(str(exc)) from None
    finally:
        if main:
            _CALLS.waiting.pop()


def stop_store_calls() -> str | None:
    """For a stop signal's handler: from now on each store call is tried once, each request
    waits :data:`HURRIED` at most, and none begins after :data:`STOP_GRACE` seconds (what a
    backup given up removes is done by then, or named). What the main thread waits for in the
    store now, if it does (the handler may then raise to end the wait at once)."""
    if _CALLS.stopped_at is None:
        _CALLS.stopped_at = time.monotonic()
    return _CALLS.waiting[-1] if _CALLS.waiting else None


def store_stopping() -> bool:
    """Whether a stop signal asked the store calls to end (:func:`stop_store_calls`)."""
    return _CALLS.stopped_at is not None


def backoff_delay(policy: RetryPolicy, attempt: int,
                  random: Callable[[], float] | None = None) -> float:
    """The wait after failed attempt ``attempt`` (0-based): exponential backoff with full
    jitter, uniform in [0, min(max_delay, base_delay * 2**attempt)); ``random`` defaults to
    :func:`random.random`."""
    cap = min(policy.max_delay, policy.base_delay * 2.0 ** min(attempt, 62))
    return cap * (random or _uniform)()


def _uniform() -> float:
    from random import random  # noqa: PLC0415 - only when a store error is retried

    return random()  # noqa: S311 - backoff jitter, not a secret


def with_retries(action: Callable[[], T], policy: RetryPolicy, *,
                 sleep: Callable[[float], None] = time.sleep,
                 random: Callable[[], float] | None = None) -> T:
    """Call ``action`` until it returns, retrying errors whose ``retryable`` is true at most
    ``policy.attempts`` times in all; the last error is raised. The one retry loop of the
    object store: boto3's own retries stay few and short inside each attempt."""
    for attempt in range(max(1, policy.attempts)):
        try:
            return action()
        except ReceivewalError as exc:
            if not exc.retryable or attempt + 1 >= policy.attempts or store_stopping():
                raise
        sleep(backoff_delay(policy, attempt, random))
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


class ObjectStream(io.RawIOBase):
    """An object's body (a GET's streaming body) as a raw file: the store's library errors while
    reading become the project's (``error``), so a reader never sees a library exception."""

    def __init__(self, body: Any, error: Callable[[Exception], ReceivewalError],
                 library_errors: tuple[type[Exception], ...]) -> None:
        super().__init__()
        self._body, self._error = body, error
        self._library_errors: tuple[type[Exception], ...] = (*library_errors, OSError)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        try:
            data = self._body.read(len(view))
        except self._library_errors as exc:
            raise self._error(exc) from exc
        view[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._body.close()
        super().close()


def say_on_stderr(line: str) -> None:
    """A command's line on standard error (written whole, from the notice's timer thread)."""
    sys.stderr.write(f"receivewal: {line}\n")
    sys.stderr.flush()


class _Call:
    """A store call being waited for."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.started = time.monotonic()
        self.said = False


class StoreWatch:
    """Says, once per call, what a store call waiting ``after`` seconds or more waits for: one
    thread per bucket, started with the first call, that looks a few times a second (a thread
    per call would cost each small request a good part of its time)."""

    def __init__(self, after: float, say: Callable[[str, float], None]) -> None:
        self.after, self.say = after, say
        self._lock = threading.Lock()
        self._calls: set[_Call] = set()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def watching(self, what: str) -> Iterator[None]:
        """Around one call that waits for ``what``."""
        call = _Call(what)
        with self._lock:
            self._calls.add(call)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="store-watch",
                                                daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._calls.discard(call)

    def _run(self) -> None:
        while True:
            time.sleep(min(1.0, self.after / 4))
            now = time.monotonic()
            with self._lock:
                due = [c for c in self._calls if not c.said and now - c.started >= self.after]
                for call in due:
                    call.said = True
            for call in due:
                self.say(call.what, self.after)


def bounded_call(action: Callable[[], T], policy: RetryPolicy, what: str,
                 watch: StoreWatch | None) -> T:
    """``action`` (requests that wait for ``what``) with the retry policy, as a wait a stop
    signal ends (:func:`waiting_for_store`); with ``watch``, a line once it has waited the
    watch's seconds."""
    with waiting_for_store(what):
        if watch is None:
            return with_retries(action, policy)
        with watch.watching(what):
            return with_retries(action, policy)
