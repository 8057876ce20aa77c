"""Durable writes: the one module that creates temporary files, fsyncs and renames.

Every file receivewal writes whole (the archive's, ``%p``, the prefetch spool's files and
records, the state file, a completed change log) is made the same way, as pg_receivewal's
walmethods.c does: a new temporary file next to its target, written, then finished by
:func:`finish_file`, the one place where a file gets its name: fsynced, renamed into place, and
the directory fsynced (walmethods.c does it once too, in its close). With the archive's
``--no-sync`` (and for the prefetch spool, whose files are hints and copies) the two fsyncs are
skipped; nothing else changes.

One naming rule for the temporary files: ``.<name>.<pid>.receivewal-tmp`` next to ``<name>``
(``.<name>.<pid>-<random>.receivewal-tmp`` when that is taken: a leftover, or something
planted, which is left alone). It is created with ``O_CREAT|O_EXCL|O_NOFOLLOW``, so nothing is
ever written through a planted file or symbolic link. :func:`is_temporary` recognises it, and
the names earlier versions used, so that the archive's lock holder removes what a crash left
behind (:meth:`receivewal.archive.directory.Archive.remove_temporaries`).

Paths may be strings (a restore call's lean path imports no pathlib) or ``Path`` objects.
Errors are OSError: the caller names the file in the project's error.
"""

from __future__ import annotations

import contextlib
import os

TYPE_CHECKING = False  # typing, pathlib, tempfile and secrets stay off restore's lean path
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path
    from typing import IO, BinaryIO

TEMP_SUFFIX = ".receivewal-tmp"
# what earlier versions left: the writable-directory probe (mkstemp) in the archive
_OLD_PREFIXES = (".receivewal-probe-",)
_AS_A_COPY = 0o666  # a restored file's mode: the umask applies, as for a copy


def temporary_name(name: str, unique: str = "") -> str:
    """The temporary name under which ``name`` is prepared by this process."""
    return f".{name}.{unique or os.getpid()}{TEMP_SUFFIX}"


def is_temporary(name: str) -> bool:
    """Whether ``name`` is a temporary file of this rule, or of an earlier version's (the fixed
    ``.<name>.receivewal-tmp`` and mkstemp's ``.<name>.<random>.receivewal-tmp`` match it)."""
    return (name.startswith(".") and name.endswith(TEMP_SUFFIX)) \
        or name.startswith(_OLD_PREFIXES)


def create_temporary(target: Path, mode: int | None = None, *, replace_own: bool = False,
                     ) -> tuple[int, Path]:
    """A new empty file under ``target``'s temporary name; its descriptor and path.

    ``mode`` is set exactly (None: 0666 less the umask, as a copy). Never opens an existing
    file, never through a symbolic link: when the name is taken, the file there is left
    alone and a fresh random name is taken, unless ``replace_own`` (the archive's lock holder
    replaces a leftover of its own process).
    """
    fd, path = _create_temporary(os.fspath(target), mode, replace_own=replace_own)
    return fd, target.with_name(os.path.basename(path))


def _create_temporary(target: str, mode: int | None, *, replace_own: bool = False,
                      ) -> tuple[int, str]:
    directory, name = os.path.split(target)
    first = os.path.join(directory, temporary_name(name))
    if replace_own:
        _unlink_if_there(first)
    try:
        return _create_exclusive(first, mode), first
    except FileExistsError:
        pass
    import secrets  # noqa: PLC0415 - only when the name is taken
    while True:
        fresh = os.path.join(directory, temporary_name(
            name, f"{os.getpid()}-{secrets.token_hex(4)}"))
        try:
            return _create_exclusive(fresh, mode), fresh
        except FileExistsError:
            continue


def _create_exclusive(path: str, mode: int | None) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, _AS_A_COPY if mode is None else mode)
    if mode is not None:
        try:
            os.fchmod(fd, mode)  # O_CREAT's mode is filtered by the umask
        except OSError:
            os.close(fd)
            _unlink_if_there(path)
            raise
    return fd


