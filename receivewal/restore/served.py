"""A restore_command call and the prefetch spool: serving a spooled file, waiting for the
filler or asking it, starting one.

PostgreSQL waits for each restore_command call, and a call whose segment the filler
(:mod:`receivewal.restore.filler`) has spooled only has to rename it to ``%p``: this module is
on a call's lean path (see :mod:`receivewal.restore`), and paths are strings.

A spooled file is served only while the filler that spooled it is alive (it holds the spool's
lock), and only to a call for the same source whose first page header names the recorded
system: a spool no live filler owns (a killed filler's) is emptied, never served. While a
filler lives, each call first compares the local archive's fingerprint with the one the filler
recorded (two ``stat`` calls): another archive put at the same path, of another database
system, makes the call refuse (:func:`swapped_archive`).
"""

from __future__ import annotations

import os
import stat
import time

from receivewal.archive import durable
from receivewal.errors import ConfigurationError, ReceivewalError
from receivewal.restore.spoolfiles import (
    answered,
    archive_fingerprint,
    ask_question,
    busy,
    make_spool_dir,
    record_wanted,
    recorded_source,
    source_record,
    spool_dir,
    spool_root,
    usable,
    window,
)
from receivewal.wal.leannames import (
    is_history_name,
    is_segment_name,
    name_timeline,
    segment_start,
)
from receivewal.wal.lsn import check_segment_size
from receivewal.wal.pageheader import SIZE_OF_LONG_PHD, first_page_problem, parse_long_header

TYPE_CHECKING = False  # restore's lean path loads no typing (~10 ms): see receivewal.restore
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Protocol

    class Call(Protocol):
        """What this module reads of a call (:class:`receivewal.restore.call.Call`)."""

        wal_name: str
        target: str
        directory: str
        partial: bool
        identity: str | None  # --identity FILE: the filler decrypts with it

        @property
        def window(self) -> int: ...  # segments to prefetch

        @property
        def from_bucket(self) -> bool: ...

        @property
        def source(self) -> str: ...  # the archive's source, which names its spool

        def left(self) -> float: ...  # seconds the call may still wait

WAIT_LIMIT = 30.0  # seconds a call waits for a file being prefetched before fetching it itself
NOTICE_AFTER = 5.0  # seconds of waiting after which a call says on stderr what it waits for
#                     (half the call's bound when that is shorter)
_POLL = 0.005


class Notice:
    """What a call waiting for the filler says (``say()``), once, when it has waited ``after``
    seconds (PostgreSQL's log shows it)."""

    __slots__ = ("after", "say")

    def __init__(self, say: Callable[[], object], after: float = NOTICE_AFTER) -> None:
        self.say, self.after = say, after


def take_spooled(call: Call, notice: Notice | None = None) -> bool:
    """Serve the call's file from the prefetch spool (waiting for the filler when it is
    fetching it); whether it was there. The filler is told which file was asked for first, so
    that it keeps that file until it is taken."""
    source = call.source
    directory = spool_dir(call.target, source)
    root = spool_root(call.target)
    name = call.wal_name
    if not usable(directory) or not (
            os.path.exists(os.path.join(directory, name))
            or wait_for(directory, root, name, call.left(), notice)):
        return False
    try:
        record_wanted(directory, name)
    except OSError:
        return False
    return take(directory, name, call.target, source)


def swapped_archive(call: Call) -> str | None:
    """Why the call must refuse, when a live filler spools for it from a local archive whose
    directory now holds another database system's WAL than the one the filler recorded (the
    archive at the path was replaced: its spooled files, and its own, belong to different
    clusters); None otherwise. Two ``stat`` calls and a small read while the archive is the
    one the filler found; its identity record is read only when the fingerprint differs."""
    if call.from_bucket:
        return None
    source = call.source
    directory = spool_dir(call.target, source)
    record = source_record(directory)
    if (record is None or record[3] != source or not record[0].isdigit()
            or archive_fingerprint(call.directory) == record[2]
            or not busy(os.path.dirname(directory))):
        return None
    from pathlib import Path  # noqa: PLC0415 - only when the archive changed

    from receivewal.archive.directory import Archive  # noqa: PLC0415

    try:
        identity = Archive(Path(call.directory)).read_identity()
    except (OSError, ReceivewalError):
        return None  # the call's own restore reports it
    if identity is None or identity.system_identifier == record[0]:
        return None
    return (f'the archive "{call.directory}" was replaced while this recovery restores from '
            f"it: it now holds database system {identity.system_identifier}'s WAL, the "
            f"segments restored before were system {record[0]}'s (nothing served; point "
            "restore_command at the recovery's own archive)")


def askable(call: Call) -> bool:
    """Whether to ask the filler at work for a file not spooled: from a bucket (where a call
    of its own would import boto3 and make a client), a segment or history file."""
    return (call.window > 0 and bool(call.target) and not call.partial and call.from_bucket
            and (is_segment_name(call.wal_name) or is_history_name(call.wal_name)))


