"""The one-writer lock of an archive: the directory itself, locked with flock.

A lock file can be deleted or replaced while its holder runs, and the next writer then locks
the new file and writes beside the first. A directory cannot be deleted while it holds an
archive, and its inode stays the same whatever happens to the names in it, so the writer
holds ``flock(LOCK_EX)`` on a descriptor of the directory for the life of the process.
``.receivewal.lock`` only records who holds the lock (pid and host) for the message a second
writer gets; it is written atomically by :class:`~receivewal.archive.directory.Archive`, so
whatever stood at its path (a FIFO, a file of another user) is replaced, never opened.

``receivewal status`` asks whether a process holds the lock with a shared flock that it drops
at once (:func:`is_locked`); a writer that starts in that instant retries for a moment before
it calls the archive busy.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from receivewal.archive.reading import read_small_file
from receivewal.errors import ArchiveError

LOCK_FILE = ".receivewal.lock"
_ATTEMPTS = 20
_PAUSE = 0.01  # seconds between attempts: a status probe holds its shared lock for far less


def _open_directory(directory: Path) -> int:
    return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def lock_directory(directory: Path) -> int:
    """Take the archive's lock; return the descriptor that holds it (closing it releases it).

    Raises ArchiveError naming the holder when another process has the lock, or saying why
    the directory cannot be locked.
    """
    try:
        fd = _open_directory(directory)
    except OSError as exc:
        raise ArchiveError(f'could not open directory "{directory}" to lock it: '
                           f"{exc.strerror or exc}") from exc
    for _ in range(_ATTEMPTS):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            time.sleep(_PAUSE)
            continue
        except OSError as exc:
            os.close(fd)
            raise ArchiveError(f'could not lock directory "{directory}": '
                               f"{exc.strerror or exc}") from exc
        return fd
    os.close(fd)
    raise ArchiveError(f"archive {directory} is in use by {holder(directory)}")


def holder(directory: Path) -> str:
    """Who holds the lock, as its record says: ``pid N on HOST``, or why that is unknown."""
    path = directory / LOCK_FILE
    try:
        words = read_small_file(path).decode(errors="replace").split()
    except FileNotFoundError:
        return f"another process (its record {LOCK_FILE} was removed)"
    except (OSError, ArchiveError) as exc:
        return f'another process (its record "{path}" cannot be read: {exc})'
    pid, host = [*words, "?", "?"][:2]
    return f"pid {pid} on {host}"


def is_locked(directory: Path) -> bool | None:
    """Whether a process holds the archive's lock; None when that cannot be told."""
    try:
        fd = _open_directory(directory)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # drops the shared lock, if it was taken
    return False
