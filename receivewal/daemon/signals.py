"""The stop signal: SIGINT and SIGTERM as a flag, and a descriptor that wakes every wait.

The supervisor installs it for the daemon's life; every wait for the server and every sleep
of the daemon (between reconnects, for the uploads before an exit) ends when it comes.
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from receivewal.daemon.events import TICK_SECONDS
from receivewal.replication.waiting import pause


class StopSignal:
    """SIGINT/SIGTERM set a flag and wake any selector waiting on :meth:`fileno`."""

    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """True once a stop signal arrived."""
        return self.signal_name is not None

    def install(self) -> None:
        """Handle SIGINT and SIGTERM from now on."""
        signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        """Restore the previous handlers."""
        signal.set_wakeup_fd(-1)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._reader.close()
        self._writer.close()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signal_name = signal.Signals(signum).name

    def fileno(self) -> int:
        """A descriptor that becomes readable when a signal arrives."""
        return self._reader.fileno()

    def drain(self) -> None:
        """Empty the wake-up socket."""
        try:
            while self._reader.recv(4096):
                pass
        except BlockingIOError:
            pass

    def sleep(self, seconds: float, on_tick: Callable[[], None] | None = None) -> None:
        """Sleep, waking early when a stop signal arrives; call ``on_tick`` 4 times a second."""
        deadline = time.monotonic() + seconds
        while not self.requested and (left := deadline - time.monotonic()) > 0:
            pause(self, min(left, TICK_SECONDS))
            if on_tick is not None:
                on_tick()
