"""The backups of an archive checked for ``receivewal verify`` (files opened, objects read).

Each complete backup is read back whole against its manifest
(:func:`~receivewal.backup.stored.verify_backup`: every file there once, of its size and
checksum), must be of the archive's system, and the archive must hold every WAL segment from
its start to its end. A record that cannot be read fails too. A backup being written, or one
interrupted (no record), is no backup: it is named, not checked, and fails nothing; an
interrupted one is reported as such (``interrupted``, with the bytes it leaves in a
directory), since it still uses disk or objects until ``cleanup`` removes it. A backup
sealed with ``backup --encrypt-to`` is read through ``--identity``; without one (or with a key
that is none of its recipients') its files are not checked, which is said, and its WAL is.
"""

from __future__ import annotations

from dataclasses import dataclass

from receivewal.archive.encryption import KeyFileError
from receivewal.archive.recipients import NotARecipient
from receivewal.archive.sealed import NoIdentity
from receivewal.archive.view import ArchiveView
from receivewal.backup.catalog import BackupEntry, EntryState, backup_files, catalog_of
from receivewal.backup.sealing import readable_files
from receivewal.backup.stored import Verified, verify_backup
from receivewal.errors import ArchiveError, StoreError
from receivewal.wal.lsn import format_lsn

INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class BackupCheck:
    """What verify found of one directory (or prefix) of ``backups/``."""

    backup_id: str
    state: str  # "verified", "sealed", "FAILED", "interrupted" or what another incomplete is
    detail: str
    bytes: int | None = None  # an interrupted backup's bytes in a directory

    @property
    def interrupted(self) -> bool:
        return self.state == INTERRUPTED

    @property
    def failed(self) -> bool:
        return self.state == "FAILED"

    def line(self) -> str:
        return f"backup {self.backup_id}: {self.state}: {self.detail}"


def check_backups(archive: str, key_file: str | None = None) -> list[BackupCheck]:
    """Every backup of ``archive`` checked (none when it has no ``backups/``), a sealed one
    through the identity file ``key_file``."""
    place = ArchiveView.open(archive)
    entries = catalog_of(place)
    if not entries:
        return []
    identity = place.identity()
    held = place.held(identity.segment_size) if identity is not None else set()
    return [check_entry(place, entry, identity.system_identifier if identity else None, held,
                        key_file)
            for entry in entries]


def _without_record(entry: BackupEntry) -> BackupCheck:
    """What verify says of a directory (or prefix) of ``backups/`` without a usable record."""
    if entry.state in (EntryState.DAMAGED, EntryState.INCOMPLETE):
        return BackupCheck(entry.backup_id, "FAILED", entry.describe())
    if entry.interrupted:
        size = "" if entry.bytes is None else f", {entry.bytes} bytes on disk"
        return BackupCheck(entry.backup_id, INTERRUPTED,
                           f"{entry.describe()}{size}: no recovery starts from it, not checked "
                           "(receivewal cleanup removes it)", entry.bytes)
    return BackupCheck(entry.backup_id, "not a backup", f"{entry.describe()}, not checked")


def check_entry(place: ArchiveView, entry: BackupEntry, system_identifier: str | None,
                held: set[str], key_file: str | None = None) -> BackupCheck:
    """One backup checked (see the module's docstring)."""
    record = entry.record
    if entry.state is EntryState.DAMAGED or record is None:
        return _without_record(entry)
    if system_identifier is not None and record.system_identifier != system_identifier:
        return BackupCheck(entry.backup_id, "FAILED",
                           f"of database system {record.system_identifier}, the archive's is "
                           f"{system_identifier}")
    wal = (f"WAL {format_lsn(record.start_lsn)} to {format_lsn(record.end_lsn)} on timeline "
           f"{record.end_timeline}")
    missing = [name for name in record.wal_segments() if name not in held]
    unchecked = ""  # why a sealed backup's files were not read
    verified = Verified(0, 0)
    try:
        files = readable_files(backup_files(place, entry.backup_id), record, key_file)
        verified = verify_backup(files, record)
    except (NoIdentity, NotARecipient, KeyFileError) as exc:
        unchecked = f"its files were not checked: {exc}"
    except (ArchiveError, StoreError) as exc:
        return BackupCheck(entry.backup_id, "FAILED", str(exc))
    if missing:
        return BackupCheck(entry.backup_id, "FAILED",
                           f"{unchecked or 'its files match the manifest'}, but the archive "
                           f"lacks WAL segment {missing[0]} of its {wal}")
    found = f"{verified.files} files, {verified.bytes} bytes match the manifest"
    return BackupCheck(entry.backup_id, "sealed" if unchecked else "verified",
                       f"{unchecked or found}; {wal} in the archive")
