"""Is the daemon healthy? Judge its state file the way a Nagios-style check reports.

The exit codes ``receivewal status`` gives:

- 0 OK: the daemon runs and heard from the server within ``max_age`` seconds;
- 1 WARNING: as OK, but the daemon found the archive holds an island of older segments before
  a hole (it streams on after the newest run; ``verify`` names the missing segments), or
  (with ``--upload-to``) the oldest file waiting for upload was completed more than
  ``upload_warning`` seconds ago, or the last upload try failed on the way (the store down);
- 2 CRITICAL: the daemon is not running (no process holds the archive's lock, or it recorded
  a stop), or it has had no contact with the server for longer than ``max_age`` seconds; or
  (with ``--upload-to``) the oldest file waiting for upload was completed more than
  ``upload_critical`` seconds ago, or uploads are stopped by an error that waiting does not
  cure (credentials or permissions refused, a different object at a key, no such bucket,
  another cluster's prefix, an identity object that cannot be read): a stop at an object stays
  CRITICAL, naming it, until that object goes up, whatever the later tries say;
- 3 UNKNOWN: there is no state file, or it cannot be read or trusted.

:func:`evaluate` and :func:`describe` are pure; :func:`check` reads the file and probes the
archive's lock. Every line they produce is one line, whatever text the state file carries.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from receivewal.archive.lock import is_locked
from receivewal.daemon.state import State, read_state, state_path
from receivewal.errors import ArchiveError
from receivewal.wal.lsn import format_lsn

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
LABELS = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}


UPLOAD_WARNING = 300.0  # seconds since the oldest pending file was completed
UPLOAD_CRITICAL = 1800.0
_PASSING_UPLOAD_ERRORS = {"StoreError", "DescriptorLimitError", "DiskFullError"}


@dataclass(frozen=True)
class UploadLimits:
    """How old the oldest file waiting for upload may get before status warns, then alarms."""

    warning: float = UPLOAD_WARNING
    critical: float = UPLOAD_CRITICAL


@dataclass(frozen=True)
class Verdict:
    """An exit code and the one-line summary that explains it."""

    code: int
    summary: str


def _verdict(code: int, text: str) -> Verdict:
    return Verdict(code, f"RECEIVEWAL {LABELS[code]} - {one_line(text)}")


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) as one space."""
    return " ".join(text.split())


def _lsn(lsn: int | None) -> str:
    return "-" if lsn is None else format_lsn(lsn)


def _ago(seconds: float) -> str:
    return f"{max(seconds, 0):.0f}s ago"


def evaluate(state: State, now: float, max_age: float, running: bool | None,
             limits: UploadLimits | None = None) -> Verdict:
    """Judge ``state`` at ``now``; ``running`` says whether a process holds the archive's
    lock (None: unknown, e.g. the state was written on another host). The uploads
    (``limits``) can only make an OK verdict worse; what the daemon found wrong with the
    archive (an older island before a hole) is added, and turns OK into WARNING."""
    code, text = _judge(state, now, max_age, running)
    uploads = _judge_uploads(state, now, limits or UploadLimits()) if code == OK else None
    if uploads is not None:
        code, text = uploads[0], f"{uploads[1]}; {text}"
    if state.archive_warning is not None:
        code = WARNING if code == OK else code
        text += f"; archive: {state.archive_warning}"
    return _verdict(code, text)


