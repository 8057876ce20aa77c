"""The progress line: one line on a terminal that says where streaming stands, kept up to date.

``receivewal stream --progress`` (or ``-v``) with stderr on a terminal and console logs shows::

    received 0/9EB5790  server 0/A000000  wire 12.3 MB/s  WAL 45.6 MB/s  ratio 3.71x
    behind 98.2 MB  ETA 0:00:03

(on one line): the end of the WAL received, the server's WAL end, what arrives per second on
the wire and as WAL (over the last :data:`WINDOW_SECONDS`), WAL bytes per wire byte since start
(``receivewal logical``: ``plain`` in place of ``WAL``, its messages as sent uncompressed),
how far behind the server we are and when we catch up at the current pace (``caught up``
once received reaches the server's end; ``ETA -`` while the gap is not closing).

:func:`format_progress` is pure. :class:`ProgressLine` owns the terminal: it redraws the line in
place (carriage return, erase to end of line) and puts a :class:`ClearingStream` in front of
``sys.stderr``, which erases the line before anything else is written there, so a log line
never lands in the middle of it; the next update draws it again below the log line.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from dataclasses import dataclass
from typing import TextIO, cast

from receivewal.wal.lsn import format_lsn

WINDOW_SECONDS = 5.0  # rates are measured over the samples of the last few seconds
DRAW_INTERVAL = 0.5  # seconds between redraws of an unchanged-looking line
ERASE = "\r\x1b[K"  # back to column 0, erase to the end of the line


@dataclass(frozen=True)
class Sample:
    """Where streaming stood at ``at`` (seconds); byte counts are totals since start."""

    at: float
    received: int | None
    server_wal_end: int | None
    wire_bytes: int
    wal_bytes: int


def _size(count: float) -> str:
    value = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"


def _duration(seconds: float) -> str:
    whole = int(seconds + 0.5)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def _behind(last: Sample) -> int | None:
    if last.received is None or last.server_wal_end is None:
        return None
    return max(last.server_wal_end - last.received, 0)


def _catch_up(first: Sample, last: Sample, elapsed: float) -> str:
    """``behind N  ETA H:MM:SS`` at the pace the gap closed over the window."""
    behind = _behind(last)
    if behind is None:
        return "behind -  ETA -"
    if behind == 0:
        return "caught up"
    before = _behind(first)
    closing = (before - behind) / elapsed if before is not None and elapsed > 0 else 0.0
    eta = _duration(behind / closing) if closing > 0 else "-"
    return f"behind {_size(behind)}  ETA {eta}"


def format_progress(samples: list[Sample] | deque[Sample], carried: str = "WAL") -> str:
    """The progress line for ``samples`` (oldest first, the last one is now); ``carried``
    names what the stream carries (``plain`` for a logical receiver's messages)."""
    first, last = samples[0], samples[-1]
    elapsed = last.at - first.at

    def rate(field: str) -> str:
        if elapsed <= 0:
            return "-"
        moved = getattr(last, field) - getattr(first, field)
        return f"{_size(max(moved, 0) / elapsed)}/s"

    received = "-" if last.received is None else format_lsn(last.received)
    server = "-" if last.server_wal_end is None else format_lsn(last.server_wal_end)
    ratio = f"{last.wal_bytes / last.wire_bytes:.2f}x" if last.wire_bytes else "-"
    return (f"received {received}  server {server}  wire {rate('wire_bytes')}  "
            f"{carried} {rate('wal_bytes')}  ratio {ratio}  {_catch_up(first, last, elapsed)}")


class ClearingStream:
    """Stands in for ``sys.stderr``: erases the progress line before anything is written."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.line_shown = False

    def write(self, text: str) -> int:
        if self.line_shown and text:
            self.stream.write(ERASE)
            self.line_shown = False
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)


class ProgressLine:
    """The line on the terminal ``stream`` (normally stderr). Use :meth:`for_terminal`."""

    def __init__(self, stream: TextIO, carried: str = "WAL") -> None:
        self.out = ClearingStream(stream)
        self.carried = carried  # what the rate after the wire's is of (format_progress)
        self._samples: deque[Sample] = deque()
        self._last_draw: float | None = None
        self._installed: TextIO | None = None

    @classmethod
    def for_terminal(cls, carried: str = "WAL") -> ProgressLine | None:
        """A line on stderr, in front of it for every writer; None when stderr is no terminal."""
        if not sys.stderr.isatty():
            return None
        line = cls(sys.stderr, carried)
        line._installed = sys.stderr
        # Loggers look sys.stderr up when they log (receivewal.logs): they write through us.
        sys.stderr = cast(TextIO, line.out)
        return line

    def update(self, now: float, sample: Sample) -> None:
        """Record ``sample`` and redraw, at most every :data:`DRAW_INTERVAL` seconds unless a
        write to stderr erased the line since."""
        samples = self._samples
        if samples and now < samples[-1].at:  # the clock went back: start the window again
            samples.clear()
        samples.append(sample)
        while len(samples) > 2 and now - samples[1].at >= WINDOW_SECONDS:
            samples.popleft()
        if (self.out.line_shown and self._last_draw is not None
                and 0 <= now - self._last_draw < DRAW_INTERVAL):
            return
        self._last_draw = now
        self._draw(format_progress(samples, self.carried))

    def clear(self) -> None:
        """Erase the line (not streaming any more: the log says why)."""
        if self.out.line_shown:
            self.out.stream.write(ERASE)
            self.out.stream.flush()
            self.out.line_shown = False

    def close(self) -> None:
        """Erase the line and give stderr back."""
        self.clear()
        if self._installed is not None:
            sys.stderr = self._installed
            self._installed = None

    def _draw(self, text: str) -> None:
        try:
            width = os.get_terminal_size(self.out.fileno()).columns
        except (OSError, ValueError):
            width = 0  # unknown (0 too: a terminal whose size was never set)
        if width > 1:
            text = text[: width - 1]  # a wrapped line could not be redrawn in place
        stream = self.out.stream
        stream.write("\r" + text + "\x1b[K")
        stream.flush()
        self.out.line_shown = True
