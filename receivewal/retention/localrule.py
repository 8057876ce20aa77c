"""The local copy's rule (``stream --upload-to URL --keep-local 24h | 10GB``): what the archive
directory of a daemon that uploads keeps, and what it may remove once the bucket holds it.

With ``--upload-to`` the bucket is the archive; the directory is where WAL lands first. The
rule is retention's (:mod:`receivewal.retention.plan`), read the same way
(:func:`~receivewal.retention.removal.read_archive`: the backups, the history files, the current
timeline, the slot, the upload backlog), and keeps, whatever the window:

- every file that is not a segment: the identity record, the state and upload records, every
  history file, every ``.partial``, the backups (``cleanup``'s to expire);
- what retention keeps whatever the policy
  (:func:`~receivewal.retention.plan.held_whatever_the_policy`): every segment the upload
  record does not cover (the bucket does not hold it, as the uploader confirmed it), every
  segment of a timeline whose history file is missing, the slot's WAL;
- the WAL every complete backup in the directory needs (all of them: the rule expires no
  backup), and everything while a backup is being written into the directory;
- the newest segment (the next start resumes after it);
- and the window: the segments completed within the last ``24h``, or the newest ones within
  ``10GB``.

Every other segment (and its recipients file) is removed. :func:`plan_local` is pure;
:func:`apply_local_rule` reads the directory, plans and removes durably.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from receivewal.archive.keeplocal import KeepLocal, inside_window
from receivewal.archive.location import DirectoryLocation
from receivewal.archive.view import ArchiveView
from receivewal.backup.catalog import EntryState
from receivewal.errors import ArchiveError
from receivewal.retention.plan import (
    ArchiveContents,
    Verdict,
    held_whatever_the_policy,
    needed_by,
    segment_judged,
    wal_needed,
)
from receivewal.retention.removal import Holds, read_archive, remove_files
from receivewal.wal.names import SegmentFile

# a backup in these states may be one being written (its WAL is not known yet): nothing goes
_WRITING = (EntryState.RUNNING, EntryState.UNKNOWN, EntryState.EMPTY)


@dataclass(frozen=True)
class LocalFile:
    """An archive file as the rule weighs it: its size and when it was completed (mtime)."""

    size: int
    completed_at: float


@dataclass(frozen=True)
class LocalPlan:
    """The verdicts on the directory's segment files, and the window's share of them."""

    files: tuple[Verdict, ...]
    held_bytes: int  # every file of the directory's top (segments, partials, histories ...)
    held_files: int
    window_files: int  # segment files kept for the window alone

    @property
    def removed_files(self) -> list[str]:
        """The files to remove, oldest first."""
        return [v.name for v in self.files if v.remove]


def plan_local(contents: ArchiveContents, rule: KeepLocal, files: Mapping[str, LocalFile],
               now: float) -> LocalPlan:
    """The local rule's verdicts (see the module's docstring) on the segment files of
    ``contents``, weighed by ``files``, at ``now`` (seconds since the epoch)."""
    size = contents.segment_size
    segments = sorted(((name, parsed) for name in contents.files
                       if (parsed := segment_judged(name, size)) is not None
                       and not parsed.partial),
                      key=lambda item: (item[1].timeline, item[1].segno))
    blanket = _blanket(contents)
    records = [e.record for e in contents.entries if e.record is not None]
    needed = wal_needed(contents, records) if records and not blanket else []
    newest = max(((s.timeline, s.segno) for _, s in segments), default=None)
    window = _window(segments, rule, files, now)
    verdicts = []
    in_window = 0
    for name, parsed in segments:
        held = Verdict(name, False, blanket) if blanket else \
            held_whatever_the_policy(name, parsed, contents) or \
            needed_by(name, parsed, needed, size)
        if held is None and (parsed.timeline, parsed.segno) == newest:
            held = Verdict(name, False, "the newest segment: the next start resumes after it")
        if held is None and (parsed.timeline, parsed.segno) in window:
            held = Verdict(name, False, f"within the local copy's {rule.describe()}")
            in_window += 1
        verdicts.append(held or Verdict(
            name, True, f"uploaded to {contents.backlog_to}, older than the local copy's "
                        f"{rule.describe()}"))
    removed = {v.name for v in verdicts if v.remove}
    kept = {name: f for name, f in files.items() if name not in removed}
    return LocalPlan(tuple(verdicts), sum(f.size for f in kept.values()), len(kept), in_window)


def _blanket(contents: ArchiveContents) -> str:
    """Why nothing at all is removed now ("": the rule applies)."""
    if not contents.backlog_to:
        return "no upload destination: the directory is the archive"
    writing = [e.backup_id for e in contents.entries if e.state in _WRITING]
    if writing:
        return f"backup {writing[0]} is being written into the directory"
    if contents.current_timeline != 1 and contents.current_timeline not in contents.histories:
        return (f"the history file of the current timeline {contents.current_timeline} is "
                "missing: its line is unknown")
    return ""


def _window(segments: list[tuple[str, SegmentFile]], rule: KeepLocal,
            files: Mapping[str, LocalFile], now: float) -> set[tuple[int, int]]:
    """The segments (timeline, segment number) inside the rule's window, each weighed with
    its recipients file."""
    weighed: dict[tuple[int, int], tuple[int, float]] = {}
    for name, parsed in segments:
        key = (parsed.timeline, parsed.segno)
        found = files.get(name, LocalFile(0, now))
        size, done = weighed.get(key, (0, 0.0))
        weighed[key] = (size + found.size, max(done, found.completed_at))
    return inside_window(rule, weighed, now)


@dataclass(frozen=True)
class LocalReport:
    """One application of the rule: its plan and the files it removed, with their bytes."""

    plan: LocalPlan
    removed: tuple[str, ...]
    removed_bytes: int


def read_local_files(directory: Path) -> dict[str, LocalFile]:
    """Size and modification time of each file at the top of ``directory`` (its entries
    removed meanwhile are left out)."""
    found = {}
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if entry.is_file(follow_symlinks=False):
                    found[entry.name] = LocalFile(info.st_size, info.st_mtime)
    except OSError as exc:
        raise ArchiveError(f'cannot list "{directory}": {exc.strerror or exc}') from exc
    return found


def apply_local_rule(directory: Path, rule: KeepLocal, holds: Holds, now: float, *,
                     sync: bool = True) -> LocalReport:
    """Read the archive directory ``directory`` of a daemon uploading to
    ``holds.upload_to``, plan the local rule ``rule`` and remove what it removes (durably).
    Raises ArchiveError (a file that cannot be read or removed)."""
    view = ArchiveView(str(directory), DirectoryLocation(directory))
    files = read_local_files(directory)
    plan = plan_local(read_archive(view, holds), rule, files, now)
    removed = remove_files(directory, plan.removed_files, sync=sync)
    return LocalReport(plan, tuple(removed), sum(files[name].size for name in removed
                                                 if name in files))