def ask_filler(call: Call, notice: Notice | None = None) -> str | None:
    """The filler's answer for the call's file (``"spooled"``: taken to ``%p``;
    ``"absent"``), or None when there is no filler or it could not tell: the call restores it
    itself."""
    source = call.source
    directory = spool_dir(call.target, source)
    root = spool_root(call.target)
    if not busy(root) and not start_filler(call):
        return None
    if not usable(directory):
        return None
    try:
        outcome = ask(directory, root, call.wal_name, call.left(), notice)
        if outcome != "spooled":
            return outcome
        if is_segment_name(call.wal_name):
            record_wanted(directory, call.wal_name)
    except OSError:
        return None
    return "spooled" if take(directory, call.wal_name, call.target, source) else None


def start_filler(call: Call) -> bool:
    """From a recovery's first call (a history file's, ``%p`` in pg_wal), start the filler:
    it fetches the recovery's first segment, and the calls after it ask it (from a bucket,
    none of them imports boto3 or makes a client). Whether a filler is at work now."""
    if (not is_history_name(call.wal_name)
            or os.path.basename(os.path.dirname(os.path.abspath(call.target))) != "pg_wal"):
        return False
    if busy(spool_root(call.target)):
        return True
    from pathlib import Path  # noqa: PLC0415 - the filler's start, once per recovery

    from receivewal.restore import launch  # noqa: PLC0415

    try:
        launch.start_filler(call.directory, call.source, Path(call.target), call.window,
                            identity=call.identity)
    except (OSError, ReceivewalError):
        return False
    return busy(spool_root(call.target))


def keep_prefetching(call: Call, *, recorded: bool) -> None:
    """Tell the filler which file this call asked for (unless ``recorded`` already); start
    one when none runs."""
    if not recorded:
        directory = spool_dir(call.target, call.source)
        make_spool_dir(directory)  # OSError for a planted symbolic link
        record_wanted(directory, call.wal_name)
    if busy(spool_root(call.target)):
        return
    from pathlib import Path  # noqa: PLC0415 - the filler's start, once per recovery

    from receivewal.restore.launch import start_prefetch  # noqa: PLC0415

    start_prefetch(call.directory, call.source, call.wal_name, Path(call.target), call.window,
                   identity=call.identity)


def ask(directory: str, root: str, name: str, limit: float = WAIT_LIMIT,
        notice: Notice | None = None) -> str | None:
    """Ask the filler at work to fetch ``name`` (a segment or a history file) into the spool:
    ``"spooled"`` when it is there, ``"absent"`` when the archive has no form of it (answered
    after this question was asked), None when the filler could not tell (a failure, the filler
    gone, ``limit`` seconds): then the call restores the file itself. ``notice`` is said once
    the answer has taken its time."""
    token = f"{os.getpid()}-{time.monotonic_ns()}"
    ask_question(directory, name, token)
    path = os.path.join(directory, name)
    began = time.monotonic()
    deadline = began + min(limit, WAIT_LIMIT)
    while (now := time.monotonic()) < deadline:
        if notice is not None and now - began >= notice.after:
            notice.say()
            notice = None
        if os.path.exists(path):
            return "spooled"
        outcome = answered(directory, name, token)
        if outcome is not None:
            return "absent" if outcome == "absent" else None
        if not busy(root):
            return None
        time.sleep(_POLL)
    return None


def wait_for(directory: str, root: str, name: str, limit: float = WAIT_LIMIT,
             notice: Notice | None = None) -> bool:
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
        if notice is not None and now - began >= notice.after:
            notice.say()
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
        valid = (is_spooled_segment(path, name, recorded[0], recorded[1])
                 if is_segment_name(name)
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


def _owned_record(directory: str, source: str) -> tuple[str, str, str] | None:
    """The spool's record when a live filler owns it (else the spool is emptied) and it was
    filled from ``source``; None otherwise."""
    if not usable(directory):
        return None
    if not busy(os.path.dirname(directory)):
        empty(directory)
        return None
    recorded = recorded_source(directory)
    return recorded if recorded is not None and recorded[2] == source else None


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


def is_spooled_segment(path: str, name: str, system_identifier: str = "-",
                       segment_size: str = "-") -> bool:
    """Whether ``path`` is a regular file holding one whole segment named ``name`` of the
    archive the filler recorded: its size is the archive's segment size as the filler decided
    it (``segment_size``, by the one rule; "-": not decided, nothing is served), and its first
    page header is that segment's, of that size, of the database system ``system_identifier``
    ("-": any). Raises FileNotFoundError when nothing is there."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        head = os.pread(fd, SIZE_OF_LONG_PHD, 0)
    finally:
        os.close(fd)
    if not stat.S_ISREG(info.st_mode) or not is_segment_name(name):
        return False
    if not segment_size.isdigit() or not (system_identifier == "-"
                                          or system_identifier.isdigit()):
        return False  # a record that cannot be read matches nothing
    try:
        size = check_segment_size(int(segment_size))
    except ConfigurationError:
        return False
    start = segment_start(name, size)
    header = parse_long_header(head)
    if header is None or size != info.st_size or start is None:
        return False
    sysid = None if system_identifier == "-" else int(system_identifier)
    return first_page_problem(header, timeline=name_timeline(name), page_address=start,
                              segment_size=size, system_identifier=sysid) is None
