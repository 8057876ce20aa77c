"""Buffers that end (or start) at an unreadable page, to catch out-of-bounds reads in C.

:func:`guarded` copies bytes into an anonymous mapping so that the byte after the last one
(``at="end"``) or the byte before the first one (``at="start"``) lies on a page mapped
PROT_NONE: a read past the buffer's bounds is a SIGSEGV, not a silent look at whatever the
heap holds. Run code that uses it in a child process, so a crash is an exit status.
"""

from __future__ import annotations

import ctypes
import mmap

_PROT_NONE = 0
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_keep: list[mmap.mmap] = []  # the mappings stay alive (and unreadable at the guard) until exit


def guarded(data: bytes, at: str = "end") -> memoryview:
    """``data`` in a buffer whose other side of ``at`` ("end" or "start") is unreadable."""
    page = mmap.PAGESIZE
    body = -(-max(len(data), 1) // page) * page
    region = mmap.mmap(-1, body + page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    if at == "end":
        guard, start = base + body, body - len(data)
    else:
        guard, start = base, page
    if _libc.mprotect(guard, page, _PROT_NONE) != 0:
        raise OSError(ctypes.get_errno(), "mprotect failed")
    region[start:start + len(data)] = data
    _keep.append(region)
    return memoryview(region)[start:start + len(data)]