def _unlink_if_there(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """os.write until every byte is written."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def sync_file(fd: int, *, sync: bool = True) -> None:
    """fsync an open file (nothing with ``sync`` off)."""
    if sync:
        os.fsync(fd)


def start_writeback(fd: int, *, sync: bool = True) -> None:
    """Ask the kernel to start writing an open file's dirty pages back, without waiting (as
    PostgreSQL's pre_sync_fname does before its fsyncs): many files written, then started
    so, then each fsynced by :func:`sync_path`, reach the disk in one stream instead of one
    file at a time. Nothing is durable until that fsync."""
    if sync and hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def sync_path(path: str | os.PathLike[str], *, sync: bool = True) -> None:
    """fsync a file or a directory by path (nothing with ``sync`` off)."""
    if not sync:
        return
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: the first Linux whose syncfs(2) reports a writeback error of any file of the file system
#: that happened since the descriptor it is given was opened (errseq_t on the superblock); an
#: older kernel may lose it, as PostgreSQL's documentation of recovery_init_sync_method says
_SYNCFS_REPORTS_ERRORS = (5, 8)


def _syncfs_reports_errors() -> bool:
    import sys  # noqa: PLC0415 - off the lean path: syncfs is recover's

    if not sys.platform.startswith("linux"):
        return False
    try:
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= _SYNCFS_REPORTS_ERRORS


class FileSystemSync:
    """Many files written under a few new directories, made durable by one sync of each one's
    file system at the end (syncfs(2), what ``sync -f`` and pg_basebackup's and initdb's
    ``--sync-method=syncfs`` do) instead of an fsync of every file and directory.

    It is as durable as those fsyncs: :meth:`watch` opens each directory before anything is
    written under it, and :meth:`finish` calls syncfs on that descriptor, which writes back
    every dirty page and inode of the file system, commits its journal (the new directory
    entries with it) and waits; since Linux 5.8 it also returns any writeback error of the
    file system since the descriptor was opened, whichever file it struck (even one whose
    pages were already written back and evicted), where an fsync per file would have returned
    it too. Where that does not hold (another system, an older kernel, no syncfs in the C
    library), ``by_files`` is True: the caller fsyncs each file and directory itself.
    Nothing is synced with ``sync`` off. OSError from :meth:`finish`.
    """

    def __init__(self, *, sync: bool = True) -> None:
        self.sync = sync
        self._fds: list[int] = []
        self._syncfs = _syncfs_function() if sync and _syncfs_reports_errors() else None

    @property
    def by_files(self) -> bool:
        """Whether each file and directory must be fsynced on its own (no usable syncfs)."""
        return self.sync and self._syncfs is None

    def watch(self, directory: str | os.PathLike[str]) -> None:
        """Open ``directory`` (made already, nothing written under it yet) to sync its file
        system at the end."""
        if self._syncfs is not None:
            self._fds.append(os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))

    def finish(self) -> None:
        """Sync the file system of every directory watched; OSError when writeback failed."""
        try:
            if self._syncfs is not None:
                import ctypes  # noqa: PLC0415 - off the lean path

                for fd in self._fds:
                    if self._syncfs(fd) != 0:
                        errno = ctypes.get_errno()
                        raise OSError(errno, os.strerror(errno))
        finally:
            self.close()

    def close(self) -> None:
        """Close the directories (without syncing: a failed write gives up)."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)


def _syncfs_function() -> Callable[[int], int] | None:
    """The C library's syncfs, or None."""
    import ctypes  # noqa: PLC0415 - off the lean path

    try:
        function = ctypes.CDLL(None, use_errno=True).syncfs
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    found: Callable[[int], int] = function
    return found


class DirectoryNotSynced(OSError):  # noqa: N818 - says what happened, as FileNotFoundError
    """:func:`finish_file` renamed the file, but its directory's fsync failed (``filename``
    is the directory): the file has its name, which a crash may still lose."""


def finish_file(temporary: str | os.PathLike[str], target: str | os.PathLike[str], *,
                fd: int | None = None, close: bool = False, sync: bool = True) -> None:
    """Give the file written as ``temporary`` its name ``target``, durably: the one way a file
    is finished. fsync it through ``fd`` (None: its writer has fsynced it already), close
    ``fd`` when ``close`` (also when the fsync fails), rename it to ``target`` atomically
    (replacing what is there), then fsync ``target``'s directory. ``sync`` off skips both
    fsyncs (``--no-sync``; the prefetch spool), never the order.

    Raises OSError; DirectoryNotSynced when only the directory's fsync failed."""
    if fd is not None:
        try:
            sync_file(fd, sync=sync)
        finally:
            if close:
                os.close(fd)
    os.replace(temporary, target)
    directory = os.path.dirname(os.fspath(target)) or "."
    try:
        sync_path(directory, sync=sync)
    except OSError as exc:
        raise DirectoryNotSynced(exc.errno, exc.strerror, directory) from exc


@contextlib.contextmanager
def durable_file(target: str | os.PathLike[str], mode: int | None = None, *,
                 sync: bool = True) -> Iterator[BinaryIO]:
    """Write ``target`` atomically: yields a new temporary file next to it; once the block
    ends, flushes it and finishes it (:func:`finish_file`: fsync, rename to ``target``, fsync
    the directory). On any error before the rename (SIGTERM raised as an exception included)
    the temporary file is removed and ``target`` is untouched."""
    fd, tmp = _create_temporary(os.fspath(target), mode)
    try:
        with os.fdopen(fd, "wb", closefd=False) as out:
            yield out
            out.flush()
    except BaseException:
        os.close(fd)
        _unlink_if_there(tmp)
        raise
    try:
        finish_file(tmp, target, fd=fd, close=True, sync=sync)  # fd is closed, whatever happens
    except DirectoryNotSynced:
        raise
    except BaseException:
        _unlink_if_there(tmp)
        raise


def write_file_durably(directory: str | os.PathLike[str], name: str, body: bytes, *,
                       mode: int = 0o600, sync: bool = True) -> None:
    """Write ``directory/name`` through a new temporary file: fsync, rename, fsync the
    directory (none of the fsyncs with ``sync`` off). Raises OSError."""
    with durable_file(os.path.join(directory, name), mode, sync=sync) as out:
        out.write(body)


def probe_writable(directory: Path) -> None:
    """Create and remove a temporary file in ``directory``; raises OSError when it cannot."""
    fd, path = create_temporary(directory / "receivewal-probe")
    os.close(fd)
    path.unlink()


def spooled_buffer(directory: Path, max_size: int) -> IO[bytes]:
    """A scratch buffer: in memory up to ``max_size`` bytes, beyond that an unnamed file in
    ``directory`` (gone when closed, whatever happens)."""
    import tempfile  # noqa: PLC0415 - off the lean path
    return tempfile.SpooledTemporaryFile(max_size=max_size, dir=str(directory))


def scratch_directory(prefix: str) -> Path:
    """A new private directory for scratch files (not durable; its user removes it)."""
    import tempfile  # noqa: PLC0415 - off the lean path
    from pathlib import Path  # noqa: PLC0415
    return Path(tempfile.mkdtemp(prefix=prefix))
