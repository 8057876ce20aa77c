"""``receivewal recover``: from an archive (a directory or a bucket) to a data directory that
PostgreSQL recovers from, end to end.

The backup is the one named, or the newest one a recovery to the target can start from
(:func:`~receivewal.recovery.choice.choose_backup`: complete, of the archive's system, on the
target timeline's history, its WAL in the archive, ending before a time or LSN target). It is
unpacked into the empty data directory, checked against its manifest on the way
(:mod:`receivewal.recovery.unpack`), and the recovery settings are written with a
``restore_command`` that reads this very archive through ``receivewal restore``: recover's
block alone decides the recovery, whatever recovery settings the backup inherited.

A hole in the archive's WAL between the backup and the end of the target timeline (a segment
missing while later WAL of its timeline is held) is refused before anything is written: the
server's restore calls would stop recovery there. A time target after the last commit or abort
the archive's WAL holds on the way to the target timeline is refused before anything is written
(:mod:`receivewal.recovery.reach`): PostgreSQL would replay the whole archive and stop with FATAL
"recovery ended before configured recovery target was reached"; ``beyond_archive`` accepts it
(the WAL up to it will still come).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from receivewal.archive.sealed import NoIdentity
from receivewal.archive.view import ArchiveView
from receivewal.backup.catalog import EntryState, backup_files, catalog_of
from receivewal.backup.record import BackupRecord, utc_text
from receivewal.backup.sealing import readable_files
from receivewal.errors import ArchiveError
from receivewal.recovery.choice import RecoveryTarget, choose_backup, unusable
from receivewal.recovery.owner import Owner, hand_over, owner_problem
from receivewal.recovery.reach import chain_hole, last_transaction, replayed_segments
from receivewal.recovery.recoveryconf import (
    recovery_settings,
    restore_command,
    start_instructions,
    with_extra_settings,
)
from receivewal.recovery.unpack import (
    RecoveryConfig,
    Unpacked,
    refuse_unless_empty,
    tablespace_directories,
    unpack_backup,
    write_recovery,
)
from receivewal.wal.lsn import format_lsn
from receivewal.wal.names import parse_segment_file_name

LATEST = "latest"


@dataclass(frozen=True)
class RecoverSettings:
    """What ``receivewal recover`` was asked to do."""

    archive: str  # a directory or s3://BUCKET/PREFIX
    pgdata: Path
    backup_id: str = LATEST
    target: RecoveryTarget = field(default_factory=RecoveryTarget)
    action: str = "promote"
    mapping: Mapping[str, str] = field(default_factory=dict)  # tablespace: old -> new
    restore_prefix: str = "receivewal restore"  # how the server runs receivewal restore
    sync: bool = True
    identity: str | None = None  # --identity FILE: decrypts a sealed backup and the WAL
    beyond_archive: bool = False  # a time target after the archive's last commit is accepted
    on_progress: Callable[[int], None] | None = None  # bytes unpacked so far, as they grow
    on_backup: Callable[[BackupRecord], None] | None = None  # told the backup chosen
    owner: Owner | None = None  # who the files go to, checked first (None: ours)
    owner_given: bool = False  # --owner named it: what it cannot do is refused, not warned of
    extra: tuple[tuple[str, str], ...] = ()  # --setting NAME=VALUE, in the recovery block


@dataclass(frozen=True)
class Recovered:
    """What recover did: the backup, where it went, what it changed in the configuration,
    and what the operator is told next."""

    record: BackupRecord
    unpacked: Unpacked
    config: RecoveryConfig
    text: str


def target_timeline(place: ArchiveView, target: RecoveryTarget, newest: int) -> int:
    """The timeline recovery follows: the target's, else the newest the archive knows."""
    if target.timeline is not None:
        return target.timeline
    return max([newest, *place.histories()])


