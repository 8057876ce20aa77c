"""Which backup a recovery starts from (pure).

The rule, for a recovery to timeline ``L`` (``recovery_target_timeline``; by default the
newest timeline the archive knows):

* a backup is a candidate when it is complete, of the archive's system, on ``L``'s history
  (its timeline is ``L``, or an ancestor that ``L`` left at or after the backup's end) and the
  archive holds every WAL segment from its start to its end;
* a **time** target needs a backup whose end is at or before the target time (the record's end
  time: the client's clock when the server reported the end, which errs on the safe side), an
  **LSN** target one whose end LSN is at or before the target; PostgreSQL refuses a target
  before the backup's consistent point ("requested recovery stop point is before consistent
  recovery point");
* an **xid** or a restore point **name** cannot be placed in the WAL from the records (that
  would mean reading the WAL for the commit or the restore point), so, as pgBackRest does,
  the newest candidate is taken: right whenever the target comes after that backup's end.
  When PostgreSQL then reports that recovery ended before the target was reached (the target
  lies inside or before the backup), name an older backup by its ID;
* **latest** (no target) and **immediate** take the newest candidate.

The newest is the one with the highest end LSN (LSNs grow along a timeline's history).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum

from receivewal.backup.record import BackupRecord, utc_text
from receivewal.errors import ArchiveError, ConfigurationError
from receivewal.wal.lsn import format_lsn, parse_lsn
from receivewal.wal.timeline import TimelineSwitch, switchpoint_of


class TargetKind(Enum):
    """The recovery targets of PostgreSQL (``recovery_target_*``), and none (latest)."""

    LATEST = "latest"
    IMMEDIATE = "immediate"
    TIME = "time"
    LSN = "lsn"
    XID = "xid"
    NAME = "name"


@dataclass(frozen=True)
class RecoveryTarget:
    """Where recovery stops; only the field of its kind is set."""

    kind: TargetKind = TargetKind.LATEST
    time: datetime | None = None
    lsn: int | None = None
    xid: int | None = None
    name: str | None = None
    timeline: int | None = None  # recovery_target_timeline; None: the latest

    def describe(self) -> str:
        """The target in words."""
        if self.time is not None:
            return f"time {utc_text(self.time)}"
        if self.lsn is not None:
            return f"LSN {format_lsn(self.lsn)}"
        if self.xid is not None:
            return f"transaction {self.xid}"
        if self.name is not None:
            return f'restore point "{self.name}"'
        return self.kind.value


def time_target(text: str) -> RecoveryTarget:
    """A time target from ISO 8601 text with its time zone (``2024-05-01 12:00:00+02``)."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigurationError(f"invalid target time {text!r}: give an ISO 8601 time such "
                                 "as 2024-05-01 12:00:00+00") from None
    if moment.tzinfo is None:
        raise ConfigurationError(f"target time {text!r} has no time zone (add +00 for UTC)")
    return RecoveryTarget(TargetKind.TIME, time=moment)


def lsn_target(text: str) -> RecoveryTarget:
    """An LSN target (``0/16B3748``)."""
    return RecoveryTarget(TargetKind.LSN, lsn=parse_lsn(text))


def xid_target(text: str) -> RecoveryTarget:
    """A transaction ID target (a 32-bit xid, or one with its epoch as 64 bits)."""
    if not text.isdigit() or not 3 <= int(text) < 1 << 64:
        raise ConfigurationError(f"invalid target transaction ID {text!r}")
    return RecoveryTarget(TargetKind.XID, xid=int(text))


def name_target(text: str) -> RecoveryTarget:
    """A restore point target (the name given to pg_create_restore_point)."""
    if not text or len(text.encode()) >= 64 or "\0" in text:
        raise ConfigurationError(f"invalid restore point name {text!r}")
    return RecoveryTarget(TargetKind.NAME, name=text)


@dataclass(frozen=True)
class Choice:
    """The chosen backup, and why each other one was passed over."""

    record: BackupRecord
    passed_over: list[tuple[str, str]] = field(default_factory=list)


def on_history(record: BackupRecord, timeline: int,
               histories: Mapping[int, Sequence[TimelineSwitch]]) -> str | None:
    """Why a recovery to ``timeline`` cannot start from ``record``; None when it can."""
    if record.end_timeline == timeline:
        return None
    history = histories.get(timeline)
    if history is None:
        return (f"on timeline {record.end_timeline}, and the archive has no history file of "
                f"timeline {timeline}")
    switch = switchpoint_of(record.end_timeline, list(history))
    if switch is None:
        return f"on timeline {record.end_timeline}, which is not in timeline {timeline}'s history"
    if record.end_lsn > switch:
        return (f"ends at {format_lsn(record.end_lsn)} on timeline {record.end_timeline}, "
                f"after timeline {timeline} left it at {format_lsn(switch)}")
    return None


def unusable(record: BackupRecord, target: RecoveryTarget, timeline: int,
             histories: Mapping[int, Sequence[TimelineSwitch]],
             has_wal: Callable[[str], bool] | None = None) -> str | None:
    """Why a recovery to ``target`` on ``timeline`` cannot start from ``record``; None when
    it can (the rule of the module's docstring)."""
    if target.time is not None and record.end_time > target.time:
        return f"ends at {utc_text(record.end_time)}, after the target time"
    if target.lsn is not None and record.end_lsn > target.lsn:
        return f"ends at {format_lsn(record.end_lsn)}, after the target LSN"
    problem = on_history(record, timeline, histories)
    if problem is None and has_wal is not None:
        missing = [name for name in record.wal_segments() if not has_wal(name)]
        if missing:
            problem = (f"the archive lacks {len(missing)} of the WAL segments it needs "
                       f"(the first is {missing[0]})")
    return problem


def choose_backup(records: Sequence[BackupRecord], target: RecoveryTarget, timeline: int,
                  histories: Mapping[int, Sequence[TimelineSwitch]], *,
                  system_identifier: str | None = None,
                  has_wal: Callable[[str], bool] | None = None) -> Choice:
    """The newest backup a recovery to ``target`` on ``timeline`` can start from;
    ArchiveError saying why each backup was passed over when none can."""
    passed: list[tuple[str, str]] = []
    candidates = []
    for record in sorted(records, key=lambda r: (r.end_lsn, r.end_time), reverse=True):
        if system_identifier is not None and record.system_identifier != system_identifier:
            problem: str | None = f"of database system {record.system_identifier}"
        else:
            problem = unusable(record, target, timeline, histories, has_wal)
        if problem is None:
            candidates.append(record)
        else:
            passed.append((record.backup_id, problem))
    if not candidates:
        why = "; ".join(f"{backup_id} {problem}" for backup_id, problem in passed[:5])
        raise ArchiveError(f"no backup to recover to {target.describe()} on timeline "
                           f"{timeline} from" + (f": {why}" if why else ": the archive holds "
                                                 "no complete backup"))
    return Choice(candidates[0], passed)
