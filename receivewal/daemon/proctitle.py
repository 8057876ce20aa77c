"""The process's command line as others see it: passwords scrubbed once the options are parsed.

``ps`` and ``/proc/PID/cmdline`` show every user the bytes of the process's original argument
strings, for its whole life, so a ``-d "... password=..."`` stays visible after it has been
read. :func:`scrub_passwords` rewrites those bytes in place (as setproctitle does): each
argument goes through :func:`~receivewal.secrets.redacted` (``password=****``,
``postgresql://user:****@...``), the rest of the area is zeroed. Where does it live? Linux
gives its bounds in ``/proc/self/stat`` (``arg_start``, ``arg_end``). Elsewhere nothing is
changed: a passfile (PGPASSFILE) is the way to keep a password off the command line entirely.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from receivewal.secrets import redacted

_ARG_START_FIELD = 48  # arg_start, then arg_end: fields 48 and 49 of /proc/PID/stat (proc(5))


def argument_area(stat: str) -> tuple[int, int] | None:
    """``(arg_start, arg_end)`` from the text of /proc/PID/stat; None when not given (0)."""
    fields = stat[stat.rindex(")") + 2:].split()  # from field 3 on: the name may hold spaces
    start, end = int(fields[_ARG_START_FIELD - 3]), int(fields[_ARG_START_FIELD - 2])
    return (start, end) if 0 < start < end else None


def scrubbed_area(area: bytes) -> bytes:
    """The argument area (NUL-terminated strings) with passwords redacted, same length."""
    args = area.rstrip(b"\0").split(b"\0")
    blob = b"\0".join(os.fsencode(redacted(os.fsdecode(arg))) for arg in args) + b"\0"
    if len(blob) > len(area):  # "****" longer than a very short password: cut the end
        blob = blob[: len(area) - 1] + b"\0"
    return blob.ljust(len(area), b"\0")


def scrub_passwords() -> bool:
    """Redact passwords in ``sys.argv`` and in the argument strings other processes see;
    True when the latter were rewritten."""
    sys.argv[:] = [redacted(arg) for arg in sys.argv]
    try:
        bounds = argument_area(Path("/proc/self/stat").read_text())
    except (OSError, ValueError, IndexError):
        return False
    if bounds is None:
        return False
    start, end = bounds
    area = ctypes.string_at(start, end - start)
    clean = scrubbed_area(area)
    if clean == area:
        return False
    ctypes.memmove(start, clean, len(clean))
    return True
