"""The prefetch spool as a restore_command call sees it: serving a spooled segment.

PostgreSQL waits for each restore_command call, and a call whose segment the filler
(:mod:`receivewal.restore.filler`) has spooled only has to rename it to ``%p``. So this half of
the spool imports only ``os``-level modules and :mod:`receivewal.wal.pageheader` (each of
``dataclasses``, ``pathlib``, ``re`` or ``typing`` would cost a call more CPU than the rename;
a test pins that), and paths are strings.

The files of one archive's spool directory: the spooled segments (complete files only: the
filler checks each (:func:`~receivewal.archive.segmentcheck.checked_segment`), writes it under a
temporary name and renames it), ``.source`` (the system identifier of the archive and the exact
source the filler fills it from), ``.window`` (the names the filler is fetching, in order) and
``.wanted`` (the last segment a call asked for: the filler keeps the segments after it
spooled). ``.lock`` in the spool's root is held by the filler while it runs.

A spooled file is served only while the filler that spooled it is alive (it holds the lock),
and only to a call for the same source whose first page header names the recorded system: a
spool no live filler owns (a killed filler's) is emptied, never served. The spool's directories
are never symbolic links (:func:`usable`, :func:`make_spool_dir`): nothing is written or
removed through one.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
import zlib

from receivewal.archive import durable
from receivewal.errors import ConfigurationError
from receivewal.wal.lsn import join_lsn
from receivewal.wal.pageheader import (
    SIZE_OF_LONG_PHD,
    first_page_problem,
    header_segment_size,
    parse_long_header,
)

TYPE_CHECKING = False  # typing stays off the call's path
if TYPE_CHECKING:
    from collections.abc import Callable

SPOOL_PARTS = (".receivewal", "prefetch")  # below pg_wal; then the archive's digest
SPOOL_DIR = os.path.join(*SPOOL_PARTS)
LOCK_FILE = ".lock"
WINDOW_FILE = ".window"
WANTED_FILE = ".wanted"
SOURCE_FILE = ".source"  # "SYSID\nSOURCE\n": "-" while the system identifier is not known
ASK_FILE = ".ask"  # a call's question to the filler: "NAME TOKEN"
ANSWER_FILE = ".answer"  # the filler's answer: "NAME TOKEN absent" or "NAME TOKEN failed"
WAIT_LIMIT = 30.0  # seconds a call waits for a file being prefetched before fetching it itself
NOTICE_AFTER = 5.0  # seconds of waiting after which a call says on stderr what it waits for
#                     (half the call's bound when that is shorter)
_POLL = 0.005
_HEX = frozenset("0123456789ABCDEF")
_XLOGID_SPAN = 0x1_0000_0000  # the bytes one xlogid (a name's middle 8 digits) spans


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


def record_source(directory: str, system_identifier: str, source: str) -> None:
    """Record whose WAL the spool holds: the archive's system identifier ("-" while not
    known) and the exact source (the filler's, before it spools anything)."""
    _write_bytes(directory, SOURCE_FILE, b"%s\n%s\n" % (system_identifier.encode(),
                                                          _encoded(source)))


def recorded_source(directory: str) -> tuple[str, str] | None:
    """The system identifier and the source recorded in the spool, or None."""
    try:
        with open(os.path.join(directory, SOURCE_FILE), "rb") as fh:
            lines = fh.read(8192).split(b"\n")
    except OSError:
        return None
    if len(lines) < 3:
        return None
    return lines[0].decode("ascii", "replace"), lines[1].decode("utf-8", "surrogateescape")


def is_segment_name(name: str) -> bool:
    """Whether ``name`` looks like a WAL segment file name (24 upper-case hex digits)."""
    return len(name) == 24 and _HEX.issuperset(name) and name[:8] != "00000000"


def is_history_name(name: str) -> bool:
    """Whether ``name`` looks like a timeline history file name (``TTTTTTTT.history``)."""
    return (len(name) == 16 and name.endswith(".history") and _HEX.issuperset(name[:8])
            and name[:8] != "00000000")


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


def ask(directory: str, root: str, name: str, limit: float = WAIT_LIMIT,  # noqa: PLR0917
        notice: Callable[[], object] | None = None, notice_after: float = NOTICE_AFTER,
        ) -> str | None:
    """Ask the filler at work to fetch ``name`` (a segment or a history file) into the spool:
    ``"spooled"`` when it is there, ``"absent"`` when the archive has no form of it (answered
    after this question was asked), None when the filler could not tell (a failure, the filler
    gone, ``limit`` seconds): then the call restores the file itself. ``notice`` is called
    once the answer has taken ``notice_after`` seconds (the call says what it waits for)."""
    token = f"{os.getpid()}-{time.monotonic_ns()}"
    _write_record(directory, ASK_FILE, f"{name} {token}")
    path = os.path.join(directory, name)
    began = time.monotonic()
    deadline = began + min(limit, WAIT_LIMIT)
    while (now := time.monotonic()) < deadline:
        if notice is not None and now - began >= notice_after:
            notice()
            notice = None
        if os.path.exists(path):
            return "spooled"
        answer = _read_record(directory, ANSWER_FILE)
        if answer[:2] == [name, token]:
            return "absent" if answer[2:] == ["absent"] else None
        if not busy(root):
            return None
        time.sleep(_POLL)
    return None


def question(directory: str) -> tuple[str, str] | None:
    """The name and token a call last asked the filler for, or None."""
    words = _read_record(directory, ASK_FILE)
    return (words[0], words[1]) if len(words) == 2 else None


def answer(directory: str, name: str, token: str, outcome: str) -> None:
    """The filler's answer to a question it could not fetch: ``absent`` or ``failed``."""
    _write_record(directory, ANSWER_FILE, f"{name} {token} {outcome}")


def wait_for(directory: str, root: str, name: str, limit: float = WAIT_LIMIT,  # noqa: PLR0917
             notice: Callable[[], object] | None = None, notice_after: float = NOTICE_AFTER,
             ) -> bool:
    """While the filler at work has ``name`` in its window, wait until it is spooled, the
    filler is gone or drops it (the archive lacks it), at most ``limit`` seconds (and
    :data:`WAIT_LIMIT`); whether it was waited for. ``notice`` as for :func:`ask`."""
    if name not in window(directory):
        return False
    path = os.path.join(directory, name)
    began = time.monotonic()
    deadline = began + min(limit, WAIT_LIMIT)
    while not os.path.exists(path) and (now := time.monotonic()) < deadline:
        if not busy(root) or name not in window(directory):
            break
        if notice is not None and now - began >= notice_after:
            notice()
            notice = None
        time.sleep(_POLL)
    return True


def take(directory: str, name: str, target: str, source: str) -> bool:
    """Move the spooled segment (or history file) ``name`` to ``target`` (then fsync
    ``target``'s directory) if the spool of ``source`` holds a valid one; False otherwise.

    Served only while a filler owns the spool (else it is emptied: what a killed filler left
    is never served), when the spool records ``source`` as its source, and when the segment's
    first page header is its own and names the system recorded there (an invalid file is
    removed)."""
    path = os.path.join(directory, name)
    recorded = _owned_record(directory, source)
    if recorded is None:
        return False
    try:
        valid = (is_spooled_segment(path, name, recorded[0]) if is_segment_name(name)
                 else stat.S_ISREG(os.lstat(path).st_mode))
    except FileNotFoundError:
        return False
    except OSError:  # unreadable: not served
        valid = False
    if not valid:
        try:  # noqa: SIM105 - contextlib would cost each call its import
            os.unlink(path)
        except OSError:
            pass
        return False
    try:
        durable.finish_file(path, target)  # another call may have taken it first: then fetch
    except FileNotFoundError:
        return False
    return True


def _owned_record(directory: str, source: str) -> tuple[str, str] | None:
    """The spool's record when a live filler owns it (else the spool is emptied) and it was
    filled from ``source``; None otherwise."""
    if not usable(directory):
        return None
    if not busy(os.path.dirname(directory)):
        empty(directory)
        return None
    recorded = recorded_source(directory)
    return recorded if recorded is not None and recorded[1] == source else None


def empty(directory: str) -> None:
    """Remove the spooled files of ``directory`` (its records stay): no live filler owns it."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if is_segment_name(name) or is_history_name(name) or durable.is_temporary(name):
            try:  # noqa: SIM105 - contextlib would cost each call its import
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def is_spooled_segment(path: str, name: str, system_identifier: str = "-") -> bool:
    """Whether ``path`` is a regular file holding one whole segment named ``name``: its size
    is its page header's segment size, and the header is that segment's first page, of the
    database system ``system_identifier`` ("-": any). Raises FileNotFoundError when nothing
    is there."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        head = os.pread(fd, SIZE_OF_LONG_PHD, 0)
    finally:
        os.close(fd)
    if not stat.S_ISREG(info.st_mode) or not is_segment_name(name):
        return False
    try:
        size = header_segment_size(head)
    except ConfigurationError:
        return False
    log, seg = int(name[8:16], 16), int(name[16:], 16)
    if size != info.st_size or seg >= _XLOGID_SPAN // size:
        return False
    header = parse_long_header(head)
    assert header is not None  # header_segment_size read it
    if system_identifier != "-" and not system_identifier.isdigit():
        return False  # a record that cannot be read matches nothing
    sysid = None if system_identifier == "-" else int(system_identifier)
    return first_page_problem(header, timeline=int(name[:8], 16),
                              page_address=join_lsn(log, seg * size), segment_size=size,
                              system_identifier=sysid) is None
