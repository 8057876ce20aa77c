"""The uploader: completed archive files go to object storage, in order, from a thread of their
own, so that the receive loop never waits for the network.

The archive tells it of each segment or history file once that is durable under its final name
(:attr:`Archive.on_completed`); at start it takes the backlog from the archive directory and
the local upload record (:mod:`receivewal.archive.uploads`), never from a listing of the
bucket. Before the first upload, the prefix is claimed for this cluster (the identity object).

Failures never skip a file. A retryable one (the store down, throttled, credentials rejected)
is retried with exponential backoff and full jitter, without end, while streaming goes on
locally. A file that cannot go up as it is (a *different* object already at its key, a missing
bucket) is a hard error: the uploader logs it, shows it in ``status``, leaves the stored object
as it is and stops there (retrying that file now and then, so that it carries on by itself once
an operator has removed the stray object): going on with the next files would leave a hole in
the bucket that nothing points at, and would let ``--confirm-after upload`` release WAL that
the bucket lacks.

For the crash and store tests only: ``RECEIVEWAL_TEST_UPLOAD_PAUSE`` names a file into which the
uploader writes the name it has just put, before recording it, and then waits forever (so a
test can SIGKILL the daemon exactly there); ``RECEIVEWAL_TEST_UPLOAD_RETRY`` sets the longest
wait between tries, in seconds (30 otherwise).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from structlog.typing import FilteringBoundLogger

from receivewal.archive.directory import Archive
from receivewal.archive.identity import ArchiveIdentity
from receivewal.archive.listing import Listing
from receivewal.archive.objectstore import RetryPolicy, backoff_delay
from receivewal.archive.uploads import (
    PendingFile,
    UploadRecord,
    describe_file,
    is_uploadable,
    pending_files,
    read_upload_record,
    segment_end,
    write_upload_record,
)
from receivewal.daemon.state import LastError
from receivewal.errors import ObjectConflict, ReceivewalError
from receivewal.wal.names import parse_history_file_name

if TYPE_CHECKING:
    from receivewal.archive.bucket import Bucket

PAUSE_ENV = "RECEIVEWAL_TEST_UPLOAD_PAUSE"
RETRY_ENV = "RECEIVEWAL_TEST_UPLOAD_RETRY"
CLOSE_SECONDS = 10.0  # how long stopping waits for an upload in flight


def retry_policy(environ: Mapping[str, str]) -> RetryPolicy:
    """The retry policy of the uploads (the tests shorten its waits through RETRY_ENV)."""
    if RETRY_ENV not in environ:
        return RetryPolicy()
    longest = float(environ[RETRY_ENV])
    return RetryPolicy(attempts=2, base_delay=longest / 4, max_delay=longest)


@dataclass(frozen=True)
class UploadStatus:
    """What ``status`` and the metrics show of the uploads."""

    destination: str
    pending_files: int = 0
    pending_bytes: int = 0
    oldest_pending: float | None = None  # completion time of the oldest pending file
    uploaded_files: int = 0  # since the daemon started
    uploaded_bytes: int = 0
    last_uploaded: str | None = None
    uploaded_end: int | None = None  # LSN: end of the last segment confirmed uploaded
    last_error: LastError | None = None
    failing_since: float | None = None  # None: the last try succeeded

    def state_fields(self) -> dict[str, Any]:
        """The State fields that show this status (the state file, ``status``)."""
        return {
            "upload_to": self.destination,
            "upload_pending_files": self.pending_files,
            "upload_pending_bytes": self.pending_bytes,
            "upload_oldest_pending": self.oldest_pending,
            "uploaded_files": self.uploaded_files,
            "last_uploaded": self.last_uploaded,
            "upload_error": self.last_error,
            "upload_failing_since": self.failing_since,
        }


def confirmable_flush(flush: int, uploaded_end: int | None, floor: int) -> int:
    """What --confirm-after upload reports: never past the end of the last segment uploaded;
    and nothing (0: the server keeps the slot where it is) while that end lies before
    ``floor``, where this session's stream started. A physical slot takes any position it is
    told, backwards too: a backlog left by a run without --confirm-after upload must not move
    the slot back to WAL the server may have removed meanwhile."""
    if uploaded_end is None or uploaded_end < floor:
        return 0
    return min(flush, uploaded_end)


class Uploader:
    """Follows the archive's completed files and uploads each, in order, on one thread."""

    def __init__(self, archive: Archive, bucket: Bucket, log: FilteringBoundLogger,
                 retry: RetryPolicy, *, environ: Mapping[str, str],
                 clock: Callable[[], float] = time.time) -> None:
        self.archive = archive
        self.bucket = bucket
        self.log = log
        self.retry = retry
        self.clock = clock
        self.segment_size = 0  # known once the server is identified (begin)
        self._identity: ArchiveIdentity | None = None
        self._claimed = False
        self._record = UploadRecord(str(bucket.url))
        self._pending: deque[PendingFile] = deque()
        self._queued: set[str] = set()
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pause = environ.get(PAUSE_ENV)
        self._status = UploadStatus(str(bucket.url))
        self._floor = 0  # where the current session streams from

    # -- the session's side ------------------------------------------------------------------
    def begin(self, identity: ArchiveIdentity, listing: Listing | None = None) -> None:
        """Once per daemon, when the server is identified and before anything is streamed:
        claim the prefix (a refusal raises, non-retryable: nothing is written), take the
        backlog from the archive (``listing``, when the start-up took one), follow its
        completions and start the thread. When the store cannot be reached now, the claim is
        left to the thread and streaming goes on."""
        if self._thread is not None:
            return
        self._identity, self.segment_size = identity, identity.segment_size
        try:
            self.bucket.claim_prefix(identity)
            self._claimed = True
        except ReceivewalError as exc:
            if not exc.retryable:
                raise
            self._failed(exc, "upload_claim_deferred")
        self._record = read_upload_record(self.archive, str(self.bucket.url))
        end = None if self._record.segment is None else \
            segment_end(self._record.segment, self.segment_size)
        self._update(uploaded_end=end)
        for pending in pending_files(self.archive, self._record, self.segment_size,
                                     listing):
            self._enqueue(pending)
        self.archive.on_completed = self.follow
        self._thread = threading.Thread(target=self._work, name="uploader", daemon=True)
        self._thread.start()
        self.log.info("uploads_started", destination=str(self.bucket.url),
                      backlog=len(self._pending), last_uploaded=self._record.segment)

    def follow(self, name: str) -> None:
        """The archive's hook: ``name`` is complete and durable; queue it (never blocks on the
        network)."""
        if not is_uploadable(name, self.segment_size):
            return
        try:
            pending = describe_file(self.archive, name)
        except ReceivewalError:  # the upload will say what is wrong: never fail the writer
            pending = PendingFile(name, 0, self.clock())
        if pending is not None:
            self._enqueue(pending)

    def streaming_from(self, lsn: int) -> None:
        """The session streams from ``lsn``: the server still had WAL there."""
        self._floor = lsn

    def confirmable(self, flush: int) -> int:
        """The flush position to report with --confirm-after upload (see
        :func:`confirmable_flush`)."""
        return confirmable_flush(flush, self._status.uploaded_end, self._floor)

    def status(self) -> UploadStatus:
        """A consistent snapshot (any thread)."""
        with self._wake:
            return self._status

    def close(self) -> None:
        """Stop the thread: an upload in flight gets a few seconds, the rest waits on disk for
        the next run."""
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(CLOSE_SECONDS)
        self.archive.on_completed = None

    # -- the thread --------------------------------------------------------------------------
    def _work(self) -> None:
        try:
            if not self._claimed:
                self._until_done(self._claim)
            while (item := self._next()) is not None:
                self._until_done(partial(self._upload, item))
        except BaseException as exc:
            self._failed(ReceivewalError(f"the uploader stopped: {type(exc).__name__}: {exc}"),
                         "uploader_stopped")
            raise

    def _claim(self) -> None:
        assert self._identity is not None
        self.bucket.claim_prefix(self._identity)
        self._claimed = True

    def _next(self) -> PendingFile | None:
        with self._wake:
            while not self._pending and not self._stop.is_set():
                self._wake.wait()
            return None if self._stop.is_set() else self._pending[0]

    def _until_done(self, action: Callable[[], None]) -> None:
        """Try ``action`` until it succeeds or the daemon stops; never skip it."""
        attempt = 0
        while not self._stop.is_set():
            try:
                action()
            except ReceivewalError as exc:
                event = "upload_conflict" if isinstance(exc, ObjectConflict) else \
                    "upload_failed" if exc.retryable else "upload_refused"
                self._failed(exc, event)
                delay = backoff_delay(self.retry, attempt) if exc.retryable \
                    else self.retry.max_delay
                attempt += 1
                self._stop.wait(delay)
            else:
                if self._status.failing_since is not None:
                    self.log.info("uploads_recovered", destination=str(self.bucket.url))
                self._update(failing_since=None)
                return

    def _upload(self, item: PendingFile) -> None:
        self.bucket.put_new(item.name, self.archive.directory / item.name)
        if self._pause:
            Path(self._pause).write_text(item.name)
            threading.Event().wait()  # forever: the test SIGKILLs us here
        record = self._record.with_uploaded(item.name, self.segment_size)
        write_upload_record(self.archive, record)
        self._record = record
        history = parse_history_file_name(item.name) is not None
        with self._wake:
            self._pending.popleft()
            self._queued.discard(item.name)
            status = self._status
            end = status.uploaded_end if history else \
                max(status.uploaded_end or 0, segment_end(item.name, self.segment_size))
            self._status = self._counted(
                uploaded_files=status.uploaded_files + 1,
                uploaded_bytes=status.uploaded_bytes + item.size,
                last_uploaded=item.name, uploaded_end=end)
        self.log.info("file_uploaded", file=item.name, key=self.bucket.key(item.name),
                      bytes=item.size, backlog=len(self._pending))

    # -- bookkeeping -------------------------------------------------------------------------
    def _enqueue(self, item: PendingFile) -> None:
        with self._wake:
            if item.name in self._queued:
                return
            self._queued.add(item.name)
            self._pending.append(item)
            self._status = self._counted()
            self._wake.notify_all()

    def _counted(self, **changes: Any) -> UploadStatus:
        """The status with the backlog recounted (the lock is held)."""
        oldest = self._pending[0].completed_at if self._pending else None
        return replace(self._status, **changes, pending_files=len(self._pending),
                       pending_bytes=sum(p.size for p in self._pending), oldest_pending=oldest)

    def _update(self, **changes: Any) -> None:
        with self._wake:
            self._status = self._counted(**changes)

    def _failed(self, exc: ReceivewalError, event: str) -> None:
        now = self.clock()
        error = LastError(type(exc).__name__, str(exc), now)
        since = self._status.failing_since or now
        self._update(last_error=error, failing_since=since)
        if exc.retryable:
            self.log.warning(event, error=str(exc), kind=error.kind)
        else:
            self.log.error(event, error=str(exc), kind=error.kind)
