"""One ``receivewal restore %f %p`` call, as PostgreSQL runs it: :func:`run` takes the
:class:`Call` (read from the command line by :mod:`receivewal.commands.restore_options`) and
returns the exit status.

Exit status is what recovery understands: 0 when the file was restored, 1 only when the archive
definitely does not have it (every form missing; for a bucket, "no such key") and, for a
segment, holds no later WAL of its timeline (a segment missing before later ones is a hole, not
the end: 126, naming it; the one listing that tells costs a miss only), 126 for anything
else (damage, a store that cannot be reached or refuses the credentials after a few retries, a
bad ``%f``/``%p``, the unforeseen): PostgreSQL stops recovery on a status above 125 instead of
ending it early. On SIGTERM the temporary file is removed and the helper dies of the signal.

On object storage a call is bounded: each request has a few seconds to connect and to read
(:data:`~receivewal.restore.remote.RESTORE_PATIENCE`), and the whole call
:func:`restore_timeout` seconds (``RECEIVEWAL_RESTORE_TIMEOUT``, default 180), waits for the
prefetch filler included; after :data:`~receivewal.restore.served.NOTICE_AFTER` seconds
(or half the bound) it says on stderr what it waits for (PostgreSQL's log shows it), and at
the bound it exits 126.

With ``--prefetch N`` (default 8, for a bucket and a local directory alike), the N segments after
the one asked for are kept in a spool next to ``%p`` by a detached filler, one per recovery
(:mod:`receivewal.restore.launch`), and a later call finds its file there: a rename
(:mod:`receivewal.restore.served`). What a call may import is the package's rule
(:mod:`receivewal.restore`): this module is on the lean path.
"""

from __future__ import annotations

import os
import sys
import time

from receivewal.archive.location import is_bucket_url
from receivewal.errors import ReceivewalError
from receivewal.restore import served
from receivewal.secrets import is_private_key, key_given_as_file, redacted
from receivewal.wal.leannames import is_segment_name, next_held_after

TYPE_CHECKING = False  # restore's lean path loads no typing (~10 ms): see receivewal.restore
if TYPE_CHECKING:
    from types import FrameType

    from receivewal.restore.remote import BucketSource

NOT_FOUND = 1
DAMAGED = 126
PREFETCH = 8  # the default: a local archive's files are decoded (and fsynced) ahead too
RESTORE_TIMEOUT = 180.0  # seconds a call on object storage may take in all, by default


class Call:
    """One restore_command call (a plain class: ``dataclasses`` costs each call ~15 ms)."""

    __slots__ = ("deadline", "directory", "identity", "partial", "prefetch", "target",
                 "wal_name")

    def __init__(self, wal_name: str, target: str, directory: str, partial: bool = False,
                 prefetch: int | None = None, *, identity: str | None = None) -> None:
        self.wal_name, self.target, self.directory = wal_name, target, directory
        self.partial = partial
        self.identity = identity or None  # --identity FILE: decrypts sealed files
        self.prefetch = prefetch  # None: the default
        self.deadline: float | None = None  # time.monotonic() at which a bucket call gives up

    def left(self) -> float:
        """Seconds this call may still wait (for the store, or the filler)."""
        return 1e9 if self.deadline is None else self.deadline - time.monotonic()

    @property
    def window(self) -> int:
        """How many segments to prefetch after this one."""
        return PREFETCH if self.prefetch is None else self.prefetch

    @property
    def from_bucket(self) -> bool:
        """Whether the archive is in object storage."""
        return is_bucket_url(self.directory)

    @property
    def source(self) -> str:
        """Where the archive is, for the prefetch spool (:func:`source_id`)."""
        return source_id(self.directory)


class _Terminated(BaseException):
    """SIGTERM arrived: unwind (removing the temporary file), then die of the signal."""


def restore_timeout() -> float:
    """Seconds a call on object storage may take in all (``RECEIVEWAL_RESTORE_TIMEOUT``: a
    positive number; anything else, or nothing, is the default, :data:`RESTORE_TIMEOUT`)."""
    text = os.environ.get("RECEIVEWAL_RESTORE_TIMEOUT", "")
    try:
        value = float(text) if text else RESTORE_TIMEOUT
    except ValueError:
        return RESTORE_TIMEOUT
    return value if 0 < value < 1e7 else RESTORE_TIMEOUT


def run(call: Call) -> int:
    """Restore the file; the exit status for PostgreSQL."""
    spooled = call.window > 0 and bool(call.target) and is_segment_name(call.wal_name)
    refusal = _refusal(call, spooled=spooled)
    if refusal is not None:
        return _say(f"error: {refusal}", DAMAGED)
    if is_bucket_url(call.directory):
        call.deadline = time.monotonic() + restore_timeout()
    waiting = _waiting(call)
    taken = spooled and served.take_spooled(call, waiting)
    if not taken and served.askable(call):
        outcome = served.ask_filler(call, waiting)
        if outcome == "absent":
            return _absent(call, f'"{call.wal_name}" is not in the archive "{call.directory}" '
                           "(no such key in any of its forms)")
        taken = outcome == "spooled"
    if taken:
        _say(f"restored {_quoted(call.wal_name)} from the prefetch spool", 0)
    elif call.target and not call.partial and _surely_absent(call):
        if call.window > 0:
            served.start_filler(call)  # at a recovery's start, for the first segment
        return _absent(call, f'"{call.wal_name}" is not in the archive "{call.directory}"')
    else:
        status = _restore_guarded(call)
        if status:
            return status
    if spooled:
        # prefetching only saves later calls time: this call has succeeded whatever happens
        try:  # noqa: SIM105 - contextlib would cost each call its import
            served.keep_prefetching(call, recorded=taken)
        except (OSError, ReceivewalError):
            pass
    return 0


