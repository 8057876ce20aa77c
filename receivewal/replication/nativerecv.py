"""Which receive loop runs: the compiled one (``receivewal.replication._recv``) or pure Python.

The C extension is optional, as the scanner's is (:mod:`receivewal.wal.nativescan`, whose
``RECEIVEWAL_PURE_PYTHON=1`` forces the pure-Python path here too). It calls libpq's
PQgetCopyData on the PGconn psycopg made, so it must call the very libpq psycopg loaded
(psycopg's binary build brings its own): the one libpq mapped into this process, found in
``/proc/self/maps`` and resolved there without loading anything. Where that is not one
library (none, or two of them), the pure-Python loop runs. Binding it also has glibc keep freed
buffers (:mod:`receivewal.allocator`): a run holds up to a megabyte of libpq's message
buffers, and freeing them together otherwise trimmed the heap, so that every message
page-faulted fresh memory (190,000 minor faults per 2 GB here instead of 7,900).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from types import ModuleType

from receivewal.allocator import keep_freed_buffers
from receivewal.wal.nativescan import load_native, pure_python_forced

MAPS = Path("/proc/self/maps")


def loaded_libpq(maps: str) -> str | None:
    """The path of the one libpq in a ``/proc/PID/maps`` listing, or None (none, or several)."""
    found = set()
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
        name = Path(fields[-1]).name if len(fields) == 6 else ""
        if name.startswith("libpq") and ".so" in name:
            found.add(fields[5])
    return found.pop() if len(found) == 1 else None


@cache
def receive_loop() -> ModuleType | None:
    """The compiled receive loop bound to psycopg's libpq (call once psycopg is imported), or
    None: not built, forced off, or no single libpq to bind to."""
    if pure_python_forced():
        return None
    native = load_native("receivewal.replication._recv")
    if native is None:
        return None
    try:
        libpq = loaded_libpq(MAPS.read_text())
    except OSError:  # no /proc: not Linux
        return None
    if libpq is None:
        return None
    try:
        native.bind(libpq)
    except OSError:
        return None
    keep_freed_buffers()  # a run holds up to a megabyte of libpq's message buffers at once
    return native