def pick_backup(place: ArchiveView, settings: RecoverSettings) -> BackupRecord:
    """The backup the recovery starts from (see the module's docstring)."""
    identity = place.identity()
    if identity is None:
        raise ArchiveError(f"{place.archive} is not a receivewal archive (it has no identity "
                           "record): recover needs its WAL")
    entries = catalog_of(place)
    histories = place.histories()
    timeline = target_timeline(place, settings.target, identity.timeline)
    held = place.held(identity.segment_size)
    if settings.backup_id != LATEST:
        entry = next((e for e in entries if e.backup_id == settings.backup_id), None)
        if entry is None:
            raise ArchiveError(f"{place.archive} has no backup {settings.backup_id}")
        if entry.state is not EntryState.COMPLETE or entry.record is None:
            raise ArchiveError(f"backup {settings.backup_id} is not complete: "
                               f"{entry.describe()}")
        problem = unusable(entry.record, settings.target, timeline, histories,
                           held.__contains__)
        if problem is not None:
            raise ArchiveError(f"backup {settings.backup_id} cannot start a recovery to "
                               f"{settings.target.describe()}: it {problem}")
        return entry.record
    records = [e.record for e in entries if e.record is not None]
    return choose_backup(records, settings.target, timeline, histories,
                         system_identifier=identity.system_identifier,
                         has_wal=held.__contains__).record


def check_chain(place: ArchiveView, record: BackupRecord, settings: RecoverSettings) -> None:
    """Refuse a hole in the chain of segments from the backup to the end of the target
    timeline (ArchiveError naming the missing segment and the next one held): the server's
    restore calls would stop recovery there (exit 126). An LSN target before the hole does
    not reach it."""
    identity = place.identity()
    assert identity is not None  # pick_backup refused an archive without one
    size = identity.segment_size
    timeline = target_timeline(place, settings.target, identity.timeline)
    hole = chain_hole(record, timeline, place.histories(), place.held(size).__contains__,
                      place.names)
    if hole is None:
        return
    missing, following = hole
    parsed = parse_segment_file_name(missing, size)
    if (settings.target.lsn is not None and parsed is not None
            and settings.target.lsn < parsed.start_lsn(size)):
        return
    raise ArchiveError(
        f"the archive has a hole: {missing} is missing, though it holds later WAL of its "
        f"timeline (next: {following}); a recovery from backup {record.backup_id} would stop "
        "there (restore exits 126) and never reach what follows; nothing was written (put "
        "the missing segment back, then run recover again)")


def check_reach(place: ArchiveView, record: BackupRecord, settings: RecoverSettings
                ) -> str | None:
    """Refuse a time target the archive's WAL never reaches (ArchiveError naming its last
    commit), unless ``beyond_archive``; a warning when its WAL cannot be read without a key."""
    target = settings.target
    if target.time is None or settings.beyond_archive:
        return None
    identity = place.identity()
    assert identity is not None  # pick_backup refused an archive without one
    timeline = target_timeline(place, target, identity.timeline)
    segments = replayed_segments(record, timeline, place.histories(),
                                 place.held(identity.segment_size).__contains__)
    try:
        last = last_transaction(place.source(), segments, identity.segment_size,
                                settings.identity)
    except NoIdentity:
        return ("The archive's WAL is sealed and recover has no --identity: it could not read "
                "the time of the archive's last commit. A --target-time after it makes the "
                "server replay the whole archive and stop with FATAL \"recovery ended before "
                "configured recovery target was reached\".")
    if last is not None and target.time < last.time:
        return None
    where = "holds no commit or abort after the backup starts" if last is None else (
        f"ends with its last commit or abort at {utc_text(last.time)} (LSN "
        f"{format_lsn(last.lsn)} in {last.segment})")
    raise ArchiveError(
        f"the target time {utc_text(target.time)} is not reached: the archive's WAL on "
        f"timeline {timeline} {where}, and PostgreSQL would replay all of it and stop with "
        "FATAL \"recovery ended before configured recovery target was reached\"; recover "
        "without a target to the end of the archive, or add --target-beyond-archive when the "
        "WAL up to the target will reach the archive before the server replays it")