def _refusal(call: Call, *, spooled: bool) -> str | None:
    """Why the call is refused before anything is looked for, or None: an empty -D (it would
    name the current directory), a private key given as --identity (never shown), another
    cluster's archive put at the path under a live filler (:func:`served.swapped_archive`)."""
    if not call.directory:
        return "the archive directory (-D) is empty"
    if call.identity and is_private_key(call.identity):
        return key_given_as_file("--identity (or RECEIVEWAL_IDENTITY)")
    return served.swapped_archive(call) if spooled else None


def _absent(call: Call, message: str) -> int:
    """Exit 1 (``message``) for a file the archive lacks, but 126 for a segment missing
    while the archive holds later WAL of its timeline (:func:`_hole`): PostgreSQL must not end
    recovery there. When that cannot be told, 126 too."""
    try:
        hole = _hole(call)
    except (ReceivewalError, OSError) as exc:
        return _say(f"error: cannot restore {_quoted(call.wal_name)} from "
                    f"{_quoted(call.directory)}: it is missing, and whether later WAL of its "
                    f"timeline is there cannot be told: {_detail(exc)}", DAMAGED)
    if hole is not None:
        return _say(f"error: {hole}", DAMAGED)
    return _say(message, NOT_FOUND)


def _hole(call: Call, bucket: BucketSource | None = None) -> str | None:
    """The line naming the gap when the segment asked for is missing while the archive holds
    later WAL of its timeline (a hole is never the archive's end); None otherwise, and for
    any other name (a history file asked for at the end of recovery). The rule is
    :func:`~receivewal.wal.leannames.next_held_after`. It costs only a miss (once at the end
    of a recovery, and for each timeline probe), never a served segment: one listing of a
    local archive, one listing request of the timeline's keys after the name for a bucket
    (``bucket``, the call's source, when it has one). When it finds later WAL, the segment is
    looked for once more: the archive's writer may have completed it and begun the next one
    since the miss (a standby restoring from a live archive), which is no hole."""
    name = call.wal_name
    if not is_segment_name(name):
        return None
    if call.from_bucket:
        if bucket is None:
            from receivewal.restore.remote import BucketSource  # noqa: PLC0415 - boto3

            bucket = BucketSource(call.directory)
        later = bucket.later_wal(name)
        arrived = later is not None and bucket.holds(name)
    else:
        from receivewal.restore.absence import surely_absent  # noqa: PLC0415 - os-level only

        later = next_held_after(name, os.listdir(call.directory))
        arrived = later is not None and not surely_absent(call.directory, name)
    if later is None or arrived:  # arrived: the writer completed it since the miss, then
        return None  # the next one began; exit 1 as before, and the next call restores it
    return (f"{_quoted(name)} is missing from the archive {_quoted(call.directory)}, which "
            f"holds later WAL of its timeline (next: {_quoted(later)}): a hole in the "
            "archive, not its end; recovery stops here rather than end early and lose the "
            "transactions after it (put the missing segment back, then start the server again)")


def _surely_absent(call: Call) -> bool:
    """Whether a local archive plainly lacks the file (see :mod:`receivewal.restore.absence`)."""
    if call.from_bucket:
        return False
    from receivewal.restore.absence import surely_absent  # noqa: PLC0415 - os-level only

    return surely_absent(call.directory, call.wal_name)


def _restore_guarded(call: Call) -> int:
    """Restore the file from the archive; 0, or the exit status of the failure (said)."""
    import signal  # noqa: PLC0415 - not on the spool's path

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise _Terminated

    if call.left() <= 0:
        return _say_timed_out(call)
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    watched = call.deadline is not None and _watch(call)
    try:
        # Imported here, so that a broken installation (a codec or boto3 that fails to load)
        # is exit 126 as well, not a traceback and exit 1.
        from receivewal.restore.writing import NotInArchive  # noqa: PLC0415

        source = _restore(call)
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        raise
    except _TimedOut:
        return _say_timed_out(call)
    except (ReceivewalError, OSError) as exc:
        if isinstance(exc, NotInArchive):
            return _say(str(exc), NOT_FOUND)
        return _say(f"error: cannot restore {_quoted(call.wal_name)} from "
                    f"{_quoted(call.directory)}: {_detail(exc)}", DAMAGED)
    except Exception as exc:  # noqa: BLE001 - anything unforeseen stops recovery (126), as
        # damage does: exit 1 would tell PostgreSQL the file is absent and end recovery early
        return _say(f"error: cannot restore {_quoted(call.wal_name)} from "
                    f"{_quoted(call.directory)}: unexpected {type(exc).__name__}: "
                    f"{_detail(exc)}", DAMAGED)
    finally:
        if watched:
            signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGTERM, previous)
    _say(f"restored {_quoted(call.wal_name)} from {source}", 0)
    return 0