def _judge_uploads(state: State, now: float, limits: UploadLimits) -> tuple[int, str] | None:
    """WARNING or CRITICAL and why, when the uploads call for it; else None."""
    if state.upload_to is None:
        return None
    error, failing = state.upload_error, state.upload_failing_since is not None
    age = None if state.upload_oldest_pending is None else now - state.upload_oldest_pending
    backlog = (f"upload backlog {state.upload_pending_files} files "
               f"({_size(state.upload_pending_bytes)})"
               + ("" if age is None else f", the oldest completed {_ago(age)}"))
    reason = "" if error is None or not failing else f", {error.kind}: {error.message}"
    stopped = state.upload_stopped
    if stopped is not None:
        return CRITICAL, (f"uploads to {state.upload_to} stopped ({backlog}), "
                          f"{stopped.kind}: {stopped.message}")
    if failing and error is not None and error.kind not in _PASSING_UPLOAD_ERRORS:
        return CRITICAL, f"uploads to {state.upload_to} stopped ({backlog}){reason}"
    if age is not None and age > limits.critical:
        return CRITICAL, f"{backlog} (max {limits.critical:g}s){reason}"
    if (age is not None and age > limits.warning) or failing:
        return WARNING, f"{backlog} (warning at {limits.warning:g}s){reason}"
    return None


def _judge(state: State, now: float, max_age: float, running: bool | None) -> tuple[int, str]:
    """The exit code and summary of ``state`` as the daemon's liveness goes."""
    flushed = "nothing flushed yet" if state.flushed_lsn is None else \
        f"flushed {format_lsn(state.flushed_lsn)}"
    where = (f"timeline {state.timeline if state.timeline is not None else '-'}, "
             f"received {_lsn(state.received_lsn)}, {flushed}")
    if state.phase == "stopped":
        return (
            CRITICAL,
            f"not running: stopped {_ago(now - state.updated_at)}, {where}"
            + _error_suffix(state),
        )
    if running is False:
        return (
            CRITICAL,
            f"not running: no process holds the archive's lock (pid {state.pid} recorded, "
            f"last update {_ago(now - state.updated_at)}), {where}" + _error_suffix(state),
        )
    if state.last_contact is None:
        age = now - state.started_at
        if age > max_age:
            return (
                CRITICAL,
                f"no contact with the server since start {_ago(age)} (max {max_age:g}s)"
                + _error_suffix(state),
            )
        return (OK, f"{state.phase}, no server contact yet (started {_ago(age)})")
    age = now - state.last_contact
    if age > max_age:
        return (
            CRITICAL,
            f"no contact with the server for {age:.0f}s (max {max_age:g}s), {state.phase} "
            f"{where}" + _error_suffix(state),
        )
    return (OK, f"{state.phase} {where}, last contact {_ago(age)}")


def _error_suffix(state: State) -> str:
    error = state.last_error
    return "" if error is None else f", last error {error.kind}: {error.message}"


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _time(seconds: float | None, now: float) -> str:
    if seconds is None:
        return "-"
    stamp = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{stamp} ({_ago(now - seconds)})"


def _ratio(wal: int, wire: int) -> str:
    return f"{wal / wire:.2f}x" if wire else "-"