def in_background(work: Callable[[], str | None]) -> Callable[[], str | None]:
    """``work`` started on a thread of its own; the function returned waits for its answer
    (or raises its error)."""
    answers: list[str | None] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            answers.append(work())
        except BaseException as exc:  # noqa: BLE001 - raised where the answer is asked for
            errors.append(exc)

    thread = threading.Thread(target=run, name="receivewal-owner-check", daemon=True)
    thread.start()

    def answer() -> str | None:
        thread.join()
        if errors:
            raise errors[0]
        return answers[0]

    return answer


def run_recover(settings: RecoverSettings) -> Recovered:
    """Unpack and prepare the recovery; the backup, where it went, what the configuration
    lost, and how to start the server."""
    place = ArchiveView.open(settings.archive)
    refuse_unless_empty(settings.pgdata, "data directory")
    record = pick_backup(place, settings)
    for directory in tablespace_directories(record, settings.mapping).values():
        refuse_unless_empty(directory, "tablespace directory")
    # a sealed backup: the key is checked before anything is written
    files = readable_files(backup_files(place, record.backup_id), record, settings.identity)
    check_chain(place, record, settings)
    warning = check_reach(place, record, settings)
    # the server runs restore_command in the data directory: a directory is named absolute
    archive = str(Path(place.archive).absolute()) if place.location.is_local \
        else place.archive
    identity = None if settings.identity is None else str(Path(settings.identity).absolute())
    problem: str | None = None
    owner_checked: Callable[[], str | None] | None = None
    if settings.owner is not None:
        check = functools.partial(owner_problem, settings.owner,
                                  Path(archive) if place.location.is_local else None,
                                  identity, settings.restore_prefix)
        if settings.owner_given:  # refused before anything is written
            problem = check()
            if problem is not None:
                raise ArchiveError(f"{problem}; nothing was written")
        else:  # only warned of: checked while the backup is unpacked
            owner_checked = in_background(check)
    block = with_extra_settings(recovery_settings(settings.target, settings.action,
                                                  restore_command(settings.restore_prefix,
                                                                  archive, identity)),
                                settings.extra)
    if settings.on_backup is not None:
        settings.on_backup(record)
    unpacked = unpack_backup(files, record, settings.pgdata, mapping=settings.mapping,
                             sync=settings.sync, on_progress=settings.on_progress)
    config = write_recovery(settings.pgdata, block, sync=settings.sync)
    if owner_checked is not None:
        problem = owner_checked()
    if settings.owner is not None:
        hand_over([settings.pgdata, *unpacked.tablespaces.values()], settings.owner)
    text = start_instructions(settings.pgdata, list(unpacked.tablespaces.values()))
    if warning is not None:
        text += "\n" + warning
    if problem is not None:
        text += (f"\nWarning: {problem}. The files are that user's because it owns the data "
                 "directory's parent: the server's restore calls will fail until this is "
                 "fixed (with --owner USER, recover refuses instead of warning).")
    recorded = place.identity()
    if settings.identity is None and recorded is not None and recorded.recipient_sets:
        newest = recorded.recipient_sets[-1].recipients
        text += ("\nThe archive's WAL is encrypted (to " + newest.describe() + ", its identity "
                 "record says): this restore_command has no --identity, so the server's "
                 "restore calls cannot read sealed segments (exit 126) and recovery stops "
                 "there; to read them, run recover again with --identity FILE.")
    if not place.location.is_local:
        text += ("\nThe restore_command reads the bucket: the server's environment needs the "
                 "same object storage settings as this command (AWS_ENDPOINT_URL, "
                 "credentials, AWS_REGION...), e.g. in the service's environment file.")
    stream = f"-D {archive}" if place.location.is_local \
        else f"-D DIR --upload-to {archive}"
    text += ("\nOnce it has promoted (on a new timeline), the same archive goes on with it: "
             f"receivewal stream {stream} against the new primary, with a new slot (--slot "
             "NAME --create-slot-if-missing); its backups go into the same archive, and a "
             "later recover latest follows the newest timeline.")
    return Recovered(record, unpacked, config, text)
