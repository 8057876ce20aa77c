"""A receiver's work beside the receive loop, on a thread of its own: the WAL archive's uploads,
its local copy's rule and its meter (:mod:`receivewal.walreceiver.uploader`,
:mod:`receivewal.walreceiver.localcopy`, :mod:`receivewal.walreceiver.archivemeter`), the
change log's uploads and rule (:mod:`receivewal.logicalreceiver.changeuploads`). Each is a
:class:`Worker`.

A worker follows the daemon's event stream (:meth:`Worker.follow`, called where the stream
hands its events out: it never blocks, it marks a pass due); its thread waits until a pass is
due, its timer runs out or the daemon stops (:meth:`Worker.await_due`), does the pass, and
states what it did as events posted from its thread. After a failed try it waits as its retry
policy says, or until the stop (:meth:`Worker.pause`). Stopping (:meth:`Worker.close`) gives
the pass in flight a few seconds; what is left waits on disk for the next run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from receivewal.daemon.events import Event, EventStream
from receivewal.daemon.state import LastError

CLOSE_SECONDS = 10.0  # how long stopping waits for a pass in flight


def _never() -> bool:
    return False


class Worker:
    """One thread named ``name`` that does passes, following ``events``. A subclass gives
    :meth:`run` (the thread's body) and :meth:`follow` (which events make a pass due);
    ``_wake`` is a reentrant condition, the lock of the subclass's own state too."""

    close_seconds = CLOSE_SECONDS

    def __init__(self, name: str, events: EventStream, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.name = name
        self.events = events
        self.clock = clock
        self._wake = threading.Condition()
        self._due = True  # the first pass comes at once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unsubscribe: Callable[[], None] = lambda: None

    # -- the receiver's side -----------------------------------------------------------------
    def follow_events(self) -> None:
        """From now on, hand the daemon's events to :meth:`follow`."""
        self._unsubscribe = self.events.subscribe(self.follow)

    def start_thread(self) -> None:
        """Start the thread (:meth:`run`)."""
        self._thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether the thread runs (started, and neither stopped nor ended)."""
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        """Stop following the events and stop the thread (a pass in flight gets
        :attr:`close_seconds`)."""
        self._unsubscribe()
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(self.close_seconds)

    # -- what a subclass gives -----------------------------------------------------------------
    def follow(self, event: Event) -> None:
        """One of the daemon's events: call :meth:`due` when it makes a pass due (never
        block). None does, unless a subclass says so."""

    def run(self) -> None:
        """The thread's body."""
        raise NotImplementedError

    # -- the thread's side -------------------------------------------------------------------
    def due(self) -> None:
        """A pass is due: the thread does it at once, or after the one in flight (any
        thread)."""
        with self._wake:
            self._due = True
            self._wake.notify_all()

    @property
    def stopping(self) -> bool:
        """Whether the daemon asked the worker to stop."""
        return self._stop.is_set()

    def await_due(self, timeout: float | None = None, ready: Callable[[], bool] = _never,
                  ) -> bool:
        """Wait until a pass is due (:meth:`due`, or ``ready`` says there is work, asked
        under the lock), ``timeout`` seconds have passed (None: no timer) or the worker is
        stopped; False when it is."""
        with self._wake:
            while not self._due and not self._stop.is_set() and not ready():
                if not self._wake.wait(timeout):
                    break
            self._due = False
            return not self._stop.is_set()

    def pause(self, seconds: float) -> None:
        """Wait ``seconds`` before the next try, or until the worker is stopped."""
        self._stop.wait(seconds)

    def failure(self, exc: Exception) -> LastError:
        """``exc`` as the status shows a failure, now."""
        return LastError(type(exc).__name__, str(exc), self.clock())
