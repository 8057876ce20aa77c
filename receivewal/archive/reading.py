"""Opening archive files for reading: only regular files, never through a symbolic link, never
blocking, and small files only up to a cap.

Whatever sits in the archive directory under a name receivewal reads (a FIFO, a socket, a
device, a directory, a symbolic link), no reader blocks on it, reads it without end or opens
a device at all: the name is first checked with lstat, then opened with
``O_RDONLY|O_NONBLOCK|O_NOFOLLOW`` and checked again with fstat (the name may have changed in
between). Anything but a regular file is :class:`NotRegularFile`, an ArchiveError naming the
file and what it is. A missing file stays FileNotFoundError: only the caller knows whether
absence is fine. Every reader of archive files (restore, verify, status, analyze's local
reads, the identity, state, history and lock files) opens through :func:`open_regular`.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO, Protocol

from receivewal.errors import ArchiveError

#: The most a small file of the archive (identity, state, lock record) may hold.
SMALL_FILE_CAP = 1 << 20
#: The most a timeline history file may hold (one line per earlier timeline).
HISTORY_FILE_CAP = 16 << 20

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"))


class Readable(Protocol):
    """What is read from as a stream (a file, an object's body, a decrypting reader, a pipe):
    ``read(n)`` returns at most ``n`` bytes, b"" at the end."""

    def read(self, size: int = -1, /) -> bytes: ...


class NotRegularFile(ArchiveError):  # noqa: N818 - reads as what the caller is told
    """An archive name holds something other than a regular file (nothing was read)."""


def _kind(mode: int) -> str | None:
    """What a file of ``mode`` is when it is not a regular file, else None."""
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def _refuse(path: str | os.PathLike[str], mode: int) -> NotRegularFile:
    what = _kind(mode)
    detail = ", which receivewal never follows when reading the archive" \
        if stat.S_ISLNK(mode) else ", not a regular file"
    return NotRegularFile(f'"{os.fspath(path)}" is {what}{detail}')


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open an archive file for reading if, and only if, it is a regular file.

    Raises FileNotFoundError when nothing has the name, NotRegularFile naming the file and
    what it is otherwise, OSError when a regular file cannot be opened.
    """
    mode = os.lstat(path).st_mode
    if not stat.S_ISREG(mode):
        raise _refuse(path, mode)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # replaced since the lstat
            raise _refuse(path, os.lstat(path).st_mode) from exc
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _refuse(path, mode)
    return open(fd, "rb")


def read_small_file(path: str | os.PathLike[str], cap: int = SMALL_FILE_CAP) -> bytes:
    """The content of a small archive file, read through :func:`open_regular`.

    Raises FileNotFoundError when it is missing, ArchiveError naming it when it is not a
    regular file or holds more than ``cap`` bytes (nothing past ``cap + 1`` bytes is read),
    OSError when it cannot be read.
    """
    with open_regular(path) as fh:
        return capped(fh, cap, os.fspath(path))


def capped(stream: BinaryIO, cap: int, where: str) -> bytes:
    """What is left of ``stream``, a small file's: at most ``cap`` bytes, else ArchiveError
    naming it by ``where`` (nothing past ``cap + 1`` bytes is read). The one capped read of
    the archive's small files, wherever they are (:mod:`receivewal.archive.location`)."""
    data = stream.read(cap + 1)
    if len(data) > cap:
        raise ArchiveError(f'"{where}" is larger than {cap} bytes, too large for what it '
                           "should hold")
    return data
