"""The prefetch spool on disk: where it is, its records, its lock.

The spool lives next to ``%p``, in ``pg_wal/.receivewal/prefetch`` (:data:`SPOOL_DIR`), one
directory per archive, named by a digest of where the archive is (:func:`spool_dir`). Its
files: the spooled segments and history files (complete files only: the filler checks each
(:func:`~receivewal.archive.segmentcheck.checked_segment`), writes it under a temporary name and
renames it), ``.source`` (the system identifier and the segment size of the archive, the
fingerprint of a local archive as the filler found it (:func:`archive_fingerprint`), and the
exact source the filler fills it from), ``.window`` (the names the filler is fetching, in
order), ``.wanted`` (the last segment a call asked for: the filler keeps the segments after it
spooled), ``.ask`` and
``.answer`` (a call's question to the filler, and the filler's answer when it spooled nothing).
``.lock`` in the spool's root is held by the filler while it runs (:func:`busy`).

Both sides read and write these: the filler (:mod:`receivewal.restore.filler`) and the calls
(:mod:`receivewal.restore.served`). The records are hints, written as every file is (a new
temporary file, renamed into place) but never fsynced. The spool's directories are never
symbolic links (:func:`usable`, :func:`make_spool_dir`): nothing is written or removed through
one. Paths are strings: this module is on a call's lean path (see :mod:`receivewal.restore`).
"""

from __future__ import annotations

import fcntl
import os
import stat
import zlib

from receivewal.archive import durable
from receivewal.archive.location import IDENTITY_FILE
from receivewal.wal.leannames import is_segment_name

SPOOL_PARTS = (".receivewal", "prefetch")  # below pg_wal; then the archive's digest
SPOOL_DIR = os.path.join(*SPOOL_PARTS)
LOCK_FILE = ".lock"
WINDOW_FILE = ".window"
WANTED_FILE = ".wanted"
SOURCE_FILE = ".source"  # "SYSID\nSEGMENT_SIZE\nFINGERPRINT\nSOURCE\n": "-" for what is not
# known yet (a bucket's fingerprint is always "-")
ASK_FILE = ".ask"  # a call's question to the filler: "NAME TOKEN"
ANSWER_FILE = ".answer"  # the filler's answer: "NAME TOKEN absent" or "NAME TOKEN failed"


def spool_root(target: str) -> str:
    """The spool's root for restores to ``target`` (``%p``): next to it, in pg_wal."""
    return os.path.join(os.path.dirname(target), SPOOL_DIR)


def spool_dir(target: str, source: str) -> str:
    """The spool directory of the archive ``source`` (its resolved path, or its URL, endpoint
    and profile) for restores to ``target``. Named by a 64-bit digest of ``source``: it keeps
    two archives' files apart (the directory is the server user's, mode 0700), and ``.source``
    holds ``source`` itself. A path that is not UTF-8 counts by its bytes."""
    data = _encoded(source)
    digest = f"{zlib.crc32(data):08x}{zlib.crc32(data[::-1], 0x5EED):08x}"
    return os.path.join(spool_root(target), digest)


def _encoded(text: str) -> bytes:
    """``text`` as bytes, a file name's undecodable bytes (surrogate escapes) as they were."""
    return text.encode("utf-8", "surrogateescape")


def usable(directory: str) -> bool:
    """Whether the spool directory ``directory`` and the two above it are directories, not
    symbolic links (lstat: a planted link is never followed); False when any is missing."""
    path = directory
    for _ in range(len(SPOOL_PARTS) + 1):
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return False
        except OSError:
            return False
        path = os.path.dirname(path)
    return True


def make_spool_dir(directory: str) -> None:
    """Make the spool directory ``directory`` and the two above it (mode 0700) where missing,
    from the top; OSError when any of them is not a directory (a symbolic link, say), before
    anything is made below it."""
    parts = [directory]
    for _ in SPOOL_PARTS:
        parts.append(os.path.dirname(parts[-1]))
    for path in reversed(parts):
        try:  # noqa: SIM105 - contextlib would cost each call its import
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise OSError(f"{path}: part of the prefetch spool's path is not a directory")


def record_source(directory: str, system_identifier: str, segment_size: str,
                  source: str, fingerprint: str = "-") -> None:
    """Record whose WAL the spool holds: the archive's system identifier and its segment size
    (as the filler decided it: "-" while not known), the local archive's ``fingerprint`` as
    the filler found it before reading its identity, and the exact source (the filler's,
    before it spools anything)."""
    _write_bytes(directory, SOURCE_FILE, b"%s\n%s\n%s\n%s\n" % (
        system_identifier.encode(), segment_size.encode(), fingerprint.encode(),
        _encoded(source)))


