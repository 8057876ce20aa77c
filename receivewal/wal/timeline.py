"""Timeline history files (pure): parse them and place LSNs on timelines.

A history file ``NNNNNNNN.history`` lists, one line per ancestor, the parent timeline, the LSN
where the child forked off it, and a free-text reason, tab-separated. Blank lines and lines
starting with ``#`` are comments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from receivewal.errors import ArchiveError, ReceivewalError
from receivewal.wal.lsn import format_lsn, parse_lsn

_TIMELINE_ID = re.compile(r"[0-9]{1,10}")  # ASCII digits, as PostgreSQL's strtoul reads them
MAX_TIMELINE = 0xFFFFFFFF  # TimeLineID is a uint32; 0 is never a timeline


@dataclass(frozen=True, slots=True)
class TimelineSwitch:
    """``timeline`` ended at ``switchpoint``; the next entry (or the file's own) took over."""

    timeline: int
    switchpoint: int


def parse_history(text: str, timeline: int) -> list[TimelineSwitch]:
    """Parse the history file of ``timeline``; entries are oldest first."""
    entries: list[TimelineSwitch] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split(maxsplit=2)
        try:
            parent = _timeline_id(fields[0])
            switchpoint = parse_lsn(fields[1])
        except (ValueError, IndexError, ReceivewalError) as exc:
            raise ArchiveError(f"syntax error in history file of timeline {timeline}, "
                               f"line {number}: {raw[:100]!r}") from exc
        if entries and (parent <= entries[-1].timeline or
                        switchpoint < entries[-1].switchpoint):
            raise ArchiveError(f"invalid data in history file of timeline {timeline}, line "
                               f"{number}: timeline IDs and switch points must increase")
        if parent >= timeline:
            raise ArchiveError(f"invalid data in history file of timeline {timeline}, line "
                               f"{number}: parent timeline {parent} is not older")
        entries.append(TimelineSwitch(parent, switchpoint))
    return entries


def is_timeline_id(value: int) -> bool:
    """Whether ``value`` can be a timeline ID: 1 to 2^32-1 (the one rule every reader of a
    timeline from a file, a name or the server applies)."""
    return 0 < value <= MAX_TIMELINE


def _timeline_id(text: str) -> int:
    """A timeline ID in ASCII digits, 1 to 2^32-1; ValueError otherwise."""
    if not _TIMELINE_ID.fullmatch(text) or not is_timeline_id(int(text)):
        raise ValueError(f"{text[:20]!r} is not a timeline ID")
    return int(text)


def timeline_of(lsn: int, history: list[TimelineSwitch], current: int) -> int:
    """The timeline that the WAL at ``lsn`` belongs to, seen from timeline ``current``."""
    for entry in history:
        if lsn < entry.switchpoint:
            return entry.timeline
    return current


def switchpoint_of(timeline: int, history: list[TimelineSwitch]) -> int | None:
    """Where ``timeline`` ended according to ``history``; None if it is the current one."""
    for entry in history:
        if entry.timeline == timeline:
            return entry.switchpoint
    return None


def check_follows(archive_timeline: int, archive_lsn: int, history: list[TimelineSwitch],
                  server_timeline: int) -> None:
    """Refuse an archive whose position is not on the server's history.

    The archive stands at ``archive_lsn`` on ``archive_timeline``; the server is on
    ``server_timeline`` whose history is ``history``.
    """
    if archive_timeline == server_timeline:
        return
    if archive_timeline > server_timeline:
        raise ArchiveError(f"the archive is on timeline {archive_timeline}, ahead of the "
                           f"server's timeline {server_timeline}")
    end = switchpoint_of(archive_timeline, history)
    if end is None:
        raise ArchiveError(f"the archive is on timeline {archive_timeline}, which is not in "
                           f"the history of the server's timeline {server_timeline}")
    if archive_lsn > end:
        raise ArchiveError(
            f"the archive continues timeline {archive_timeline} at {format_lsn(archive_lsn)}, "
            f"but the server's timeline {server_timeline} forked from it at {format_lsn(end)}"
        )


@dataclass(frozen=True, slots=True)
class TimelineSpan:
    """Where ``timeline`` lies on a server's history: from ``begin`` to ``end`` (None: it is
    the server's current timeline, still written)."""

    timeline: int
    begin: int
    end: int | None


def timeline_spans(history: list[TimelineSwitch], current: int) -> list[TimelineSpan]:
    """The timelines of ``current``'s history (``history``), oldest first, each with the WAL
    it holds on that history: the path a recovery of ``current`` follows."""
    spans = []
    begin = 0
    for entry in history:
        spans.append(TimelineSpan(entry.timeline, begin, entry.switchpoint))
        begin = entry.switchpoint
    spans.append(TimelineSpan(current, begin, None))
    return spans


def ancestors_of(timeline: int, history: list[TimelineSwitch]) -> list[TimelineSwitch]:
    """What the history file of ``timeline`` (on the history ``history``) must list: the
    switches of its ancestors."""
    return [entry for entry in history if entry.timeline < timeline]


def describe_fork(timeline: int, entries: list[TimelineSwitch]) -> str:
    """How ``timeline`` came about by its history ``entries``, in words."""
    if not entries:
        return f"timeline {timeline} has no parent"
    *earlier, parent = entries
    said = f"timeline {timeline} forked from timeline {parent.timeline} at " \
        f"{format_lsn(parent.switchpoint)}"
    if earlier:
        said += " (after " + ", ".join(f"timeline {e.timeline} until {format_lsn(e.switchpoint)}"
                                       for e in earlier) + ")"
    return said
