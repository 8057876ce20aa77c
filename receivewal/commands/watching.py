"""What ``backup`` and ``recover`` show while they move bytes: progress as ``pg_basebackup -P``
does, and a summary at the end.

:func:`progress_text` is pure: ``received 12.3 MB of ~70.1 MB (17%), 5.2 MB/s``. A
:class:`Watch` shows it: on a terminal one line redrawn in place (erased before any other line
is printed); elsewhere (a journal, a pipe) a line every :data:`LOG_INTERVAL` seconds, or with
``json`` the structlog event ``<what>_progress`` carrying the numbers.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

from receivewal.check.sizes import human_bytes
from receivewal.daemon.progress import ERASE

WINDOW = 5.0  # seconds over which the rate is measured
DRAW_INTERVAL = 0.5  # seconds between redraws of the terminal line
LOG_INTERVAL = 10.0  # seconds between progress lines (or events) off a terminal


def progress_text(verb: str, done: int, total: int | None, rate: float | None) -> str:
    """``<verb> DONE of ~TOTAL (P%), RATE/s``; the total and the percentage only when known
    (a server's estimate: the count may pass it, the percentage stops at 100)."""
    text = f"{verb} {human_bytes(done)}"
    if total:
        text += f" of ~{human_bytes(total)} ({min(100, done * 100 // total)}%)"
    if rate is not None:
        text += f", {human_bytes(rate)}/s"
    return text


def summary_text(done: int, seconds: float) -> str:
    """``70.1 MB in 6.2 s (11.3 MB/s)``."""
    rate = f" ({human_bytes(done / seconds)}/s)" if seconds > 0 else ""
    return f"{human_bytes(done)} in {seconds:.1f} s{rate}"


class Watch:
    """One transfer's progress shown to the operator (see the module's docstring)."""

    def __init__(self, what: str, verb: str, *, stream: TextIO | None = None,
                 terminal: bool | None = None, log: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.verb = what, verb
        self.stream = stream or sys.stderr
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self.log = log  # a structlog logger: events instead of lines
        self.clock = clock
        self.total: int | None = None
        self.done = 0
        self.started = clock()
        self._samples: deque[tuple[float, int]] = deque()
        self._shown_at: float | None = None
        self._line_shown = False

    def estimate(self, total: int | None) -> None:
        """The size expected (None: unknown)."""
        self.total = total

    def update(self, done: int) -> None:
        """``done`` bytes so far; shown when it is time."""
        now = self.clock()
        self.done = done
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[0][0] > WINDOW:
            self._samples.popleft()
        interval = DRAW_INTERVAL if self.terminal and self.log is None else LOG_INTERVAL
        if self._shown_at is None or now - self._shown_at >= interval:
            self._show(now)

    def rate(self) -> float | None:
        """Bytes per second over the last few seconds (None: not yet measured)."""
        if len(self._samples) < 2:
            return None
        (first, before), (last, after) = self._samples[0], self._samples[-1]
        return (after - before) / (last - first) if last > first else None

    def say(self, line: str) -> None:
        """A line of its own, below (not through) the progress line."""
        self.clear()
        self.stream.write(line + "\n")
        self.stream.flush()

    def clear(self) -> None:
        """Erase the terminal line, if shown."""
        if self._line_shown:
            self.stream.write(ERASE)
            self._line_shown = False

    def finish(self) -> str:
        """Erase the line; the summary of what was moved."""
        self.clear()
        self.stream.flush()
        return summary_text(self.done, self.clock() - self.started)

    def _show(self, now: float) -> None:
        self._shown_at = now
        rate = self.rate()
        if self.log is not None:
            self.log.info(f"{self.what}_progress", done_bytes=self.done,
                          estimated_bytes=self.total,
                          bytes_per_second=None if rate is None else round(rate))
            return
        text = progress_text(self.verb, self.done, self.total, rate)
        if self.terminal:
            self.stream.write(ERASE + text)
            self._line_shown = True
        else:
            self.stream.write(f"receivewal: {text}\n")
        self.stream.flush()
