"""Starting the prefetch filler, and what it fetches with: one filler per recovery keeps the
segments after the one PostgreSQL last asked for in the spool
(:mod:`receivewal.restore.filler`) while it replays.

The filler is forked from the first call that finds none at work (which has imported what
restoring needs already: the object store's client is made once per recovery, not per call),
leaves its session and process group, and closes the call's output, so PostgreSQL (which
waits for the call, not for the filler) goes on at once. It follows the calls until recovery
ends or no call comes for a while (:meth:`~receivewal.restore.filler.Spool.follow`). Its
failures are its own: a file it cannot fetch is left to the call that asks for it, which
reports it as any call does. Nothing here can change a call's exit status.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from receivewal.errors import ReceivewalError
from receivewal.restore.filler import Spool, following_names


def start_prefetch(directory: str, source: str, name: str, target: Path, count: int, *,
                   identity: str | None = None) -> None:
    """Start a detached filler of the ``count`` segments after ``name`` (just restored to
    ``target``), unless one is at work already (``identity``: the call's ``--identity``)."""
    try:
        size = target.stat().st_size
    except OSError:
        return
    names = following_names(name, count, size)
    if names:
        _start(directory, Spool.beside(target, source), names, count, size, identity=identity)


def start_filler(directory: str, source: str, target: Path, count: int, *,
                 identity: str | None = None) -> None:
    """Start a detached filler before any segment was restored, unless one is at work
    already: from a recovery's first call (the next timeline's history file), so that the
    first segment (its base backup's start, when there is a ``backup_label``) is fetched
    while PostgreSQL reads the backup label, and the calls after it ask a filler whose client
    is made instead of each making one. It learns the segment size from the first segment
    it fetches."""
    spool = Spool.beside(target, source)
    if spool.recovery_signal() is not None:  # else recovery is over (or it is not one)
        first = spool.backup_start()
        _start(directory, spool, [first] if first else [], count, None, identity=identity)


def _start(directory: str, spool: Spool, names: list[str], count: int,
           size: int | None, *, identity: str | None) -> None:
    if spool.busy():
        return
    try:
        lock = spool.claim(names)  # before the fork: a call that comes next sees the window
    except (OSError, ReceivewalError):
        return
    if lock is None:
        return
    pid = os.fork()
    if pid:
        os.close(lock)  # the child's copy keeps the lock
        os.waitpid(pid, 0)  # the intermediate child exits at once
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        _detach()
        spool.follow(lock, fetcher(directory, spool, identity), count, size,
                     first=names[0] if size is None and names else None)
    except BaseException:  # noqa: BLE001, S110 - the child's failure is never the call's
        pass
    os._exit(0)


def _detach() -> None:
    """No output to PostgreSQL's log or pipes, default signals, no working directory held."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def fetcher(directory: str, spool: Spool, identity_file: str | None = None,
            ) -> Callable[[str, Path], bool | None]:
    """``fetch(name, path)`` for the spool: True when restored to ``path``, False when the
    archive does not have it, None when it cannot be fetched now (the call will say why).

    Every file comes through restore's one path, which checks each segment against the
    archive's identity: read here once for the recovery (from a bucket, the identity object;
    when it cannot be read, nothing is fetched and each call restores, and reports, itself).
    Without an identity record the first segment fetched sets the system identifier the
    others must have. The archive's segment size is decided by the one rule (verify's and
    restore's), before each fetch while no identity record decides it. The spool records both,
    and the source, before anything is spooled. Sealed files are decrypted with
    ``identity_file`` (the calls' ``--identity``) before they are checked and spooled."""
    from receivewal.archive.directory import Archive  # noqa: PLC0415 - in the filler
    from receivewal.archive.identity import ArchiveIdentity  # noqa: PLC0415
    from receivewal.archive.location import is_bucket_url  # noqa: PLC0415
    from receivewal.restore.local import archive_segment_size, restore_file  # noqa: PLC0415
    from receivewal.restore.spoolfiles import archive_fingerprint  # noqa: PLC0415
    from receivewal.restore.writing import NotInArchive  # noqa: PLC0415
    from receivewal.wal.pageheader import (  # noqa: PLC0415
        SIZE_OF_LONG_PHD,
        parse_long_header,
    )

    restore: Callable[[str, Path, int | None, int], object]
    decide: Callable[[], int]
    identity: ArchiveIdentity | None
    fingerprint = "-" if is_bucket_url(directory) else archive_fingerprint(directory)
    try:
        if is_bucket_url(directory):
            from receivewal.restore.remote import BucketSource  # noqa: PLC0415

            bucket = BucketSource(directory, identity_file=identity_file)
            identity = bucket.identity()
            decide = bucket.segment_size

            def restore(name: str, path: Path, sysid: int | None, size: int) -> object:
                return bucket.restore(name, path)
        else:
            local = Path(directory)
            identity = Archive(local).read_identity()

            def decide() -> int:
                return archive_segment_size(local, identity)

            def restore(name: str, path: Path, sysid: int | None, size: int) -> object:
                return restore_file(local, name, str(path), system_identifier=sysid,
                                    segment_size=size, identity_file=identity_file)
        size = decide() if identity is not None else None
    except (ReceivewalError, OSError):
        return lambda name, path: None
    pinned = None if identity is None else int(identity.system_identifier)
    spool.record_source(_or_dash(pinned), _or_dash(size), fingerprint)

    def fetch(name: str, path: Path) -> bool | None:
        nonlocal pinned, size
        try:
            decided = size if identity is not None else decide()
            if decided != size:
                size = decided
                spool.record_source(_or_dash(pinned), str(size), fingerprint)
            assert size is not None
            restore(name, path, pinned, size)
        except NotInArchive:
            return False
        except (ReceivewalError, OSError):
            return None
        if pinned is None and len(name) == 24:
            try:
                with path.open("rb") as fh:  # checked; a call may have taken it already
                    header = parse_long_header(fh.read(SIZE_OF_LONG_PHD))
            except OSError:
                header = None
            if header is not None:
                pinned = header.system_identifier
                spool.record_source(str(pinned), str(size), fingerprint)
        return True

    return fetch


def _or_dash(value: int | None) -> str:
    """A record's field: the number, or "-" while it is not known."""
    return "-" if value is None else str(value)
