"""A stop flag for driving the replication connection and session by hand in tests."""

from __future__ import annotations

import socket


class Stop:
    """A stop flag whose descriptor the test makes readable (``stop.w.send(b"x")``), as a
    signal would; ``drained`` counts how often the waiting code emptied it."""

    requested = False

    def __init__(self) -> None:
        self.r, self.w = socket.socketpair()
        self.drained = 0

    def fileno(self) -> int:
        return self.r.fileno()

    def drain(self) -> None:
        self.r.recv(4096)
        self.drained += 1
