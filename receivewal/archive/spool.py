"""The prefetch spool: segments fetched ahead of PostgreSQL's recovery, so that most
restore_command calls are a rename.

It lives next to ``%p``, in ``pg_wal/.receivewal/prefetch`` (as WAL-G's ``pg_wal/.wal-g/prefetch``:
on the same file system as ``%p``, so serving a file is a rename; PostgreSQL ignores the
directory). Each archive gets a subdirectory named by a digest of where it is (its resolved
path, or its URL and endpoint), so a file fetched from one archive is never served for another;
a WAL file name carries its timeline, so neither is one of another timeline.

One filler at a time holds the spool's lock (``flock``: released by the kernel when a filler is
killed). It removes what a killed filler left (temporary files) and every file outside its
window (consumed segments' neighbours, other archives' subdirectories), so the spool never holds
more than the window's files. Files are written as restore writes ``%p`` (a new temporary file,
fsync, rename), and a spooled file is validated again when it is served (a regular file, one
segment long, the first page header of that very segment): never a stale or torn file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from receivewal.archive.durable import rename, sync_path
from receivewal.archive.reading import open_regular
from receivewal.errors import ConfigurationError, ReceivewalError
from receivewal.wal.names import parse_segment_file_name, wal_file_name
from receivewal.wal.pageheader import (
    SIZE_OF_LONG_PHD,
    first_page_problem,
    header_segment_size,
    parse_long_header,
)

SPOOL_DIR = Path(".receivewal") / "prefetch"
LOCK_FILE = ".lock"
WINDOW_FILE = ".window"  # the names a filler at work is fetching, in its archive's directory
WAIT_LIMIT = 30.0  # seconds a call waits for a file being prefetched before fetching it itself
_POLL = 0.005


def following_names(name: str, count: int, segment_size: int) -> list[str]:
    """The ``count`` segments after ``name`` on its timeline."""
    parsed = parse_segment_file_name(name, segment_size)
    if parsed is None:
        return []
    return [wal_file_name(parsed.timeline, parsed.segno + i, segment_size)
            for i in range(1, count + 1)]


class Spool:
    """The prefetch spool of one archive, next to a restore target."""

    def __init__(self, root: Path, source: str) -> None:
        self.root = root
        self.dir = root / hashlib.sha256(source.encode()).hexdigest()[:16]

    @classmethod
    def beside(cls, target: Path, source: str) -> Spool:
        """The spool of the archive ``source`` for restores to ``target`` (``%p``)."""
        return cls(target.parent / SPOOL_DIR, source)

    def take(self, name: str, target: Path) -> bool:
        """Move the spooled segment ``name`` to ``target`` (then fsync the directory) if the
        spool holds a valid one; False otherwise (an invalid file is removed)."""
        path = self.dir / name
        try:
            valid = _is_segment(path, name)
        except FileNotFoundError:
            return False
        except (OSError, ReceivewalError):  # not a regular file, unreadable: not served
            valid = False
        if not valid:
            with contextlib.suppress(OSError):
                path.unlink()
            return False
        try:
            rename(path, target)  # another call may have taken it first: then fetch
        except FileNotFoundError:
            return False
        sync_path(target.parent)
        return True

    def busy(self) -> bool:
        """Whether a filler holds the spool's lock right now."""
        try:
            fd = os.open(self.root / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def wait_for(self, name: str) -> bool:
        """When a filler at work has ``name`` in its window, wait until the file is spooled or
        the filler is gone (at most :data:`WAIT_LIMIT` seconds); whether it was waited for."""
        try:
            window = (self.dir / WINDOW_FILE).read_text().split()
        except (OSError, UnicodeDecodeError):
            return False
        if name not in window:
            return False
        deadline = time.monotonic() + WAIT_LIMIT
        while not (self.dir / name).exists() and self.busy() and time.monotonic() < deadline:
            time.sleep(_POLL)
        return True

    def claim(self, names: list[str]) -> int | None:
        """Take the spool's lock for a filler of ``names`` (None when another filler holds it):
        remove what is outside the window and record the window. The returned descriptor
        holds the lock, across a fork too, until :meth:`fill` closes it."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._prune(names)
            (self.dir / WINDOW_FILE).write_text("\n".join(names) + "\n")
        except BaseException:
            os.close(fd)
            if isinstance(sys.exc_info()[1], BlockingIOError):
                return None
            raise
        return fd

    def fill(self, lock: int, names: list[str], fetch: Callable[[str, Path], bool]) -> int:
        """Fetch each of ``names`` not yet spooled, in order, with ``fetch(name, path)`` (which
        writes ``path`` atomically and returns False when the archive lacks the file: the
        window stops there), then release ``lock`` (from :meth:`claim`). Returns the files
        fetched."""
        fetched = 0
        try:
            for name in names:
                if (self.dir / name).exists():
                    continue
                if not fetch(name, self.dir / name):
                    break
                fetched += 1
        finally:
            with contextlib.suppress(OSError):
                (self.dir / WINDOW_FILE).unlink()
            os.close(lock)  # releases the lock
        return fetched

    def _prune(self, keep: Iterable[str]) -> None:
        """Remove other archives' subdirectories, leftovers of killed fillers and every file
        outside the window ``keep`` (the lock is held)."""
        for entry in self.root.iterdir():
            if entry.name != LOCK_FILE and entry != self.dir:
                _remove(entry)
        wanted = set(keep)
        for entry in self.dir.iterdir():
            if entry.name not in wanted:
                _remove(entry)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _is_segment(path: Path, name: str) -> bool:
    """Whether ``path`` is a regular file holding one whole segment named ``name``: its size
    is its page header's segment size, and the header is that segment's first page."""
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        head = fh.read(SIZE_OF_LONG_PHD)
    try:
        if header_segment_size(head) != size:
            return False
    except ConfigurationError:
        return False
    header = parse_long_header(head)
    assert header is not None  # header_segment_size read it
    parsed = parse_segment_file_name(name, size)
    if parsed is None:
        return False
    return first_page_problem(header, timeline=parsed.timeline,
                              page_address=parsed.start_lsn(size), segment_size=size) is None