def describe(state: State, now: float, extra: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The state as ``key: value`` lines for people, ``extra`` lines last. A logical
    receiver's (``state.receiver``) speaks of messages and change files, not WAL and
    segments."""
    logical = state.receiver == "logical"
    carried = "plain" if logical else "WAL"  # a logical stream's messages, headers included
    lines = [
        ("pid", f"{state.pid} on {state.hostname}"),
        ("phase", state.phase),
        ("started", _time(state.started_at, now)),
        ("updated", _time(state.updated_at, now)),
        ("server", state.server or "-"),
        ("system identifier", state.system_identifier or "-"),
        ("timeline", "-" if state.timeline is None else str(state.timeline)),
        ("slot", "-" if state.slot is None else
         f"{state.slot} ({'confirmed' if logical else 'restart_lsn'} "
         f"{_lsn(state.slot_restart_lsn)})"),
        ("received", _lsn(state.received_lsn)),
        ("written", _lsn(state.written_lsn)),
        ("flushed", _lsn(state.flushed_lsn)),
        ("server WAL end", _lsn(state.server_wal_end)),
        ("last contact", _time(state.last_contact, now)),
        ("compression", f"{state.compression or 'none'}: {_size(state.stream_wal_bytes)} "
         f"{carried} in {_size(state.stream_wire_bytes)} on the wire "
         f"({_ratio(state.stream_wal_bytes, state.stream_wire_bytes)}) this connection"),
        ("since start", f"{_size(state.wal_bytes)} {carried} in {_size(state.wire_bytes)} on "
         f"the wire ({_ratio(state.wal_bytes, state.wire_bytes)})"),
        ("files completed" if logical else "segments completed",
         f"{state.segments_completed} (last {state.last_segment or '-'})"),
        ("reconnects", str(state.reconnects)),
    ]
    if not logical or state.archive_warning is not None:
        lines.append(("archive", state.archive_warning or "-"))
    error = state.last_error
    lines.append((
        "last error",
        "-" if error is None else f"{error.kind}: {error.message} ({_ago(now - error.at)})",
    ))
    if state.upload_to is not None:
        lines.extend(_upload_lines(state, now))
    if state.local_rule is not None:
        lines.extend(_local_lines(state, now))
    lines.extend(extra)
    return aligned(lines)


def aligned(lines: Sequence[tuple[str, str]]) -> list[str]:
    """``key: value`` lines, the values aligned."""
    width = max(len(key) for key, _ in lines)
    return [f"{key + ':':<{width + 1}} {one_line(value)}" for key, value in lines]


def _upload_lines(state: State, now: float) -> list[tuple[str, str]]:
    oldest = state.upload_oldest_pending
    error = state.upload_error
    failing = "" if state.upload_failing_since is None else \
        f", failing since {_time(state.upload_failing_since, now)}"
    return [
        ("upload to", state.upload_to or "-"),
        ("upload backlog", f"{state.upload_pending_files} files, "
         f"{_size(state.upload_pending_bytes)}, oldest completed "
         f"{'-' if oldest is None else _ago(now - oldest)}"),
        ("uploaded", f"{state.uploaded_files} files since start (last "
         f"{state.last_uploaded or '-'})"),
        ("last upload error", "-" if error is None else
         f"{error.kind}: {error.message} ({_ago(now - error.at)}){failing}"),
        ("uploads stopped", "-" if state.upload_stopped is None else
         f"{state.upload_stopped.kind}: {state.upload_stopped.message} "
         f"(since {_ago(now - state.upload_stopped.at)})"),
    ]


def _local_lines(state: State, now: float) -> list[tuple[str, str]]:
    error = state.local_error
    removed_at = state.local_last_removed_at
    return [
        ("local copy keeps", f"{state.local_rule}, and what is not uploaded, what the slot "
         "or a backup needs, the newest segment"),
        ("held locally", f"{state.local_files} files, {_size(state.local_bytes)} "
         f"({state.local_window_files} segments for the window alone)"),
        ("removed locally", f"{state.local_removed_files} files, "
         f"{_size(state.local_removed_bytes)} since start; last "
         f"{state.local_last_removed or '-'}"
         f"{'' if removed_at is None else f' ({_ago(now - removed_at)})'}"),
        ("local rule error", "-" if error is None else
         f"{error.kind}: {error.message} ({_ago(now - error.at)})"),
    ]


def check(directory: Path, max_age: float, now: float, limits: UploadLimits | None = None,
          ) -> tuple[Verdict, State | None]:
    """Read the state in ``directory`` and judge it (reads the file and probes the lock: a
    pid may have been reused, the lock is held only by a living writer)."""
    try:
        state = read_state(directory)
    except ArchiveError as exc:
        return _verdict(UNKNOWN, f"cannot read state: {exc}"), None
    if state is None:
        return _verdict(
            UNKNOWN, f"no state file {state_path(directory)}: the daemon never ran here"
        ), None
    running = is_locked(directory) if state.hostname == socket.gethostname() else None
    return evaluate(state, now, max_age, running, limits), state
