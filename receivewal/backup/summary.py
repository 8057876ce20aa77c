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
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from receivewal.archive.location import list_directory
from receivewal.backup.catalog import read_catalog, tree_bytes
from receivewal.backup.directory import BACKUPS
from receivewal.backup.record import BackupRecord
from receivewal.wal.names import (
    ENCRYPTED_SUFFIX,
    PARTIAL_SUFFIX,
    RECIPIENTS_SUFFIX,
    looks_like_segment,
    parse_archive_segment_name,
    parse_history_file_name,
    wal_file_name,
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


def summarize(archive: Path) -> ArchiveSummary:
    """The summary of the archive directory ``archive``; ArchiveError when it cannot be
    listed."""
    listing = list_directory(archive)
    catalog = read_catalog(archive)
    records = sorted((e.record for e in catalog if e.record is not None),
                     key=lambda r: (r.start_lsn, r.start_time))
    interrupted = tuple((e.backup_id, e.bytes or 0) for e in catalog if e.interrupted)
    wal = [(name, length) for name, length in listing if wal_file_of(name) is not None]
    files = [name for name, _ in wal if wal_file_of(name) == name]  # not the recipients
    present: set[str] = set()
    if records:
        size = records[0].wal_segment_size
        for name in files:
            parsed = parse_archive_segment_name(name, size)
            if parsed is not None and not parsed.partial:
                present.add(wal_file_name(parsed.timeline, parsed.segno, size))
    oldest = next((r for r in records if all(n in present for n in r.wal_segments())), None)
    return ArchiveSummary(len(files), sum(length for _, length in wal), len(records),
                          tree_bytes(archive / BACKUPS), oldest, interrupted)


def wal_file_of(name: str) -> str | None:
    """The WAL file a file of the archive is, or goes with: ``name`` itself for a segment in
    any form (sealed too) or a history file; the sealed segment's name for its recipients
    file (``F.age.recipients``: ``F.age``); None for anything else."""
    stem = name.removesuffix(RECIPIENTS_SUFFIX)
    sealed = stem.endswith(ENCRYPTED_SUFFIX)
    if stem != name and not sealed:
        return None
    inner = stem.removesuffix(ENCRYPTED_SUFFIX)
    if looks_like_segment(inner):
        return None if sealed and inner.endswith(PARTIAL_SUFFIX) else stem
    return stem if not sealed and parse_history_file_name(stem) is not None else None
