"""The backups of an archive checked for ``receivewal verify`` (files opened, objects read).

Each complete backup is read back whole against its manifest
(:func:`~receivewal.backup.stored.verify_backup`: every file there once, of its size and
checksum), must be of the archive's system, and the archive must hold every WAL segment from
its start to its end. A record that cannot be read fails too. A backup being written, or one
interrupted (no record), is no backup: it is named, not checked, and fails nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from receivewal.backup.catalog import BackupEntry, EntryState
from receivewal.backup.place import BackupPlace, open_place
from receivewal.backup.stored import verify_backup
from receivewal.errors import ArchiveError, StoreError
from receivewal.wal.lsn import format_lsn


@dataclass(frozen=True)
class BackupCheck:
    """What verify found of one directory (or prefix) of ``backups/``."""

    backup_id: str
    state: str  # "verified", "FAILED" or what an incomplete one is
    detail: str

    @property
    def failed(self) -> bool:
        return self.state == "FAILED"

    def line(self) -> str:
        return f"backup {self.backup_id}: {self.state}: {self.detail}"


def check_backups(archive: str) -> list[BackupCheck]:
    """Every backup of ``archive`` checked (none when it has no ``backups/``)."""
    place = open_place(archive)
    entries = place.catalog()
    if not entries:
        return []
    identity = place.identity()
    held = place.held(identity.segment_size) if identity is not None else set()
    return [check_entry(place, entry, identity.system_identifier if identity else None, held)
            for entry in entries]


def check_entry(place: BackupPlace, entry: BackupEntry, system_identifier: str | None,
                held: set[str]) -> BackupCheck:
    """One backup checked (see the module's docstring)."""
    record = entry.record
    if entry.state is EntryState.DAMAGED:
        return BackupCheck(entry.backup_id, "FAILED", entry.describe())
    if record is None:
        return BackupCheck(entry.backup_id, "not a backup", f"{entry.describe()}, not checked")
    if system_identifier is not None and record.system_identifier != system_identifier:
        return BackupCheck(entry.backup_id, "FAILED",
                           f"of database system {record.system_identifier}, the archive's is "
                           f"{system_identifier}")
    try:
        verified = verify_backup(place.files(entry.backup_id), record)
    except (ArchiveError, StoreError) as exc:
        return BackupCheck(entry.backup_id, "FAILED", str(exc))
    missing = [name for name in record.wal_segments() if name not in held]
    wal = (f"WAL {format_lsn(record.start_lsn)} to {format_lsn(record.end_lsn)} on timeline "
           f"{record.end_timeline}")
    if missing:
        return BackupCheck(entry.backup_id, "FAILED",
                           f"its files match the manifest, but the archive lacks WAL segment "
                           f"{missing[0]} of its {wal}")
    return BackupCheck(entry.backup_id, "verified",
                       f"{verified.files} files, {verified.bytes} bytes match the manifest; "
                       f"{wal} in the archive")
