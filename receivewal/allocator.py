"""glibc's allocator told to keep freed buffers of up to a few megabytes for reuse.

A process that frees buffers of a few hundred kilobytes to a megabyte at a time (the relay's
reads, the compiled receive loop's runs of libpq messages) otherwise gives that memory back to
the kernel as soon as it is freed: a freed block at the heap's top above 128 KiB is trimmed,
and a large block gets a mapping of its own. The next buffers then fault the same pages in
again, which costs more CPU than filling them. :func:`keep_freed_buffers` raises both
thresholds once per process; the relay and the receive loop both call it.

At the end of a process, CPython's finalization runs one last garbage collection over every
object the imports made (psycopg, structlog, click, the daemon's modules): 0.1 to 0.25 s of CPU
on the development machine, after the daemon has stopped, counted in every ``--endpos`` run.
:func:`skip_final_collection` freezes the heap at exit instead (the memory goes back to the
kernel with the process).
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
TRIM_THRESHOLD = 16 * 1024 * 1024
"""Freed memory at the top of the heap that glibc keeps for the next allocations."""
MMAP_THRESHOLD = 4 * 1024 * 1024
"""Allocations from this size up get a mapping of their own (and give it back when freed)."""
ALLOCATOR_VARIABLES = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


def keep_freed_buffers() -> bool:
    """Have glibc keep freed buffers for reuse (:data:`TRIM_THRESHOLD`,
    :data:`MMAP_THRESHOLD`); whether it did. Nothing is changed outside glibc, or when the
    environment already sets either threshold (``MALLOC_TRIM_THRESHOLD_``, ...)."""
    if any(name in os.environ for name in ALLOCATOR_VARIABLES):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                and mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def skip_final_collection() -> None:
    """Freeze the heap at exit, so that the interpreter's finalization does not collect it.
    Handlers registered before this one still run after it (atexit is last in, first out);
    calling it again registers it once."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
