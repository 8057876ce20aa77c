"""Durability in the background: a completed segment is fsynced while the next one arrives.

:class:`SegmentSyncer` owns one worker thread and an ordered queue of jobs that the segment
writer hands over: fsync a new ``.partial`` and its directory (after preallocation), and
complete a segment (fsync, close, rename to its final name, fsync the directory). Jobs run in
the order they were submitted, so a segment is renamed only after everything before it is
durable. The worker only records what it finished: the LSN up to which every submitted job
has finished, and the segments it completed; the writer takes that record on its own thread
(:meth:`SegmentSyncer.finished`) and moves its flushed position there, never beyond (fsync and
rename release the GIL, so the main thread keeps receiving meanwhile).

A job that fails stops the worker; the error is raised in the main thread at its next call
(:meth:`check`, :meth:`drain`). A crash while a completion is queued leaves two consecutive
``.partial`` files of one timeline; :func:`restart_point` makes the next run restream from the
older one, which it can then complete.

A disk that does not finish an fsync must not hold a stop signal beyond the service's stop
timeout: once ``stopping`` says a stop signal came, every wait for the worker ends at most
:data:`STOP_SYNC_SECONDS` after it was first noticed. The jobs left are then abandoned with the
process (what they would have made durable was never reported as flushed; the next start
removes the temporary files and restreams from what is durable).

For the crash tests only: when ``RECEIVEWAL_TEST_SYNCER_PAUSE`` names a file, the worker writes
the name of the segment it is about to complete into that file and then waits forever before
its fsync, so a test can SIGKILL the daemon exactly there. For the tests only too: while the
file ``RECEIVEWAL_TEST_SYNCER_HOLD`` names exists, the worker holds every job that makes a file
durable under its name (a new ``.partial``, a completion) before it starts, so a test sees the
archive while its newest WAL is still under a temporary name (a slow fsync, held at will);
``RECEIVEWAL_TEST_STOP_SYNC`` sets :data:`STOP_SYNC_SECONDS`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

from receivewal.errors import ArchiveError, ReceivewalError
from receivewal.wal.names import SegmentFile

PAUSE_ENV = "RECEIVEWAL_TEST_SYNCER_PAUSE"
HOLD_ENV = "RECEIVEWAL_TEST_SYNCER_HOLD"
STOP_SYNC_ENV = "RECEIVEWAL_TEST_STOP_SYNC"
#: After a stop signal, how long waiting for the disk may last (the unit's TimeoutStopSec is 60;
#: the rest of the stop needs up to 10 s for the server and 10 s for an upload in flight).
STOP_SYNC_SECONDS = 20.0
_WATCH_SECONDS = 0.25  # how often a wait for the worker looks at the stop signal
WRITE_BEHIND_BYTES = 4 << 20  # start writeback of a segment every this many bytes
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>

Job = Callable[[], None]


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's sync_file_range(2) (Linux only), or None."""
    if not hasattr(os, "posix_fadvise"):  # not Linux-like: no sync_file_range either
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        func = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    func.restype = ctypes.c_int
    return func


_sync_file_range = _load_sync_file_range()


