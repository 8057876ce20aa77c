"""What an archive directory holds, in a few numbers: the bytes of its WAL files and of its
backups, and the oldest recoverable point (files read: the listing, the backups' records).

The interrupted backups (a ``receivewal backup`` killed before its record) are listed with
the disk they use: no recovery starts from them, and ``cleanup`` removes them.

The WAL files are segments in any form (plain, compressed, ``.partial``, sealed: ``F.age``,
``F.zst.age``) and history files; a sealed segment's recipients file (``F.age.recipients``)
is counted in the WAL's bytes, not as a file of its own.

The oldest recoverable point is the start of the oldest complete backup whose WAL from its
start through its end (its manifest's WAL ranges) is all in the archive (a sealed segment is
there as much as a plain one): a recovery from it can reach any point from its end on that
the archive's WAL reaches. ``status`` shows it, and
the daemon's metrics (the WAL receiver measures, the monitor keeps the numbers).

The same view of an archive, a directory or a bucket (:func:`summarize_view`), gives
``receivewal backups`` its list (:func:`listed_backups`: each backup with its state and
whether the archive holds its WAL) and ``status`` its numbers, for the archive directory and,
when the daemon uploads, for the bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from receivewal.archive.location import DirectoryLocation
from receivewal.archive.view import ArchiveView
from receivewal.backup.backupdir import BACKUPS
from receivewal.backup.catalog import BackupEntry, EntryState, catalog_of, tree_bytes
from receivewal.backup.record import BackupRecord
from receivewal.wal.names import (
    ENCRYPTED_SUFFIX,
    PARTIAL_SUFFIX,
    RECIPIENTS_SUFFIX,
    looks_like_segment,
    parse_history_file_name,
    unsealed_name,
)


@dataclass(frozen=True)
class ArchiveSummary:
    """The archive's size and its oldest recoverable point (None: no complete backup whose
    WAL the archive holds)."""

    wal_files: int
    wal_bytes: int  # segments (any at-rest form, .partial too) and history files
    backups: int  # complete backups
    backup_bytes: int  # every file under backups/, complete or not
    oldest: BackupRecord | None
    #: the interrupted backups (no record, no writer): each one's ID and bytes on disk
    interrupted: tuple[tuple[str, int], ...] = ()

    @property
    def interrupted_bytes(self) -> int:
        """The disk the interrupted backups use (in ``backup_bytes`` too)."""
        return sum(size for _, size in self.interrupted)

    @property
    def oldest_lsn(self) -> int | None:
        """The oldest recoverable point's LSN (its backup's start)."""
        return None if self.oldest is None else self.oldest.start_lsn

    @property
    def oldest_time(self) -> datetime | None:
        """The oldest recoverable point's time (its backup's start)."""
        return None if self.oldest is None else self.oldest.start_time


@dataclass(frozen=True)
class ListedBackup:
    """One backup of an archive as ``receivewal backups`` lists it."""

    entry: BackupEntry
    #: whether the archive holds every segment from its start through its end (False when
    #: it has no record, so no WAL is known)
    wal_held: bool

    @property
    def recoverable(self) -> bool:
        """Whether a recovery can start from it: complete and its WAL held."""
        return self.entry.state is EntryState.COMPLETE and self.wal_held


def listed_backups(view: ArchiveView) -> list[ListedBackup]:
    """The backups of the archive ``view`` sees, oldest first (by ID: its start time), each
    with whether the archive holds its WAL; ArchiveError or StoreError when the archive
    cannot be listed."""
    catalog = catalog_of(view)
    held: dict[int, set[str]] = {}
    listed = []
    for entry in catalog:
        record = entry.record
        if record is None:
            listed.append(ListedBackup(entry, wal_held=False))
            continue
        size = record.wal_segment_size
        if size not in held:
            held[size] = view.held(size)
        listed.append(ListedBackup(entry, all(n in held[size] for n in record.wal_segments())))
    return listed


def summarize(archive: Path) -> ArchiveSummary:
    """The summary of the archive directory ``archive``; ArchiveError when it cannot be
    listed."""
    return summarize_view(ArchiveView(str(archive), DirectoryLocation(str(archive))))


def summarize_view(view: ArchiveView) -> ArchiveSummary:
    """The summary of the archive ``view`` sees (a directory or a bucket's prefix);
    ArchiveError or StoreError when it cannot be listed."""
    listing = view.files
    listed = listed_backups(view)
    records = sorted((b.entry.record for b in listed if b.entry.record is not None),
                     key=lambda r: (r.start_lsn, r.start_time))
    recoverable = {b.entry.backup_id for b in listed if b.recoverable}
    interrupted = tuple((b.entry.backup_id, b.entry.bytes or 0) for b in listed
                        if b.entry.interrupted)
    wal = [(name, length) for name, length in listing if wal_file_of(name) is not None]
    files = [name for name, _ in wal if wal_file_of(name) == name]  # not the recipients
    oldest = next((r for r in records if r.backup_id in recoverable), None)
    backup_bytes = (tree_bytes(Path(view.archive) / BACKUPS) if view.location.is_local
                    else sum(size for _, size in view.files_under(BACKUPS)))
    return ArchiveSummary(len(files), sum(length for _, length in wal), len(records),
                          backup_bytes, oldest, interrupted)


def wal_file_of(name: str) -> str | None:
    """The WAL file a file of the archive is, or goes with: ``name`` itself for a segment in
    any form (sealed too) or a history file; the sealed segment's name for its recipients
    file (the older form's ``F.age.recipients``: ``F.age``); None for anything else."""
    stem = name.removesuffix(RECIPIENTS_SUFFIX)
    sealed = stem.endswith(ENCRYPTED_SUFFIX)
    if stem != name and not sealed:
        return None
    inner = unsealed_name(stem)
    if looks_like_segment(inner):
        return None if sealed and inner.endswith(PARTIAL_SUFFIX) else stem
    return stem if not sealed and parse_history_file_name(stem) is not None else None
