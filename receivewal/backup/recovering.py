"""``receivewal recover``: from an archive (a directory or a bucket) to a data directory that
PostgreSQL recovers from, end to end.

The backup is the one named, or the newest one a recovery to the target can start from
(:func:`~receivewal.backup.choice.choose_backup`: complete, of the archive's system, on the
target timeline's history, its WAL in the archive, ending before a time or LSN target). It is
unpacked into the empty data directory, checked against its manifest on the way
(:mod:`receivewal.backup.unpack`), and the recovery settings are written with a
``restore_command`` that reads this very archive through ``receivewal restore``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from receivewal.backup.catalog import EntryState
from receivewal.backup.choice import RecoveryTarget, choose_backup, unusable
from receivewal.backup.place import BackupPlace, BucketPlace, open_place
from receivewal.backup.record import BackupRecord
from receivewal.backup.sealing import readable_files
from receivewal.backup.settings import (
    recovery_settings,
    restore_command,
    start_instructions,
)
from receivewal.backup.unpack import (
    Unpacked,
    refuse_unless_empty,
    tablespace_directories,
    unpack_backup,
    write_recovery,
)
from receivewal.errors import ArchiveError

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


def target_timeline(place: BackupPlace, target: RecoveryTarget, newest: int) -> int:
    """The timeline recovery follows: the target's, else the newest the archive knows."""
    if target.timeline is not None:
        return target.timeline
    return max([newest, *place.histories()])


def pick_backup(place: BackupPlace, settings: RecoverSettings) -> BackupRecord:
    """The backup the recovery starts from (see the module's docstring)."""
    identity = place.identity()
    if identity is None:
        raise ArchiveError(f"{place.archive} is not a receivewal archive (it has no identity "
                           "record): recover needs its WAL")
    entries = place.catalog()
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


def run_recover(settings: RecoverSettings) -> tuple[BackupRecord, Unpacked, str]:
    """Unpack and prepare the recovery; the backup, where it went, and how to start the
    server."""
    place = open_place(settings.archive)
    refuse_unless_empty(settings.pgdata, "data directory")
    record = pick_backup(place, settings)
    for directory in tablespace_directories(record, settings.mapping).values():
        refuse_unless_empty(directory, "tablespace directory")
    # a sealed backup: the key is checked before anything is written
    files = readable_files(place.files(record.backup_id), record, settings.identity)
    unpacked = unpack_backup(files, record, settings.pgdata, mapping=settings.mapping,
                             sync=settings.sync)
    # the server runs restore_command in the data directory: a directory is named absolute
    archive = place.archive if isinstance(place, BucketPlace) \
        else str(Path(place.archive).absolute())
    identity = None if settings.identity is None else str(Path(settings.identity).absolute())
    command = restore_command(settings.restore_prefix, archive, identity)
    write_recovery(settings.pgdata, recovery_settings(settings.target, settings.action,
                                                      command), sync=settings.sync)
    text = start_instructions(settings.pgdata, list(unpacked.tablespaces.values()))
    recorded = place.identity()
    if settings.identity is None and recorded is not None and recorded.recipient_sets:
        newest = recorded.recipient_sets[-1].recipients
        text += ("\nThe archive's WAL is encrypted (to " + newest.describe() + ", its identity "
                 "record says): this restore_command has no --identity, so the server's "
                 "restore calls cannot read sealed segments (exit 126) and recovery stops "
                 "there; to read them, run recover again with --identity FILE.")
    if isinstance(place, BucketPlace):
        text += ("\nThe restore_command reads the bucket: the server's environment needs the "
                 "same object storage settings as this command (AWS_ENDPOINT_URL, "
                 "credentials, AWS_REGION...), e.g. in the service's environment file.")
    return record, unpacked, text