def source_record(directory: str) -> tuple[str, str, str, str] | None:
    """The system identifier, the segment size, the fingerprint and the source recorded in
    the spool, or None."""
    try:
        with open(os.path.join(directory, SOURCE_FILE), "rb") as fh:
            text = fh.read(8192)
    except OSError:
        return None
    lines = text.split(b"\n", 3)
    if len(lines) < 4 or not lines[3].endswith(b"\n"):
        return None
    return (lines[0].decode("ascii", "replace"), lines[1].decode("ascii", "replace"),
            lines[2].decode("ascii", "replace"), lines[3][:-1].decode("utf-8", "surrogateescape"))


def recorded_source(directory: str) -> tuple[str, str, str] | None:
    """The system identifier, the segment size and the source recorded in the spool, or
    None."""
    record = source_record(directory)
    return None if record is None else (record[0], record[1], record[3])


def archive_fingerprint(archive: str) -> str:
    """What tells a local archive directory from another put at the same path, for two
    ``stat`` calls: the directory's device and inode, and its identity file's inode, size
    and modification time ("-" for each part that is missing). The identity file is only ever
    replaced by a rename (a new inode), as a swapped directory has another inode."""
    parts = []
    for path, fields in ((archive, ("st_dev", "st_ino")),
                         (os.path.join(archive, IDENTITY_FILE),
                          ("st_ino", "st_size", "st_mtime_ns"))):
        try:
            info = os.stat(path)
        except OSError:
            parts.append("-")
            continue
        parts.append(":".join(str(getattr(info, field)) for field in fields))
    return "/".join(parts)


def busy(root: str) -> bool:
    """Whether a filler holds the spool's lock right now."""
    try:
        fd = os.open(os.path.join(root, LOCK_FILE), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def window(directory: str) -> list[str]:
    """The names the filler at work is fetching (empty when none)."""
    try:
        with open(os.path.join(directory, WINDOW_FILE), "rb") as fh:
            return fh.read(4096).decode("ascii", "replace").split()
    except OSError:
        return []


def wanted(directory: str) -> str | None:
    """The last segment a call asked for, or None."""
    try:
        with open(os.path.join(directory, WANTED_FILE), "rb") as fh:
            name = fh.read(64).decode("ascii", "replace").strip()
    except OSError:
        return None
    return name if is_segment_name(name) else None


def record_wanted(directory: str, name: str) -> None:
    """Tell the filler that a call asked for ``name`` (the filler keeps the segments after it
    spooled). A hint: written under a temporary name and renamed, never fsynced."""
    _write_record(directory, WANTED_FILE, name)


def _write_record(directory: str, record: str, text: str) -> None:
    _write_bytes(directory, record, text.encode() + b"\n")


def write_window(directory: str, names: list[str]) -> None:
    """Record the names the filler is fetching (a hint for the calls, as ``.wanted``)."""
    _write_bytes(directory, WINDOW_FILE, "".join(f"{n}\n" for n in names).encode())


def _write_bytes(directory: str, record: str, body: bytes) -> None:
    """Write a small record as every file is written (a new temporary file, never through
    a link, renamed into place), without fsyncs: a hint."""
    durable.write_file_durably(directory, record, body, sync=False)


def _read_record(directory: str, record: str) -> list[str]:
    try:
        with open(os.path.join(directory, record), "rb") as fh:
            return fh.read(256).decode("ascii", "replace").split()
    except OSError:
        return []


def ask_question(directory: str, name: str, token: str) -> None:
    """A call asks the filler to spool ``name`` (``token`` tells this question from others)."""
    _write_record(directory, ASK_FILE, f"{name} {token}")


def question(directory: str) -> tuple[str, str] | None:
    """The name and token a call last asked the filler for, or None."""
    words = _read_record(directory, ASK_FILE)
    return (words[0], words[1]) if len(words) == 2 else None


def answer(directory: str, name: str, token: str, outcome: str) -> None:
    """The filler's answer to a question it could not fetch: ``absent`` or ``failed``."""
    _write_record(directory, ANSWER_FILE, f"{name} {token} {outcome}")


def answered(directory: str, name: str, token: str) -> str | None:
    """The filler's answer to the question (``name``, ``token``): ``"absent"``, ``"failed"``
    (anything else it says reads as a failure); None while it has not answered it."""
    words = _read_record(directory, ANSWER_FILE)
    return " ".join(words[2:]) if words[:2] == [name, token] else None
