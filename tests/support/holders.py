"""Which processes hold a file open (read from /proc): the prefetch filler holds its spool's
lock for as long as it lives."""

from __future__ import annotations

import os
from pathlib import Path


def holders_of(path: Path) -> list[int]:
    """The processes that have ``path`` open."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) == str(path) for fd in (proc / "fd").iterdir()):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids
