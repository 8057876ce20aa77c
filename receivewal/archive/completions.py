"""The files the archive completes, as typed events to its subscribers.

Each segment or history file, once durable under its final name, is announced as a
:class:`FileCompleted` to whoever subscribed (the uploader follows them; the receive loop does
not know who listens). A subscriber is called on the thread that made the file durable (the
segment syncer's worker for a completed segment), so it must not block: it queues.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass


class FileKind(enum.Enum):
    """What a completed file is."""

    SEGMENT = "segment"  # a complete WAL segment, in its at-rest format
    HISTORY = "history"  # a timeline history file


@dataclass(frozen=True)
class FileCompleted:
    """``name`` is complete and durable under its final name in the archive directory."""

    name: str
    kind: FileKind


Subscriber = Callable[[FileCompleted], None]


class Completions:
    """The subscribers to one archive's completed files."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: tuple[Subscriber, ...] = ()

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Tell ``subscriber`` of every file completed from now on; returns the call that
        unsubscribes it."""
        with self._lock:
            self._subscribers = (*self._subscribers, subscriber)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not subscriber)

        return unsubscribe

    def publish(self, event: FileCompleted) -> None:
        """Deliver ``event`` to every subscriber, in the order they subscribed."""
        for subscriber in self._subscribers:
            subscriber(event)
