"""Waiting on a socket and the stop signal together: the one place receivewal blocks on a server.

The model is psycopg's ``generators.py`` / ``waiting.py`` split: the libpq dialogue
(:mod:`receivewal.replication.connection`) is written as generators that never block; each
yields ``(fileno, events)`` when libpq needs the socket readable or writable, and gets back
the events that became ready. :func:`drive` runs such a generator to its end and
:func:`drive_within` for a bounded time (the COPY stream's reads); both wait in
:func:`wait_for`, with a selector on the socket and on the stop signal's descriptor, so
neither a stop signal nor ``--receive-timeout`` ever waits behind libpq. :func:`pause` is the
supervisor's sleep between reconnects, on the stop signal alone.
"""

from __future__ import annotations

import selectors
import time
from collections.abc import Generator
from typing import Protocol, TypeVar

from receivewal.errors import ConnectionLost, StopRequested

# poll(2), not epoll: waiting never needs a file descriptor of its own, so it still works when
# the process has run out of them (the error is then reported and retried, not a traceback).
Selector = getattr(selectors, "PollSelector", selectors.SelectSelector)
READ = selectors.EVENT_READ
WRITE = selectors.EVENT_WRITE
BOTH = READ | WRITE

T = TypeVar("T")

#: A libpq dialogue: yields (socket, events to wait for), is sent the ready events.
Steps = Generator[tuple[int, int], int, T]


class StopFlag(Protocol):
    """What waiting needs of the supervisor's stop signal."""

    @property
    def requested(self) -> bool: ...

    def fileno(self) -> int: ...

    def drain(self) -> None: ...


def drive(steps: Steps[T], what: str, stop: StopFlag | None, timeout: float) -> T:
    """Run ``steps`` to its end; ``timeout`` (0: none) bounds each wait for the server.

    Raises StopRequested when a stop signal arrives during a wait, and ConnectionLost naming
    ``what`` when the server stays silent for ``timeout`` seconds.
    """
    try:
        fileno, events = next(steps)
        while True:
            ready = wait_for(fileno, events, stop, timeout, what)
            if ready == 0:
                raise ConnectionLost(f"{what}: no answer from the server for {timeout:g} "
                                     f"seconds (receive timeout {timeout:g}s)")
            fileno, events = steps.send(ready)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def drive_within(steps: Steps[T], stop: StopFlag | None, timeout: float) -> T | None:
    """Run ``steps``, waiting ``timeout`` seconds at most in all (0: not at all): their result,
    or None when the time is up first or a stop signal arrives (the caller looks at its flag).
    """
    deadline = time.monotonic() + timeout
    try:
        fileno, events = next(steps)
        while (left := deadline - time.monotonic()) > 0:
            ready = wait_for(fileno, events, stop, left)
            if ready == 0:
                return None
            fileno, events = steps.send(ready)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except StopRequested:
        return None
    return None


def pause(stop: StopFlag, seconds: float) -> None:
    """Wait ``seconds`` (more than 0), or less when a stop signal arrives (its flag says so)."""
    if wait_for(stop.fileno(), READ, None, seconds):
        stop.drain()


def wait_for(fileno: int, events: int, stop: StopFlag | None, timeout: float,
             what: str = "waiting for the server") -> int:
    """Wait until ``fileno`` is ready for ``events``; return the ready events, or 0 once
    ``timeout`` (0: none) passed. A stop signal arriving meanwhile raises StopRequested."""
    deadline = time.monotonic() + timeout if timeout > 0 else None
    with Selector() as selector:
        selector.register(fileno, events)
        if stop is not None:
            selector.register(stop.fileno(), READ)
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return 0
            ready = 0
            for key, mask in selector.select(left):
                if key.fd == fileno:
                    ready |= mask
                elif stop is not None:
                    stop.drain()
                    raise StopRequested(f"{what}: interrupted by a stop signal")
            if ready:
                return ready
