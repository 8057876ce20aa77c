"""What ``cleanup --keep-backups N | --recovery-window D`` removes and keeps, and why (pure).

The backups first: ``--keep-backups N`` keeps the N newest complete backups;
``--recovery-window D`` keeps every backup that ends inside the window and the newest one that
ends before it (recovery to the window's first moment starts there). At least the newest
complete backup is always kept, and no WAL file and no backup with a record is removed from
an archive without one (a backup without a record, which no recovery can start from, goes as
below). A complete backup is one whose files are all there, as its record names them
(:func:`~receivewal.backup.catalog.proven`): one that is not
(:attr:`~receivewal.backup.catalog.EntryState.INCOMPLETE`) is never counted among the kept ones,
and it is kept itself, named with what it lacks. A backup being written, or one whose record
cannot be read, is kept; an interrupted one (no record, no writer) is removed.

Then the WAL, following the timeline history. A segment is judged whatever its form (plain,
compressed, sealed), and a sealed segment's recipients file (``F.recipients``) with it: they go
together, and one left alone (a removal cut short, a seal cut short) goes as its segment would.
For every kept backup that starts at ``S`` on timeline ``T``, and for every timeline ``X``
whose history passes through ``T`` at ``S`` (``X`` is ``T`` or a descendant that forked from it
after ``S``), the WAL from ``S`` on along ``X``'s history stays: the segments of each ancestor
from ``S`` (or where that ancestor began) to where ``X``'s line left it, and ``X``'s own from
where it began. The current timeline's line stays from the oldest kept backup's start. Whatever
the policy, these stay too: every ``.partial``, every history file, every segment of a timeline
whose history file is missing (its line is unknown; when it is the current timeline, no WAL is
removed at all), and every segment from the replication slot's restart position on, and every
segment still waiting for its upload (``stream --upload-to``'s backlog). Everything else, a
segment no kept backup and no timeline needs, is removed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from receivewal.backup.backupdir import is_backup_id
from receivewal.backup.catalog import BackupEntry, EntryState
from receivewal.backup.record import BackupRecord, utc_text
from receivewal.errors import ConfigurationError
from receivewal.wal.lsn import format_lsn, segment_of
from receivewal.wal.names import (
    RECIPIENTS_SUFFIX,
    SegmentFile,
    parse_archive_segment_name,
    parse_encrypted_segment_name,
    parse_history_file_name,
)
from receivewal.wal.timeline import TimelineSwitch

Span = tuple[int, int, int | None]  # timeline, first LSN, LSN where the line left it (None: never)


@dataclass(frozen=True)
class KeepBackups:
    """Keep the ``count`` newest complete backups."""

    count: int


@dataclass(frozen=True)
class RecoveryWindow:
    """Keep what recovery to any moment of the last ``length`` (before ``now``) needs."""

    length: timedelta
    now: datetime


Policy = KeepBackups | RecoveryWindow


@dataclass(frozen=True)
class Verdict:
    """One backup or file: removed or kept, and why."""

    name: str
    remove: bool
    reason: str


@dataclass(frozen=True)
class ArchiveContents:
    """What the planner looks at: the backups, the archive's file names, the parsed history
    files by timeline, the current timeline, the segment size, the slot's restart LSN, the
    upload backlog."""

    entries: Sequence[BackupEntry]
    files: Sequence[str]
    histories: Mapping[int, Sequence[TimelineSwitch]]
    current_timeline: int
    segment_size: int
    slot_restart: int | None = None
    backlog: frozenset[str] = frozenset()  # files waiting for their upload (--upload-to)
    backlog_to: str = ""  # where they go
    slot: str = ""  # the slot's name when its server said where it restarts ("": unasked)


@dataclass(frozen=True)
class RetentionPlan:
    """The verdicts on every backup and every WAL file of the archive."""

    backups: tuple[Verdict, ...]
    files: tuple[Verdict, ...]
    kept: tuple[BackupRecord, ...] = field(default=())

    @property
    def removed_backups(self) -> list[str]:
        """The backups to remove."""
        return [v.name for v in self.backups if v.remove]

    @property
    def removed_files(self) -> list[str]:
        """The WAL files to remove."""
        return [v.name for v in self.files if v.remove]


def plan_retention(contents: ArchiveContents, policy: Policy) -> RetentionPlan:
    """The verdicts (see the module's docstring)."""
    complete = sorted((e.record for e in contents.entries if e.record is not None),
                      key=lambda r: (r.end_lsn, r.end_time), reverse=True)
    kept, verdicts = _judge_backups(complete, policy)
    verdicts += [_judge_unfinished(e) for e in contents.entries if e.record is None]
    verdicts.sort(key=lambda v: v.name)
    files = tuple(_judge_files(contents, kept))
    return RetentionPlan(tuple(verdicts), files, tuple(kept))


def _judge_backups(complete: list[BackupRecord], policy: Policy
                   ) -> tuple[list[BackupRecord], list[Verdict]]:
    if isinstance(policy, KeepBackups):
        if policy.count < 1:
            raise ConfigurationError("--keep-backups must keep at least 1 backup")
        kept = complete[:policy.count]
        why_kept = f"one of the {policy.count} newest complete backups"
        why_removed = f"older than the {policy.count} newest complete backups"
    else:
        if policy.length <= timedelta(0):
            raise ConfigurationError("the recovery window must be longer than 0")
        start = policy.now - policy.length
        inside = [r for r in complete if r.end_time >= start]
        before = [r for r in complete if r.end_time < start]
        kept = inside + before[:1]
        why_kept = f"needed to recover to any time since {utc_text(start)}"
        why_removed = (f"ends before the recovery window (since {utc_text(start)}), and a "
                       "newer backup covers the window's start")
    verdicts = [Verdict(r.backup_id, r not in kept, why_removed if r not in kept else why_kept)
                for r in complete]
    return kept, verdicts


def _judge_unfinished(entry: BackupEntry) -> Verdict:
    if entry.state in (EntryState.INTERRUPTED, EntryState.ABANDONED) \
            and not is_backup_id(entry.backup_id):
        return Verdict(entry.backup_id, False, "not named as receivewal names a backup (an "
                                               "operator's directory?): not removed")
    if entry.state is EntryState.INTERRUPTED:
        return Verdict(entry.backup_id, True, "an interrupted backup (no record, no writer)")
    if entry.state is EntryState.ABANDONED:
        return Verdict(entry.backup_id, True, f"an abandoned backup ({entry.state.value})")
    if entry.state is EntryState.INCOMPLETE:
        return Verdict(entry.backup_id, False, f"not counted as a backup, {entry.describe()}: "
                                               "not removed")
    return Verdict(entry.backup_id, False, f"{entry.describe()}: not removed")


def timeline_line(timeline: int, histories: Mapping[int, Sequence[TimelineSwitch]]
                  ) -> list[Span] | None:
    """The spans of WAL that make up ``timeline``'s line, oldest first; None when its history
    file is missing."""
    if timeline == 1:
        return [(1, 0, None)]
    history = histories.get(timeline)
    if history is None:
        return None
    spans: list[Span] = []
    begin = 0
    for entry in history:
        spans.append((entry.timeline, begin, entry.switchpoint))
        begin = entry.switchpoint
    spans.append((timeline, begin, None))
    return spans


def _from(line: list[Span], start: int) -> list[Span]:
    """The part of ``line`` from LSN ``start`` on."""
    return [(tli, max(begin, start), end) for tli, begin, end in line
            if end is None or end > start]


def _needed(contents: ArchiveContents, kept: list[BackupRecord],
            timelines: set[int]) -> list[tuple[Span, str]]:
    """Every span of WAL that stays, with the reason."""
    needed: list[tuple[Span, str]] = []
    for record in kept:
        for timeline in sorted(timelines | {record.timeline}):
            line = timeline_line(timeline, contents.histories)
            if line is None:
                continue
            spans = _from(line, record.start_lsn)
            if spans and spans[0][0] == record.timeline:
                why = (f"backup {record.backup_id} (from {format_lsn(record.start_lsn)} on "
                       f"timeline {record.timeline}) recovers along timeline {timeline}")
                needed.extend((span, why) for span in spans)
    line = timeline_line(contents.current_timeline, contents.histories)
    oldest = min(record.start_lsn for record in kept)
    if line is not None:
        why = (f"the current timeline {contents.current_timeline}'s line from the oldest kept "
               f"backup's start {format_lsn(oldest)}")
        needed.extend((span, why) for span in _from(line, oldest))
    return needed


def segment_judged(name: str, segment_size: int) -> SegmentFile | None:
    """The segment a file of the archive is judged as: a segment file in any of its forms
    (plain, compressed, sealed, ``.partial``), or a sealed segment's recipients file
    (``F.recipients``: judged as ``F``, so that it goes with it); None for any other name."""
    if name.endswith(RECIPIENTS_SUFFIX):
        return parse_encrypted_segment_name(name.removesuffix(RECIPIENTS_SUFFIX), segment_size)
    return parse_archive_segment_name(name, segment_size)


def _judge_files(contents: ArchiveContents, kept: list[BackupRecord]) -> list[Verdict]:
    size = contents.segment_size
    segments: list[tuple[str, SegmentFile]] = []
    verdicts = []
    for name in sorted(contents.files):
        if parse_history_file_name(name) is not None:
            verdicts.append(Verdict(name, False, "a history file"))
        elif (parsed := segment_judged(name, size)) is not None:
            if parsed.partial:
                verdicts.append(Verdict(name, False, "a .partial"))
            else:
                segments.append((name, parsed))
    timelines = {contents.current_timeline, *contents.histories, *(s.timeline for _, s in segments)}
    if not kept:
        blanket = "no complete backup: nothing is removed"
    elif contents.current_timeline != 1 and contents.current_timeline not in contents.histories:
        blanket = (f"the history file of the current timeline {contents.current_timeline} is "
                   "missing: its line is unknown, nothing is removed")
    else:
        blanket = ""
    needed = _needed(contents, kept, timelines) if not blanket else []
    for name, parsed in segments:
        verdicts.append(Verdict(name, False, blanket) if blanket
                        else _judge_segment(name, parsed, contents, needed, kept))
    return sorted(verdicts, key=lambda v: v.name)


def held_whatever_the_policy(name: str, parsed: SegmentFile, contents: ArchiveContents
                             ) -> Verdict | None:
    """Why the segment file ``name`` stays whatever the policy (its timeline's line unknown,
    its upload still to come, the slot's WAL), or None: ``cleanup``'s rule and the local
    copy's (:mod:`receivewal.retention.localrule`) both begin with it."""
    size = contents.segment_size
    if parsed.timeline != 1 and parsed.timeline not in contents.histories:
        return Verdict(name, False, f"timeline {parsed.timeline} has no history file: what "
                                    "it needs is unknown")
    if name.removesuffix(RECIPIENTS_SUFFIX) in contents.backlog:
        return Verdict(name, False, f"waiting for its upload to {contents.backlog_to}")
    if contents.slot_restart is not None and \
            parsed.segno >= segment_of(contents.slot_restart, size):
        where = format_lsn(contents.slot_restart)
        return Verdict(name, False, f'the replication slot "{contents.slot}" restarts at '
                                    f"{where}, as its server says" if contents.slot else
                                    f"the replication slot restarts at {where}")
    return None


def needed_by(name: str, parsed: SegmentFile, needed: Sequence[tuple[Span, str]],
              segment_size: int) -> Verdict | None:
    """The verdict keeping the segment file ``name`` when a span of ``needed`` holds it."""
    for (tli, begin, end), why in needed:
        if tli == parsed.timeline and segment_of(begin, segment_size) <= parsed.segno and \
                (end is None or parsed.segno <= segment_of(end, segment_size)):
            return Verdict(name, False, why)
    return None


def wal_needed(contents: ArchiveContents, kept: Sequence[BackupRecord]
               ) -> list[tuple[Span, str]]:
    """Every span of WAL the backups ``kept`` (at least one) and the current timeline's line
    from the oldest of them need, with the reason."""
    size = contents.segment_size
    timelines = {contents.current_timeline, *contents.histories}
    timelines |= {parsed.timeline for name in contents.files
                  if (parsed := segment_judged(name, size)) is not None and not parsed.partial}
    return _needed(contents, list(kept), timelines)


def _judge_segment(name: str, parsed: SegmentFile, contents: ArchiveContents,
                   needed: list[tuple[Span, str]], kept: list[BackupRecord]) -> Verdict:
    held = held_whatever_the_policy(name, parsed, contents) or \
        needed_by(name, parsed, needed, contents.segment_size)
    if held is not None:
        return held
    oldest = min(kept, key=lambda r: r.start_lsn)
    return Verdict(name, True, f"needed by no kept backup (the oldest starts at "
                               f"{format_lsn(oldest.start_lsn)} on timeline {oldest.timeline})")