class _TimedOut(BaseException):
    """The call's bound on object storage has passed (raised by its alarm, wherever it waits:
    a BaseException, so that no library's ``except Exception`` swallows it)."""


def _watch(call: Call) -> bool:
    """Arm the call's alarm: after _notice_after() seconds it says what it waits for, at the
    deadline it raises _TimedOut. Whether it was armed."""
    import signal  # noqa: PLC0415 - not on the spool's path

    said = [False]

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        left = call.left()
        if left <= 0.01:
            raise _TimedOut
        if not said[0]:
            said[0] = True
            _say_waiting(call, filler=False)
        signal.setitimer(signal.ITIMER_REAL, left)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(0.01, min(_notice_after(), call.left())))
    return True


def _notice_after() -> float:
    """Seconds of waiting after which a call says what it waits for: NOTICE_AFTER, or half
    the call's bound when that is shorter."""
    return min(served.NOTICE_AFTER, restore_timeout() / 2)


def _waiting(call: Call) -> served.Notice:
    """What a call waiting for the filler says, and after how long."""
    return served.Notice(lambda: _say_waiting(call, filler=True), _notice_after())


def _endpoint() -> str:
    """The object store's endpoint as boto3's chain takes it, for messages."""
    return (os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            or "AWS S3 (boto3's default endpoint)")


def _say_waiting(call: Call, filler: bool) -> None:
    where = _quoted(f"{call.directory.rstrip('/')}/{call.wal_name}")
    what = (f"the prefetch filler to fetch {where} from {_endpoint()}" if filler
            else f"the object store at {_endpoint()} to answer for {where}")
    _say(f"waiting for {what} (giving up after {restore_timeout():g} s in all: "
         "RECEIVEWAL_RESTORE_TIMEOUT)", 0)


def _say_timed_out(call: Call) -> int:
    return _say(f"error: cannot restore {_quoted(call.wal_name)} from "
                f"{_quoted(call.directory)}: no answer from the object store at {_endpoint()} "
                f"within {restore_timeout():g} s (RECEIVEWAL_RESTORE_TIMEOUT)", DAMAGED)


def _restore(call: Call) -> str:
    """Restore the file from the archive; where it came from, for the log."""
    from pathlib import Path  # noqa: PLC0415

    target = Path(call.target)
    if not call.target:
        from receivewal.errors import ConfigurationError  # noqa: PLC0415

        raise ConfigurationError("the target file name (%p) is empty")
    from receivewal.errors import ArchiveError  # noqa: PLC0415
    from receivewal.restore.writing import NotInArchive  # noqa: PLC0415

    bucket = None
    try:
        if is_bucket_url(call.directory):
            from receivewal.restore.remote import BucketSource  # noqa: PLC0415

            bucket = BucketSource(call.directory, identity_file=call.identity)
            return _quoted(bucket.restore(call.wal_name, target))
        from receivewal.restore.local import restore_file  # noqa: PLC0415

        path = restore_file(Path(call.directory), call.wal_name, call.target,
                            partial=call.partial, identity_file=call.identity)
        return _quoted(path.name)
    except NotInArchive:
        hole = _hole(call, bucket)
        if hole is not None:
            raise ArchiveError(hole) from None
        raise


#: What, beside its URL, tells boto3's chain which store a bucket URL names: two stores with
#: the same s3://BUCKET/PREFIX must not share a spool.
STORE_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_PROFILE",
                   "AWS_DEFAULT_PROFILE", "AWS_CONFIG_FILE")


def source_id(directory: str) -> str:
    """Where an archive is, for the prefetch spool: a bucket's URL with the endpoint and
    profile variables of boto3's chain, or a local directory's resolved path."""
    if is_bucket_url(directory):
        return "|".join([directory, *(os.environ.get(name, "") for name in STORE_VARIABLES)])
    return os.path.realpath(directory)


def _say(message: str, status: int) -> int:
    """Write ``message`` to stderr (PostgreSQL's server log), its secrets masked."""
    sys.stderr.write(f"receivewal restore: {redacted(message)}\n")
    sys.stderr.flush()
    return status


_ESCAPES = {**{c: f"\\u{c:04x}" for c in range(32)}, ord("\\"): "\\\\", ord('"'): '\\"',
            ord("\b"): "\\b", ord("\f"): "\\f", ord("\n"): "\\n", ord("\r"): "\\r",
            ord("\t"): "\\t"}


def _quoted(text: str) -> str:
    """``text`` in double quotes, control characters escaped: the message stays one line
    (what ``json.dumps(text, ensure_ascii=False)`` gives, without importing json)."""
    return f'"{text.translate(_ESCAPES)}"'


def _detail(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f'"{exc.filename}": {exc.strerror}' if exc.filename else exc.strerror
    return " ".join(str(exc).split())