class SegmentSyncer:
    """Runs the writer's fsync/rename jobs in order on one worker thread."""

    def __init__(self, stopping: Callable[[], bool] | None = None) -> None:
        self._stopping = stopping  # whether a stop signal came (None: waits are unbounded)
        self._stop_sync = float(os.environ.get(STOP_SYNC_ENV, STOP_SYNC_SECONDS))
        self._give_up_at: float | None = None  # monotonic: set when a stop is first noticed
        self._jobs: queue.SimpleQueue[tuple[int, str, Job] | None] = queue.SimpleQueue()
        self._idle = threading.Condition()
        self._pending = 0
        self._completions = 0
        # what the worker finished (under _idle): every job up to this LSN, and the segments
        # completed since the writer last took them, with the LSN each ends at
        self._through = 0
        self._completed: list[tuple[str, int]] = []
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._pause = os.environ.get(PAUSE_ENV)
        self._hold = os.environ.get(HOLD_ENV)

    @property
    def completing(self) -> bool:
        """True while a completed segment waits for its fsync and rename (the other jobs are
        short: waiting for them costs little)."""
        return self._completions > 0

    def submit(self, lsn: int, job: Job, *, segment: str = "") -> None:
        """Queue ``job``; once it (and everything before it) is done, :meth:`finished` says
        ``lsn``. ``segment`` names the segment a completion job completes (ending at ``lsn``)."""
        if self._hold:
            job = _held(job, Path(self._hold))
        self._enqueue(lsn, job, segment)

    def _enqueue(self, lsn: int, job: Job, segment: str = "") -> None:
        self.check()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="segment-syncer",
                                            daemon=True)
            self._thread.start()
        with self._idle:
            self._pending += 1
            self._completions += bool(segment)
        if segment and self._pause:
            job = self._paused(job, segment)
        self._jobs.put((lsn, segment, job))

    def write_behind(self, fd: int, offset: int, length: int) -> None:
        """Have the worker start writeback of a written range (sync_file_range(2), which does
        not wait for it), so that the completing fsync has little left to do. Nothing where
        sync_file_range does not exist. ``fd`` stays open until a later job closes it."""
        if _sync_file_range is not None:
            self._enqueue(0, lambda: _start_writeback(fd, offset, length))

    def finished(self) -> tuple[int, list[tuple[str, int]]]:
        """What the worker finished: the LSN up to which every job submitted has finished, and
        the segments completed (fsynced and renamed) since the last call, each with the LSN
        it ends at, in order."""
        with self._idle:
            completed, self._completed = self._completed, []
            return self._through, completed

    def check(self) -> None:
        """Raise the error of a failed job, if any."""
        if self._error is not None:
            raise self._error

    @property
    def stop_bound(self) -> float:
        """Seconds a wait for the worker may last after a stop signal."""
        return self._stop_sync

    @property
    def busy(self) -> bool:
        """True while a submitted job has not finished."""
        return self._pending > 0

    def drain(self) -> bool:
        """Wait until every submitted job has finished; True once they have. After a stop
        signal, wait at most STOP_SYNC_SECONDS from when it was first noticed, then False."""
        with self._idle:
            while self._pending and self._error is None:
                if self._stopping is None:
                    self._idle.wait()
                    continue
                if self._stopping() and self._give_up_at is None:
                    self._give_up_at = time.monotonic() + self._stop_sync
                left = _WATCH_SECONDS if self._give_up_at is None \
                    else min(_WATCH_SECONDS, self._give_up_at - time.monotonic())
                if left <= 0:
                    break
                self._idle.wait(left)
            done = not self._pending
        self.check()
        return done

    def close(self) -> None:
        """Finish the queued jobs and stop the worker (idempotent); after a stop signal that
        the disk outlasted (see :meth:`drain`), the worker is left to end with the process."""
        done = False
        try:
            done = self.drain()
        finally:
            if self._thread is not None:
                self._jobs.put(None)
                if done or self._error is not None:
                    self._thread.join()
                self._thread = None

    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            lsn, segment, job = item
            try:
                job()
            except (ReceivewalError, OSError) as exc:  # raised in the main thread by check()
                self._fail(exc)
                return
            except BaseException:
                self._fail(ArchiveError("the segment syncer thread stopped unexpectedly"))
                raise
            with self._idle:
                self._pending -= 1
                if segment:
                    self._completions -= 1
                    self._completed.append((segment, lsn))
                self._through = max(self._through, lsn)
                self._idle.notify_all()

    def _fail(self, exc: BaseException) -> None:
        with self._idle:
            self._error = exc
            self._idle.notify_all()

    def _paused(self, job: Job, segment: str) -> Job:
        assert self._pause is not None
        marker = Path(self._pause)

        def wait_then_run() -> None:
            marker.write_text(segment)
            threading.Event().wait()  # forever: the test SIGKILLs us here
            job()

        return wait_then_run


def _held(job: Job, marker: Path) -> Job:
    """``job``, run once ``marker`` is gone (the tests' hold, :data:`HOLD_ENV`)."""

    def wait_then_run() -> None:
        while marker.exists():
            time.sleep(0.01)
        job()

    return wait_then_run


def _start_writeback(fd: int, offset: int, length: int) -> None:
    assert _sync_file_range is not None
    if _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE) != 0:
        err = ctypes.get_errno()
        raise ArchiveError(f"sync_file_range failed on descriptor {fd}: {os.strerror(err)}")


def restart_point(newest: SegmentFile | None, files: list[SegmentFile]) -> SegmentFile | None:
    """Where to restream from, given the newest resumable segment file and all of them.

    A crash while a completed segment waited for its fsync leaves it as a full ``.partial``
    right before the newest ``.partial`` of the same timeline. Restream from the oldest of such
    a run of consecutive ``.partial`` files, so that each gets completed and none is left behind.
    """
    if newest is None or not newest.partial:
        return newest
    complete = {(f.timeline, f.segno) for f in files if not f.partial}
    partials = {(f.timeline, f.segno): f for f in files
                if f.partial and (f.timeline, f.segno) not in complete}
    point = newest
    while (older := partials.get((point.timeline, point.segno - 1))) is not None:
        point = older
    return point
