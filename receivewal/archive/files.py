"""File primitives of the segment writers: preallocation, opening a file for writing without
following a symbolic link, how much WAL a compressed ``.partial`` holds, and the crash tests'
kill points.

Two environment variables serve the crash tests: ``RECEIVEWAL_CRASH_AT=<point>`` SIGKILLs the
process at a named point, ``RECEIVEWAL_PREALLOCATE=zeros`` forces the zero-filling fallback.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import stat
from pathlib import Path

from receivewal.archive.compression import CorruptFile, decompress_chunks
from receivewal.archive.directory import os_error
from receivewal.errors import ArchiveError

CRASH_ENV = "RECEIVEWAL_CRASH_AT"
PREALLOCATE_ENV = "RECEIVEWAL_PREALLOCATE"
_ZERO_BLOCK = 1 << 20
_NOT_SUPPORTED = {errno.EOPNOTSUPP, errno.ENOSYS}
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def crash_point(armed: str | None, name: str) -> None:
    """SIGKILL this process when the crash tests armed point ``name``."""
    if armed == name:
        os.kill(os.getpid(), signal.SIGKILL)


def preallocate(fd: int, size: int, *, zeros: bool = False, crash: str | None = None) -> None:
    """Reserve ``size`` bytes: the fallocate system call, else zeros written in 1 MiB blocks.

    ``os.posix_fallocate`` is not used: where the file system lacks fallocate, glibc emulates
    it with one write per block (seconds per segment on FUSE or NFSv3).
    """
    if not zeros:
        if _libc.fallocate(fd, 0, 0, size) == 0:
            return
        err = ctypes.get_errno()
        if err not in _NOT_SUPPORTED:
            raise OSError(err, os.strerror(err))
    block = bytes(_ZERO_BLOCK)
    for offset in range(0, size, _ZERO_BLOCK):
        done = 0
        piece = memoryview(block)[: min(_ZERO_BLOCK, size - offset)]
        while done < len(piece):
            done += os.pwrite(fd, piece[done:], offset + done)
        crash_point(crash, "preallocating")


def open_for_writing(path: Path) -> int | None:
    """Open an existing regular file read-write, never through a symlink; None if missing."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise os_error(exc, f'could not open file "{path}"') from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ArchiveError(f'"{path}" is not a regular file')
    return fd


def held_wal(path: Path, method: str) -> int:
    """How many bytes of WAL a compressed ``.partial`` decodes to (0 when there is none)."""
    fd = open_for_writing(path)  # refuses a symlink where the .partial should be
    if fd is None:
        return 0
    held = 0
    with open(fd, "rb") as fh:
        try:
            for chunk in decompress_chunks(fh, method, truncated_ok=True):
                held += len(chunk)
        except CorruptFile:
            pass  # what decoded before the damage is what it holds
    return held
