"""The change log's uploads and its local rule (``receivewal logical -D OUTDIR --upload-to
s3://BUCKET/PREFIX [--keep-local AGE|SIZE]``), on a thread of their own (a
:class:`~receivewal.daemon.worker.Worker`).

Each completed change file goes to ``PREFIX/<file name>`` as it sits in OUTDIR (compressed,
sealed: a sealed file after its recipients file), in the order of their names (the commit LSN
of their first run), through the bucket's create-only put (the same bytes there already are
success; other bytes stop the uploads at that file, as the WAL uploader does). Once the store
has confirmed a file, :data:`UPLOADED_FILE` names it, durably: everything up to it is in the
bucket. The files come from OUTDIR at start and from
:class:`~receivewal.daemon.events.ChangeFileCompleted` after that; a failed try is retried
with backoff without end while the change log goes on locally.

With ``--keep-local`` a completed file leaves OUTDIR once it is uploaded (the record covers
it) and applied (the slot is confirmed past its last run: the next file's first commit LSN is
at or before the position the daemon last confirmed, its state file's), and it is outside the
window (:func:`~receivewal.archive.keeplocal.inside_window`); the newest completed file stays.
The uploads' status goes on the event stream as the WAL uploader's does
(:class:`~receivewal.daemon.lifecycle.UploadsChanged`), the rule's as
:class:`~receivewal.daemon.lifecycle.LocalCopyChanged`.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from structlog.typing import FilteringBoundLogger

from receivewal.archive.durable import sync_path, write_file_durably
from receivewal.archive.keeplocal import INTERVAL, INTERVAL_ENV, KeepLocal, inside_window
from receivewal.archive.objectstore import RetryPolicy
from receivewal.archive.reading import read_small_file
from receivewal.archive.sealed import recipients_path
from receivewal.daemon.events import ChangeFileCompleted, Event, EventStream
from receivewal.daemon.lifecycle import LocalCopyChanged, UploadsChanged
from receivewal.daemon.state import LocalCopyStatus, UploadStatus, read_state
from receivewal.daemon.uploadpolicy import retry_delay
from receivewal.daemon.worker import Worker
from receivewal.errors import ArchiveError, ReceivewalError
from receivewal.logical.store import PARTIAL, change_files, is_sealed, parse_file_name

if TYPE_CHECKING:
    from receivewal.archive.bucket import Bucket

UPLOADED_FILE = ".receivewal-changes-uploaded.json"


def completed_files(directory: Path, sealed: bool | None = None) -> list[str]:
    """The completed change files of OUTDIR, in the order of their names (LSNs); with
    ``sealed``, only the sealed ones (True) or only those that are not (False)."""
    return [name for name in change_files(directory) if not name.endswith(PARTIAL)
            and (sealed is None or is_sealed(name) == sealed)]


def read_uploaded(directory: Path, destination: str) -> str | None:
    """The last change file confirmed uploaded to ``destination`` (None: none, or a record
    about another destination: everything goes up again there, create-only)."""
    try:
        raw = json.loads(read_small_file(directory / UPLOADED_FILE))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        raise ArchiveError(f'invalid upload record "{directory / UPLOADED_FILE}": '
                           f"{str(exc)[:200]}") from exc
    if not isinstance(raw, dict) or raw.get("destination") != destination:
        return None
    through = raw.get("through")
    return through if isinstance(through, str) and parse_file_name(through) else None


def _lsn(name: str) -> int:
    parsed = parse_file_name(name)
    assert parsed is not None  # only completed change files get here
    return parsed[0]


class ChangeUploader(Worker):
    """Uploads OUTDIR's completed change files to ``bucket``, in order, and applies
    ``keep`` (None: nothing local is removed). With ``sealed`` (--encrypt-to) only sealed
    files are uploaded or removed: a completed file is plain for a moment before it is sealed,
    and nothing plain leaves the host."""

    def __init__(self, directory: Path, bucket: Bucket, events: EventStream,
                 log: FilteringBoundLogger, retry: RetryPolicy, *, keep: KeepLocal | None,
                 mode: int, sealed: bool = False, sync: bool = True,
                 environ: Mapping[str, str], clock: Callable[[], float] = time.time) -> None:
        super().__init__("change-uploads", events, clock=clock)
        self.directory = directory
        self.sealed = sealed
        self.bucket = bucket
        self.destination = str(bucket.url)
        self.log = log
        self.retry = retry
        self.keep = keep
        self.mode = mode
        self.sync = sync
        self._through: str | None = None
        self._status = UploadStatus(self.destination)
        self._local = None if keep is None else LocalCopyStatus(
            f"change files of the last {keep.text}")
        self._interval = float(environ.get(INTERVAL_ENV, INTERVAL))

    def begin(self) -> None:
        """Read the record, follow the files completed and start the thread (ArchiveError:
        the record or OUTDIR cannot be read)."""
        self._through = read_uploaded(self.directory, self.destination)
        try:
            self._recount()
        except OSError as exc:
            raise ArchiveError(f'cannot list "{self.directory}": {exc.strerror or exc}') from exc
        self.follow_events()
        self.start_thread()
        self.log.info("uploads_started", destination=self.destination,
                      backlog=len(self._pending()), last_uploaded=self._through)

    def pending(self) -> list[str]:
        """The completed files not uploaded yet, oldest first (any thread)."""
        return self._pending()

    def status(self) -> UploadStatus:
        """The uploads' status (any thread)."""
        with self._wake:
            return self._status

    def follow(self, event: Event) -> None:
        """A change file completed: the uploads are due (never blocks)."""
        if isinstance(event, ChangeFileCompleted):
            self.due()

    def _pending(self) -> list[str]:
        through = -1 if self._through is None else _lsn(self._through)
        return [name for name in completed_files(self.directory, self.sealed)
                if _lsn(name) > through]

    def _recount(self, **changes: Any) -> None:
        pending = self._pending()
        sizes = [os.stat(self.directory / name).st_size for name in pending]
        with self._wake:
            self._status = replace(self._status, pending_files=len(pending),
                                   pending_bytes=sum(sizes), **changes)
        self.events.post(UploadsChanged(self._status))

    def run(self) -> None:
        """Upload what is pending and apply the rule; again when a file completes, after the
        interval, or at once after a failed try's wait."""
        attempt = 0
        while self.await_due(self._interval, ready=lambda: bool(self._pending())):
            try:
                pending = self._pending()
                for name in pending:
                    if self.stopping:
                        return
                    self._upload(name)
                    attempt = 0
                self._expire()
            except (ReceivewalError, OSError) as exc:
                if isinstance(exc, OSError):
                    exc = ArchiveError(f"change log upload: {exc.strerror or exc}: "
                                       f"{exc.filename or self.directory}")
                self._failed(exc)
                self.pause(retry_delay(self.retry, exc, attempt))
                attempt += 1
                self.due()

    def _upload(self, name: str) -> None:
        path = self.directory / name
        if is_sealed(name):
            recipients = Path(recipients_path(path))
            self.bucket.put_new(recipients.name, recipients.read_bytes())
        self.bucket.put_new(name, path)
        body = json.dumps({"version": 1, "destination": self.destination,
                           "through": name}).encode() + b"\n"
        try:
            write_file_durably(self.directory, UPLOADED_FILE, body, mode=self.mode)
        except OSError as exc:
            raise ArchiveError(f'cannot write "{self.directory / UPLOADED_FILE}": '
                               f"{exc.strerror or exc}") from exc
        self._through = name
        size = path.stat().st_size
        self._recount(uploaded_files=self._status.uploaded_files + 1,
                      uploaded_bytes=self._status.uploaded_bytes + size, last_uploaded=name,
                      failing_since=None, last_error=None)
        self.log.info("file_uploaded", file=name, key=self.bucket.key(name), bytes=size)

    def _failed(self, exc: ReceivewalError) -> None:
        error = self.failure(exc)
        self._recount(last_error=error, failing_since=self._status.failing_since or error.at)
        self.log.warning("upload_failed" if exc.retryable else "upload_refused",
                         error=str(exc), kind=type(exc).__name__)

    def _expire(self) -> None:
        """--keep-local: remove what is uploaded, applied and outside the window."""
        if self.keep is None or self._local is None or self._through is None:
            return
        state = read_state(self.directory)
        confirmed = None if state is None else state.slot_restart_lsn
        files = completed_files(self.directory, self.sealed)
        stats = {name: os.stat(self.directory / name) for name in files}
        weighed = {_lsn(name): (stats[name].st_size, stats[name].st_mtime) for name in files}
        window = inside_window(self.keep, weighed, self.clock())
        through = _lsn(self._through)
        gone = [name for name, following in itertools.pairwise(files)
                if _lsn(name) <= through and confirmed is not None
                and _lsn(following) <= confirmed and _lsn(name) not in window]
        removed = 0
        for name in gone:
            for path in (self.directory / name, Path(recipients_path(self.directory / name))):
                if path.exists():
                    path.unlink()
            removed += stats[name].st_size
        if gone:
            sync_path(self.directory, sync=self.sync)
            self.log.info("local_files_removed", files=len(gone), first=gone[0], last=gone[-1],
                          bytes=removed, rule=self.keep.text)
            self._local = replace(
                self._local, removed_files=self._local.removed_files + len(gone),
                removed_bytes=self._local.removed_bytes + removed,
                last_removed=f"{gone[0]} .. {gone[-1]} ({len(gone)} files, {removed} bytes)",
                last_removed_at=self.clock())
        kept = [name for name in files if name not in gone]
        self._local = replace(self._local, held_files=len(kept),
                              held_bytes=sum(stats[name].st_size for name in kept))
        self.events.post(LocalCopyChanged(self._local))
