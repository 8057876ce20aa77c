"""The prefetch filler: the detached process that keeps segments fetched ahead of PostgreSQL's
recovery in the spool, so that most restore_command calls are a rename.

The spool lives next to ``%p``, in ``pg_wal/.receivewal/prefetch`` (as WAL-G's
``pg_wal/.wal-g/prefetch``: on the same file system as ``%p``, so serving a file is a rename;
PostgreSQL ignores the directory). Each archive gets a subdirectory named by a digest of where
it is (its resolved path, or its URL and endpoint), so a file fetched from one archive is never
served for another; a WAL file name carries its timeline, so neither is one of another
timeline (:mod:`receivewal.restore.spoolfiles`).

One filler per recovery holds the spool's lock (``flock``: released by the kernel when a filler
is killed) and follows the calls (:meth:`Spool.follow`): each call records the segment it asked
for, and the filler keeps the window of segments after it spooled, until recovery has ended
(the data directory's ``recovery.signal`` and ``standby.signal`` are gone) or no call has come
for :data:`IDLE_LIMIT` seconds; then it empties its spool and exits. It removes what a killed
filler left (everything: a new filler starts from an empty spool) and every file outside its
window (other archives' subdirectories too), so the spool never holds more than the window's
files. Files are fetched through restore's one path (:func:`~receivewal.restore.local.
restore_file`, which checks every segment before it writes it), as restore writes ``%p`` (a new
temporary file, fsync, rename); the filler records the exact source, the system identifier
and the segment size (``.source``) and a spooled file is validated again when it is served,
only while its filler lives (:mod:`receivewal.restore.served`): never a stale, torn or foreign
file. The spool's
directories are opened without following a symbolic link (``O_NOFOLLOW``): nothing is pruned
through a link planted in pg_wal.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from receivewal.archive import durable
from receivewal.restore import spoolfiles
from receivewal.wal.leannames import is_segment_name
from receivewal.wal.names import parse_segment_file_name, wal_file_name

SPOOL_DIR = Path(spoolfiles.SPOOL_DIR)
LOCK_FILE = spoolfiles.LOCK_FILE
WINDOW_FILE = spoolfiles.WINDOW_FILE
IDLE_LIMIT = 60.0  # seconds without a call after which a filler exits (RECEIVEWAL_PREFETCH_IDLE)
_IDLE_POLL = 0.02  # seconds between looks at what the calls asked for, when all is spooled
_RETRY = 1.0  # seconds before a segment the archive lacked is asked for again
GRACE = 2.0  # seconds a filler answers questions after recovery has ended
_SIGNALS = ("recovery.signal", "standby.signal")


def following_names(name: str, count: int, segment_size: int) -> list[str]:
    """The ``count`` segments after ``name`` on its timeline."""
    parsed = parse_segment_file_name(name, segment_size)
    if parsed is None:
        return []
    return [wal_file_name(parsed.timeline, parsed.segno + i, segment_size)
            for i in range(1, count + 1)]


def idle_limit() -> float:
    """Seconds without a call after which a filler exits (``RECEIVEWAL_PREFETCH_IDLE``)."""
    text = os.environ.get("RECEIVEWAL_PREFETCH_IDLE", "")
    try:
        return max(float(text), 0.1) if text else IDLE_LIMIT
    except ValueError:
        return IDLE_LIMIT


class _Window:
    """What a filler keeps spooled: the ``count`` segments after ``latest``, the segment a
    call last asked for (``size`` None until the filler knows the segment size)."""

    __slots__ = ("count", "first", "latest", "names", "reread", "reread_of", "retry_at",
                 "shortened", "size")

    def __init__(self, count: int, size: int | None, first: str | None = None) -> None:
        self.count, self.size = count, size
        self.first = first  # the recovery's first segment, when the size is not known yet
        self.latest: str | None = None
        self.names: list[str] = []
        self.reread: str | None = None  # the last segment, to fetch again once taken
        self.reread_of: str | None = None  # the last one fetched again (once per segment)
        self.retry_at, self.shortened = 0.0, False  # after a failure: when to try again


class Spool:
    """The prefetch spool of one archive, next to a restore target."""

    def __init__(self, target: Path, source: str) -> None:
        self.target = target
        self.source = source
        self.root = Path(spoolfiles.spool_root(str(target)))
        self.dir = Path(spoolfiles.spool_dir(str(target), source))
        self.stale_question: tuple[str, str] | None = None  # asked of an earlier filler
        self.signal_file: Path | None = None  # the recovery's, when the spool was claimed

    @classmethod
    def beside(cls, target: Path, source: str) -> Spool:
        """The spool of the archive ``source`` for restores to ``target`` (``%p``)."""
        return cls(target, source)

    def busy(self) -> bool:
        """Whether a filler holds the spool's lock right now."""
        return spoolfiles.busy(str(self.root))

    def claim(self, names: list[str]) -> int | None:
        """Take the spool's lock for a filler of ``names`` (None when another filler holds it):
        remove what is outside the window and record the window. The returned descriptor
        holds the lock, across a fork too, until :meth:`follow` closes it."""
        spoolfiles.make_spool_dir(str(self.dir))  # OSError for a planted symbolic link
        root = self._open_root()
        try:
            fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=root)
        finally:
            os.close(root)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.stale_question = spoolfiles.question(str(self.dir))
            self.signal_file = self.recovery_signal()
            self._prune([])  # nothing a killed filler spooled is kept, nor its record
            (self.dir / spoolfiles.SOURCE_FILE).unlink(missing_ok=True)
            self._write_window(names)
        except BaseException:
            os.close(fd)
            if isinstance(sys.exc_info()[1], BlockingIOError):
                return None
            raise
        return fd

    def follow(self, lock: int, fetch: Callable[[str, Path], bool | None], count: int,
               segment_size: int | None, first: str | None = None) -> None:
        """Keep the ``count`` segments after the one a call last asked for spooled, fetching
        each with ``fetch(name, path)`` (which writes ``path`` atomically and returns False
        when the archive lacks the file, None when it cannot be fetched now: the window stops
        before it, and it is asked for again after a pause), and answer the calls' questions
        (:func:`~receivewal.restore.served.ask`), until recovery has ended (then it
        answers questions only, for :data:`GRACE` seconds: PostgreSQL asks for the parent
        timeline's history file after it removed the signal file) or no call came for
        :func:`idle_limit` seconds; then empty the spool and release ``lock`` (from
        :meth:`claim`). A filler started before any segment was restored (``segment_size``
        None) only answers questions until one is for a segment: its size is the segment
        size, and the window follows it; or, given the recovery's ``first`` segment (its
        base backup's start, :meth:`backup_start`), it fetches that one first."""
        limit, window = idle_limit(), _Window(count, segment_size, first)
        seen: tuple[int, int] | None = None
        answered = self.stale_question  # read under the lock, before any call could ask
        last_call, ended = time.monotonic(), 0.0
        try:
            while self.root.is_dir():
                if not ended and not self._recovering(self.signal_file):
                    ended = time.monotonic()  # questions only, from now on
                    window.names, window.reread = [], None
                    self._write_window([])
                now = time.monotonic()
                if now - last_call > limit or (ended and now - ended > GRACE):
                    break
                stamp = self._wanted_stamp()
                if stamp != seen:  # a call came (a new name, or the same asked again)
                    seen, last_call = stamp, now
                    if not ended:
                        self._move(window, spoolfiles.wanted(str(self.dir)))
                asked = spoolfiles.question(str(self.dir))
                if asked is not None and asked != answered:
                    answered, last_call = asked, time.monotonic()
                    size = self._answer(*asked, fetch)
                    if window.size is None and size is not None and not ended:
                        window.size = size  # its call takes it, and records it as wanted
                        self._move(window, asked[0])
                if not self._fill(window, fetch):
                    time.sleep(_IDLE_POLL)
        finally:
            self._empty()
            os.close(lock)  # releases the lock

    def _move(self, window: _Window, latest: str | None) -> None:
        """Move the window after ``latest``, the segment a call last asked for (kept
        spooled too, until that call has taken it); kept as it is when no call has named
        one. While the segment size is not known, ``latest`` is fetched first, to learn it
        (a call restored it itself: a filler started without a backup label)."""
        window.retry_at = 0.0
        if latest is None:
            return
        if window.size is None:
            window.first = window.first or latest
            return
        window.latest = latest
        window.names = self._window_from(latest, window.count, window.size)

    def _fill(self, window: _Window, fetch: Callable[[str, Path], bool | None]) -> bool:
        """Fetch the window's first segment not spooled (the window stops before one that
        cannot be fetched, tried again after a pause); whether one was fetched. When the
        archive lacks the segment after the last one asked for, recovery is at its end:
        PostgreSQL reads that last segment again once redo is done, so it is fetched again
        (once its call has taken it)."""
        if window.size is None:
            if window.first is None:
                return False
            name, window.first = window.first, None
            fetched, window.size = self._fetch_sized(name, fetch)
            if fetched:
                self._move(window, name)
            else:
                window.size = None
                self._write_window([])  # no call waits for it
            return True
        if window.reread is not None and not (self.dir / window.reread).exists():
            name, window.reread = window.reread, None
            self._write_window([name])  # a call for it waits rather than restoring it
            fetch(name, self.dir / name)
            self._write_window([])
            return True
        todo = next((n for n in window.names if not (self.dir / n).exists()), None)
        if todo is None or time.monotonic() < window.retry_at:
            return False
        if window.shortened:
            self._write_window(window.names)
        fetched = fetch(todo, self.dir / todo)
        if fetched:
            window.shortened = False
            return True
        window.retry_at, window.shortened = time.monotonic() + _RETRY, True
        self._write_window(window.names[:window.names.index(todo)])  # no call waits for it
        if fetched is False and todo == window.names[0] and window.latest != window.reread_of:
            window.reread = window.reread_of = window.latest
        return False

    def _answer(self, name: str, token: str, fetch: Callable[[str, Path], bool | None],
                ) -> int | None:
        """Fetch the file a call asked for into the spool, or say why not; the size of the
        segment fetched (None for a history file, or when nothing was fetched). A segment
        is fetched under a temporary name first: the asking call may take it as soon as it
        has its name."""
        path = self.dir / name
        if path.exists():
            return None
        if is_segment_name(name):
            fetched, size = self._fetch_sized(name, fetch)
        else:
            fetched, size = fetch(name, path), 0
        if not fetched:
            spoolfiles.answer(str(self.dir), name, token,
                              "failed" if fetched is None else "absent")
        return size or None

    def _fetch_sized(self, name: str, fetch: Callable[[str, Path], bool | None],
                     ) -> tuple[bool | None, int]:
        """``fetch`` a segment into the spool, under a temporary name first (a call may take
        it as soon as it has its name); what ``fetch`` said, and the file's size (0 when not
        fetched)."""
        into = self.dir / durable.temporary_name(name)
        fetched = fetch(name, into)
        if not fetched:
            return fetched, 0
        size = into.stat().st_size
        durable.finish_file(into, self.dir / name, sync=False)  # fetch synced the file; a
        # call fsyncs pg_wal when it takes it
        return fetched, size

    def _window_from(self, latest: str, count: int, segment_size: int) -> list[str]:
        """The window after ``latest``, recorded; the spool pruned to it and ``latest``."""
        window = following_names(latest, count, segment_size)
        self._prune([latest, *window])
        self._write_window(window)
        return window

    def _wanted_stamp(self) -> tuple[int, int] | None:
        try:
            info = (self.dir / spoolfiles.WANTED_FILE).stat()
        except OSError:
            return None
        return info.st_ino, info.st_mtime_ns

    def backup_start(self) -> str | None:
        """The segment a recovery from a base backup reads first (the ``START WAL LOCATION``
        file of its ``backup_label``), when ``%p`` is in that data directory's pg_wal."""
        if self.target.parent.name != "pg_wal":
            return None
        try:
            text = (self.target.parent.parent / "backup_label").read_text("ascii", "replace")
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("START WAL LOCATION:"):
                name = line.rpartition("(file ")[2].rstrip(")").strip()
                return name if is_segment_name(name) else None
        return None

    def recovery_signal(self) -> Path | None:
        """A signal file of the recovery this spool serves, when ``%p`` is in a data
        directory's pg_wal (None otherwise: then only the idle limit ends a filler)."""
        if self.target.parent.name != "pg_wal":
            return None
        data = self.target.parent.parent
        return next((data / s for s in _SIGNALS if (data / s).exists()), None)

    @staticmethod
    def _recovering(signal_file: Path | None) -> bool:
        """Whether the server is still recovering (a signal file is still there)."""
        return signal_file is None or any((signal_file.parent / s).exists() for s in _SIGNALS)

    def record_source(self, system_identifier: str, segment_size: str,
                      fingerprint: str = "-") -> None:
        """Record the archive's system identifier and segment size ("-" while not known), a
        local archive's fingerprint and this spool's exact source: a call serves nothing the
        record does not match, and a call finding another archive at the path refuses."""
        spoolfiles.record_source(str(self.dir), system_identifier, segment_size, self.source,
                                 fingerprint)

    def _write_window(self, names: list[str]) -> None:
        spoolfiles.write_window(str(self.dir), names)

    def _open_root(self) -> int:
        """A descriptor of the spool's root, reached from pg_wal (which may be a link, as
        ``initdb -X`` makes it) without following a symbolic link below it."""
        fd = os.open(self.root.parent.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in spoolfiles.SPOOL_PARTS:
                below = os.open(part, _DIRECTORY_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = below
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _empty(self) -> None:
        """Remove this archive's spooled files (recovery no longer needs them)."""
        with contextlib.suppress(OSError):
            root = self._open_root()
            try:
                _clear(root, self.dir.name, ())
            finally:
                os.close(root)

    def _prune(self, keep: Iterable[str]) -> None:
        """Remove other archives' subdirectories, leftovers of killed fillers and every file
        outside the window ``keep`` (the lock is held)."""
        root = self._open_root()
        try:
            for entry in os.scandir(root):
                if entry.name not in (LOCK_FILE, self.dir.name):
                    _remove(root, entry)
            _clear(root, self.dir.name, {*keep, spoolfiles.WANTED_FILE, WINDOW_FILE,
                                         spoolfiles.ASK_FILE, spoolfiles.ANSWER_FILE,
                                         spoolfiles.SOURCE_FILE})
        finally:
            os.close(root)


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _clear(root: int, name: str, keep: Iterable[str]) -> None:
    """Remove what the directory ``name`` in ``root`` holds but ``keep``; nothing when it is
    missing (a symbolic link there is an OSError: never followed)."""
    try:
        fd = os.open(name, _DIRECTORY_FLAGS, dir_fd=root)
    except FileNotFoundError:
        return
    try:
        for entry in os.scandir(fd):
            if entry.name not in keep:
                _remove(fd, entry)
    finally:
        os.close(fd)


def _remove(directory: int, entry: os.DirEntry[str]) -> None:
    """Remove ``entry`` of the open ``directory`` (a subdirectory whole), following no link."""
    with contextlib.suppress(FileNotFoundError):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.name, dir_fd=directory)
        else:
            os.unlink(entry.name, dir_fd=directory)
