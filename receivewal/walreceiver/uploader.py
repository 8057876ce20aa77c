"""The uploader: completed archive files go to object storage, in order, from a thread of their
own (a :class:`~receivewal.daemon.worker.Worker`), so that the receive loop never waits for the
network.

It follows the files the archive completes on the daemon's event stream
(:class:`~receivewal.daemon.events.SegmentCompleted` and
:class:`~receivewal.daemon.events.HistoryFileWritten`, stated once a file is durable under its
final name), and states its own progress there (:class:`~receivewal.daemon.events.
UploadsChanged`, posted from its thread: the monitor shows it); at start it takes the backlog
from the archive directory and the local upload record (:mod:`receivewal.archive.uploads`),
never from a listing of the bucket.

The prefix is claimed for this cluster (the identity object) from the uploader's thread, before
the first upload: start-up waits a few seconds for the answer, so that another cluster's prefix
stops the daemon before anything is written, and streams on whatever the store does after that
(a store that takes connections and never answers holds nothing but the uploads). While
uploading, the claim is made again now and then (:data:`IDENTITY_RECHECK`): an identity object
deleted by hand or by an expiry rule (it is the prefix's oldest object) is written again
before another cluster can take the prefix, and a prefix taken meanwhile stops the uploads.

Every request has short timeouts and one attempt inside
(:data:`~receivewal.daemon.uploadpolicy.PATIENCE`): the uploader's own
loop retries, and says so at each failed try. Failures never skip a file. A retryable one
(the store down, throttled, credentials rejected) is retried with exponential backoff and full
jitter, without end, while streaming goes on locally. A file that cannot go up as it is (a
*different* object already at its key, a missing bucket, an identity object that cannot be read
or names another cluster) is a hard error: the uploader logs it, shows it in ``status`` and the
metrics as the object the uploads are stopped at (until that object goes up, whatever later
tries say), leaves the stored object as it is and stops there (retrying now and then, so that
it carries on by itself once an operator has removed the stray object): going on with the next
files would leave a hole in the bucket that nothing points at, and would let
``--confirm-after upload`` release WAL that the bucket lacks.

For the crash and store tests only: ``RECEIVEWAL_TEST_UPLOAD_PAUSE`` names a file into which the
uploader writes the name it has just put, before recording it, and then waits forever (so a
test can SIGKILL the daemon exactly there); ``RECEIVEWAL_TEST_UPLOAD_RETRY`` sets the longest
wait between tries, in seconds (30 otherwise); ``RECEIVEWAL_TEST_UPLOAD_TIMEOUT`` the seconds
each request waits to connect and to read, and start-up for the claim;
``RECEIVEWAL_TEST_IDENTITY_RECHECK`` the seconds between checks of the identity object.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from structlog.typing import FilteringBoundLogger

from receivewal.archive.directory import Archive, os_error
from receivewal.archive.identity import IDENTITY_FILE, ArchiveIdentity, claim_identity
from receivewal.archive.listing import Listing
from receivewal.archive.objectstore import RetryPolicy
from receivewal.archive.sealed import fingerprint_of, recipients_path, sealed_problem
from receivewal.archive.segmentcheck import checked_file
from receivewal.archive.uploads import (
    PendingFile,
    UploadRecord,
    describe_file,
    is_uploadable,
    pending_files,
    read_upload_record,
    segment_end,
    upload_order,
    write_upload_record,
)
from receivewal.daemon.events import Event, EventStream, HistoryFileWritten, SegmentCompleted
from receivewal.daemon.lifecycle import UploadsChanged
from receivewal.daemon.state import UploadStatus
from receivewal.daemon.uploadpolicy import TIMEOUT_ENV, retry_delay
from receivewal.daemon.worker import Worker
from receivewal.errors import (
    ArchiveError,
    ForeignArchive,
    ObjectConflict,
    ReceivewalError,
    StoreError,
)
from receivewal.wal.names import ENCRYPTED_SUFFIX, parse_history_file_name

if TYPE_CHECKING:
    from receivewal.archive.bucket import Bucket

PAUSE_ENV = "RECEIVEWAL_TEST_UPLOAD_PAUSE"
RECHECK_ENV = "RECEIVEWAL_TEST_IDENTITY_RECHECK"
CLAIM_WAIT = 5.0  # seconds start-up waits for the claim of the prefix before streaming anyway
IDENTITY_RECHECK = 60.0  # seconds between two claims of the prefix while uploading


def confirmable_flush(flush: int, uploaded_end: int | None, floor: int) -> int:
    """What --confirm-after upload reports: never past the end of the last segment uploaded;
    and nothing (0: the server keeps the slot where it is) while that end lies before
    ``floor``, where this session's stream started. A physical slot takes any position it is
    told, backwards too: a backlog left by a run without --confirm-after upload must not move
    the slot back to WAL the server may have removed meanwhile."""
    if uploaded_end is None or uploaded_end < floor:
        return 0
    return min(flush, uploaded_end)


class Uploader(Worker):
    """Follows the archive's completed files and uploads each, in order, on one thread.

    ``events`` is the daemon's event stream: the uploads' status goes there from the start,
    and the files completed come from there once :meth:`begin` has taken the backlog."""

    def __init__(self, archive: Archive, bucket: Bucket, log: FilteringBoundLogger,
                 retry: RetryPolicy, events: EventStream, *, environ: Mapping[str, str],
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__("uploader", events, clock=clock)
        self.archive = archive
        self.bucket = bucket
        self.log = log
        self.retry = retry
        self.segment_size = 0  # known once the server is identified (begin)
        self._identity: ArchiveIdentity | None = None
        self._starting = True  # begin() waits for the first claim's answer
        self._refusal: ForeignArchive | None = None  # another cluster's prefix, for begin()
        self._claimed_at: float | None = None  # monotonic: the last claim that succeeded
        self._claim_wait = float(environ.get(TIMEOUT_ENV, CLAIM_WAIT))
        self._recheck = float(environ.get(RECHECK_ENV, IDENTITY_RECHECK))
        self._record = UploadRecord(str(bucket.url))
        self._pending: deque[PendingFile] = deque()
        self._queued: set[str] = set()
        self._pause = environ.get(PAUSE_ENV)
        self._status = UploadStatus(str(bucket.url))
        events.post(UploadsChanged(self._status))
        self._floor = 0  # where the current session streams from
        # the timeline of the last segment uploaded (uploaded_end is on it): after a fork
        # inside the archive the old timeline's uploads say nothing of the new one's
        self._uploaded_timeline: int | None = None

    # -- the session's side ------------------------------------------------------------------
    def begin(self, identity: ArchiveIdentity, listing: Listing | None = None,
              stopping: Callable[[], bool] = lambda: False) -> None:
        """Once per daemon, when the server is identified and before anything is streamed:
        take the backlog from the archive (``listing``, when the start-up took one), start the
        thread, which claims the prefix first, and wait a few seconds for that claim (less
        when ``stopping`` says a stop signal came). Another cluster's prefix raises
        ForeignArchive (nothing is written); anything else, or no answer in time, leaves the
        claim to the thread, and streaming goes on. Then follow the files completed."""
        if self._thread is not None:
            return
        self._identity, self.segment_size = identity, identity.segment_size
        self._record = read_upload_record(self.archive, str(self.bucket.url))
        end = None if self._record.segment is None else \
            segment_end(self._record.segment, self.segment_size)
        with self._wake:
            self._uploaded_timeline = None if self._record.segment is None else \
                upload_order(self._record.segment, self.segment_size)[0]
            self._recount(uploaded_end=end)
        for pending in pending_files(self.archive, self._record, self.segment_size,
                                     listing):
            self._enqueue(pending)
        self.start_thread()
        self._await_claim(stopping)
        self.follow_events()
        self.log.info("uploads_started", destination=str(self.bucket.url),
                      backlog=len(self._pending), last_uploaded=self._record.segment)

    def _await_claim(self, stopping: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self._claim_wait
        with self._wake:  # a reentrant lock: _failed takes it too
            while self._starting and not stopping() \
                    and (left := deadline - time.monotonic()) > 0:
                self._wake.wait(min(left, 0.1))
            if self._starting:  # said before the thread can record a late success
                self._starting = False
                self._failed(StoreError(
                    f"{self.bucket.url} at {self.bucket.endpoint}: no answer to the claim of "
                    f"the prefix within {self._claim_wait:g} s; streaming goes on, the "
                    "uploads wait for the claim"), "upload_claim_deferred")
            refusal = self._refusal
        if refusal is not None:
            self._stop.set()  # the thread has ended already
            raise refusal

    def follow(self, event: Event) -> None:
        """Of the daemon's events, those of a file complete and durable in the archive: queue
        it (never blocks on the network)."""
        if isinstance(event, SegmentCompleted):
            name = event.segment
        elif isinstance(event, HistoryFileWritten):
            name = event.file
        else:
            return
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

    def confirmable(self, flush: int, timeline: int) -> int:
        """The flush position on ``timeline`` to report with --confirm-after upload (see
        :func:`confirmable_flush`): nothing while the last segment uploaded is of an older
        timeline (after a fork inside the archive its end lies on another branch, past WAL
        of ``timeline`` that is not uploaded)."""
        with self._wake:
            end = self._status.uploaded_end if self._uploaded_timeline == timeline else None
        return confirmable_flush(flush, end, self._floor)

    def status(self) -> UploadStatus:
        """A consistent snapshot (any thread)."""
        with self._wake:
            return self._status

    def waiting(self) -> list[str]:
        """The files queued and not uploaded yet, oldest first (any thread)."""
        with self._wake:
            return [item.name for item in self._pending]

    @property
    def started(self) -> bool:
        """Whether begin() started the uploads (it did not when it refused the prefix)."""
        return self._thread is not None and self._refusal is None

    def close(self) -> None:
        """Stop the thread: an upload in flight gets a few seconds, the rest waits on disk for
        the next run."""
        super().close()
        self.events.post(UploadsChanged(self.status()))

    # -- the thread --------------------------------------------------------------------------
    def run(self) -> None:
        try:
            if not self._first_claim():
                return
            while (item := self._next()) is not None:
                if self._claimed_at is None \
                        or time.monotonic() - self._claimed_at >= self._recheck:
                    self._until_done(self._claim, IDENTITY_FILE)
                self._until_done(partial(self._upload, item), item.name)
        except BaseException as exc:
            self._failed(ReceivewalError(f"the uploader stopped: {type(exc).__name__}: {exc}"),
                         "uploader_stopped")
            raise

    def _first_claim(self) -> bool:
        """One try at the claim while begin() waits for it: another cluster's prefix goes back
        to begin(), which refuses to stream (False: the thread ends). Any other failure, or an
        answer after begin() stopped waiting, is handled as later failures are: the claim is
        tried again and the uploads wait for it."""
        try:
            self._claim()
        except ReceivewalError as exc:
            with self._wake:
                waited, self._starting = self._starting, False  # begin() still waiting
                if waited and isinstance(exc, ForeignArchive):
                    self._refusal = exc
                self._wake.notify_all()
            if self._refusal is not None:
                return False
            self._report(exc, IDENTITY_FILE,
                         "upload_claim_deferred" if waited and exc.retryable else None)
            self.pause(retry_delay(self.retry, exc, 0))
            self._until_done(self._claim, IDENTITY_FILE, attempt=1)
            return True
        with self._wake:
            self._starting = False
            self._wake.notify_all()
        self._succeeded()
        return True

    def _claim(self) -> None:
        """Claim the prefix (again): write the identity object when it is missing, refuse one
        that names another cluster or cannot be read."""
        assert self._identity is not None
        written = claim_identity(self.bucket, self._identity)
        key = self.bucket.key(IDENTITY_FILE)
        if written and self._claimed_at is not None:
            self.log.warning("identity_object_restored", key=key,
                             reason="it was missing (deleted by hand or by an expiry rule): "
                             "written again, so that no other cluster takes the prefix")
        elif written:
            self.log.info("prefix_claimed", key=key)
        self._claimed_at = time.monotonic()

    def _next(self) -> PendingFile | None:
        """The oldest file queued, once there is one (None: stopped)."""
        while self.await_due(ready=lambda: bool(self._pending)):
            with self._wake:
                if self._pending:
                    return self._pending[0]
        return None

    def _until_done(self, action: Callable[[], None], name: str, attempt: int = 0) -> None:
        """Try ``action`` (about the object of the file ``name``) until it succeeds or the
        daemon stops; never skip it."""
        while not self.stopping:
            try:
                action()
            except ReceivewalError as exc:
                self._report(exc, name)
                self.pause(retry_delay(self.retry, exc, attempt))
                attempt += 1
            else:
                self._succeeded()
                return

    def _report(self, exc: ReceivewalError, name: str, event: str | None = None) -> None:
        """A failed try about the object of ``name``: logged, and in the status; an error that
        waiting does not cure stops the uploads at that object until it goes up."""
        event = event or ("upload_conflict" if isinstance(exc, ObjectConflict) else
                          "upload_failed" if exc.retryable else "upload_refused")
        self._failed(exc, event)
        if not exc.retryable:
            with self._wake:
                self._recount(stopped=self._status.last_error,
                              stopped_object=self.bucket.url.url(name))
                self._wake.notify_all()

    def _succeeded(self) -> None:
        if self._status.failing_since is not None:
            self.log.info("uploads_recovered", destination=str(self.bucket.url))
        self._update(failing_since=None, stopped=None, stopped_object=None)

    def _upload(self, item: PendingFile) -> None:
        """Upload one completed file; a segment only once its bytes have passed the check
        every file leaving the archive passes (a damaged one stops the uploads there, and
        with --confirm-after upload the slot keeps the server's good copy)."""
        path = self.archive.directory / item.name
        body: Path | bytes = path
        if item.name.endswith(ENCRYPTED_SUFFIX):  # its WAL was checked before it was sealed
            body = self._sealed_body(path)
        elif parse_history_file_name(item.name) is None:
            assert self._identity is not None
            try:
                body = checked_file(path, self._identity)
            except OSError as exc:
                raise os_error(exc, f'cannot read "{path}" to upload it') from exc
        self.bucket.put_new(item.name, body)
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
            end = status.uploaded_end
            if not history and record.segment == item.name:  # the newest in upload order:
                # its end, even behind the last one's (a fork inside the archive)
                end = segment_end(item.name, self.segment_size)
                self._uploaded_timeline = upload_order(item.name, self.segment_size)[0]
            self._recount(uploaded_files=status.uploaded_files + 1,
                          uploaded_bytes=status.uploaded_bytes + item.size,
                          last_uploaded=item.name, uploaded_end=end)
            self._wake.notify_all()
        self.log.info("file_uploaded", file=item.name, key=self.bucket.key(item.name),
                      bytes=item.size, backlog=len(self._pending))

    def _sealed_body(self, path: Path) -> bytes:
        """The bytes of the sealed file at ``path``, once its header and recipient set pass
        the check without a key. A file named for its set is one object (the identity
        object lists the sets); in the older form its recipients file is uploaded first
        (create-only: both are what the file says it is, so that a reader of the bucket can
        tell who may read it)."""
        problem = sealed_problem(str(path))
        if problem is not None:
            raise ArchiveError(f'"{path}" {problem}: not uploaded')
        recipients = Path(recipients_path(path))
        try:
            if not fingerprint_of(path.name):
                self.bucket.put_new(recipients.name, recipients.read_bytes())
            return path.read_bytes()
        except OSError as exc:
            raise os_error(exc, f'cannot read "{path}" to upload it') from exc

    # -- bookkeeping -------------------------------------------------------------------------
    def _enqueue(self, item: PendingFile) -> None:
        with self._wake:
            if item.name in self._queued:
                return
            self._queued.add(item.name)
            self._pending.append(item)
            self._recount()
            self._wake.notify_all()

    def _recount(self, **changes: Any) -> None:
        """Change the status, with the backlog recounted, and state it (the lock is held)."""
        oldest = self._pending[0].completed_at if self._pending else None
        self._status = replace(self._status, **changes, pending_files=len(self._pending),
                               pending_bytes=sum(p.size for p in self._pending),
                               oldest_pending=oldest)
        self.events.post(UploadsChanged(self._status))

    def _update(self, **changes: Any) -> None:
        with self._wake:
            self._recount(**changes)

    def _failed(self, exc: ReceivewalError, event: str) -> None:
        error = self.failure(exc)
        since = self._status.failing_since or error.at
        self._update(last_error=error, failing_since=since)
        if exc.retryable:
            self.log.warning(event, error=str(exc), kind=error.kind)
        else:
            self.log.error(event, error=str(exc), kind=error.kind)
