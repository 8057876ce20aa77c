"""How far a recovery from an archive can replay: the last transaction it reaches.

PostgreSQL stops at a ``recovery_target_time`` only at a commit or abort record whose time is
after the target (``recovery_target_inclusive`` on); a target after the last such record the
archive holds is never reached, and the server ends with FATAL "recovery ended before
configured recovery target was reached" once the archive's WAL is replayed.

The WAL a recovery of a backup replays is the archive's complete segments (restore_command
serves no ``.partial``) from the backup's end on, along the target timeline's history, as
PostgreSQL's XLogFileReadAnyTLI looks for each segment: the newest timeline of the history that
has begun by that segment first, never a timeline older than the last file's, up to the first
segment the archive lacks. A segment asked for and missing while the archive holds later WAL of
its timeline is a hole (:func:`chain_hole`): ``receivewal restore`` answers it 126 and recovery
stops there, so ``recover`` refuses it before writing anything. :func:`last_transaction` reads
those segments from the last one back (almost always the last alone) and returns the last commit
or abort record's time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from receivewal.archive.compression import read_wal_file
from receivewal.archive.sealed import DecryptingOpener, sealed_cap
from receivewal.archive.sources import ArchiveSource
from receivewal.backup.record import BackupRecord
from receivewal.check.walclock import record_time
from receivewal.wal.leannames import next_held_after
from receivewal.wal.lsn import segment_of
from receivewal.wal.names import (
    parse_encrypted_segment_name,
    parse_segment_file_name,
    unsealed_name,
    wal_file_name,
)
from receivewal.wal.reader import SegmentScanner
from receivewal.wal.records import main_data_of
from receivewal.wal.rmgr import RM_XACT_ID
from receivewal.wal.timeline import TimelineSwitch

_XACT = frozenset((RM_XACT_ID,))


@dataclass(frozen=True)
class LastTransaction:
    """The last commit or abort record a recovery replays: its time, LSN and segment."""

    time: datetime
    lsn: int
    segment: str


def replayed_segments(record: BackupRecord, timeline: int,
                      histories: Mapping[int, Sequence[TimelineSwitch]],
                      held: Callable[[str], bool]) -> list[str]:
    """The segments a recovery of ``record`` to ``timeline`` replays, from the one its
    backup starts in to the last before the first the archive lacks (the module's rule)."""
    return [name for name, found in _asked(record, timeline, histories, held) if found]


def chain_hole(record: BackupRecord, timeline: int,
               histories: Mapping[int, Sequence[TimelineSwitch]], held: Callable[[str], bool],
               names: Iterable[str]) -> tuple[str, str] | None:
    """The first segment a recovery of ``record`` to ``timeline`` asks for and the archive
    lacks while its file names ``names`` hold later WAL of that segment's timeline, and the
    next segment held (the rule of :func:`~receivewal.wal.leannames.next_held_after`, which
    the restore calls apply); None when the chain from the backup to the end has no hole."""
    listed = list(names)
    for name, found in _asked(record, timeline, histories, held):
        later = None if found else next_held_after(name, listed)
        if later is not None:
            return name, later
    return None


def _asked(record: BackupRecord, timeline: int,
           histories: Mapping[int, Sequence[TimelineSwitch]],
           held: Callable[[str], bool]) -> Iterator[tuple[str, bool]]:
    """Each segment name a recovery of ``record`` to ``timeline`` asks for, in order, and
    whether the archive holds it, up to the first segment none of whose names it holds."""
    size = record.wal_segment_size
    switches = list(histories.get(timeline, ()))
    begins = [0, *(e.switchpoint for e in switches)]
    line = [(e.timeline, b) for e, b in zip(switches, begins, strict=False)]  # oldest first
    line.append((timeline, begins[-1]))
    segno, current = segment_of(record.start_lsn, size), record.timeline
    while True:
        found = None
        for tli, begin in reversed(line):
            if tli < current:
                break
            if segment_of(begin, size) > segno:
                continue
            name = wal_file_name(tli, segno, size)
            present = held(name)
            yield name, present
            if present:
                found = tli
                break
        if found is None:
            return
        current = found
        segno += 1


def last_transaction(source: ArchiveSource, segments: Sequence[str], segment_size: int,
                     identity: str | None) -> LastTransaction | None:
    """The last commit or abort record in ``segments`` (read from the last back; sealed ones
    with the age identity file ``identity``); None when they hold none. ArchiveError when a
    segment cannot be read (NoIdentity when it is sealed and ``identity`` is None)."""
    by_wal_name: dict[str, str] = {}
    for name in source.names:
        parsed = parse_segment_file_name(name, segment_size) \
            or parse_encrypted_segment_name(name, segment_size)
        if parsed is not None and not parsed.partial:
            by_wal_name.setdefault(parsed.wal_name(segment_size), name)
    opener = DecryptingOpener(source.open_binary, identity, sealed_cap(segment_size))
    for wal_name in reversed(segments):
        file = by_wal_name.get(wal_name)
        if file is None:
            continue
        parsed = parse_segment_file_name(unsealed_name(file), segment_size)
        assert parsed is not None
        data = read_wal_file(source.path(file), parsed.compression, open_binary=opener,
                             cap=segment_size)
        start = parsed.start_lsn(segment_size)
        scanner = SegmentScanner(data, file, start_lsn=start, segment_size=segment_size,
                                 timeline=parsed.timeline, segno=parsed.segno,
                                 collect_lsns=True)
        scanner.scan()
        scan = scanner.result()
        last: tuple[int, float] | None = None
        for lsn, rmid, info, main in main_data_of(data, start, scan.record_lsns, _XACT):
            when = record_time(rmid, info, main)
            if when is not None:
                last = (lsn, when)
        if last is not None:
            return LastTransaction(datetime.fromtimestamp(last[1], UTC), last[0], wal_name)
    return None
