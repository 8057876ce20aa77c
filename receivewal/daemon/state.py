"""The daemon's state file, ``.receivewal-state.json`` in the archive directory.

The running daemon rewrites it atomically (temporary file, fsync, rename, fsync of the
directory) so that ``receivewal status`` and monitoring scripts can read where streaming
stands without talking to the daemon. It is a dotfile on purpose: Barman moves unknown
non-dot files out of its streaming directory.

Encoding and decoding are pure (:func:`encode_state`, :func:`decode_state`); LSNs are stored
as PostgreSQL prints them (``0/5000000``), times as ISO 8601 in UTC.
"""

from __future__ import annotations

import json
import typing
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from receivewal.archive.durable import write_file_durably
from receivewal.archive.reading import read_small_file
from receivewal.errors import ArchiveError, ReceivewalError
from receivewal.logs import get_logger
from receivewal.wal.lsn import format_lsn, parse_lsn
from receivewal.wal.timeline import is_timeline_id

STATE_FILE = ".receivewal-state.json"
FORMAT_VERSION = 1

_LSN_FIELDS = ("received_lsn", "written_lsn", "flushed_lsn", "server_wal_end", "slot_restart_lsn")
_TIME_FIELDS = ("started_at", "updated_at", "last_contact", "upload_oldest_pending",
                "upload_failing_since", "local_last_removed_at")
_ERROR_FIELDS = ("last_error", "upload_error", "upload_stopped", "local_error")
RECEIVERS = ("wal", "logical")  # who wrote the state: stream (WAL), logical (a change log)
_MAX_PID = (1 << 31) - 1  # pid_t
_MAX_COUNT = 1 << 63


@dataclass(frozen=True)
class LastError:
    """The most recent error the daemon saw."""

    kind: str
    message: str
    at: float


@dataclass(frozen=True)
class UploadStatus:
    """What ``status`` and the metrics show of the uploads."""

    destination: str
    pending_files: int = 0
    pending_bytes: int = 0
    oldest_pending: float | None = None  # completion time of the oldest pending file
    uploaded_files: int = 0  # since the daemon started
    uploaded_bytes: int = 0
    last_uploaded: str | None = None
    uploaded_end: int | None = None  # LSN: end of the last segment confirmed uploaded
    last_error: LastError | None = None
    failing_since: float | None = None  # None: the last try succeeded
    # the error that stops the uploads at one object (a different object at its key, a refused
    # request, an identity object that names another cluster or cannot be read), kept until
    # that object goes up whatever the later tries say; and that object's URL
    stopped: LastError | None = None
    stopped_object: str | None = None

    def state_fields(self) -> dict[str, Any]:
        """The State fields that show this status (the state file, ``status``)."""
        return {
            "upload_to": self.destination,
            "upload_pending_files": self.pending_files,
            "upload_pending_bytes": self.pending_bytes,
            "upload_oldest_pending": self.oldest_pending,
            "uploaded_files": self.uploaded_files,
            "last_uploaded": self.last_uploaded,
            "upload_error": self.last_error,
            "upload_failing_since": self.failing_since,
            "upload_stopped": self.stopped,
        }


@dataclass(frozen=True)
class LocalCopyStatus:
    """What ``status`` and the metrics show of the local copy's rule (--keep-local)."""

    rule: str  # the window, in words
    held_files: int = 0  # the directory's files, as the rule last left them
    held_bytes: int = 0
    window_files: int = 0  # segment files kept for the window alone
    removed_files: int = 0  # since the daemon started
    removed_bytes: int = 0
    last_removed: str | None = None  # the files the last removal took, in words
    last_removed_at: float | None = None
    last_error: LastError | None = None  # the last application that failed (None: none since)

    def state_fields(self) -> dict[str, Any]:
        """The State fields that show this status (the state file, ``status``)."""
        return {
            "local_rule": self.rule,
            "local_files": self.held_files,
            "local_bytes": self.held_bytes,
            "local_window_files": self.window_files,
            "local_removed_files": self.removed_files,
            "local_removed_bytes": self.removed_bytes,
            "local_last_removed": self.last_removed,
            "local_last_removed_at": self.last_removed_at,
            "local_error": self.last_error,
        }


@dataclass(frozen=True)
class State:
    """A snapshot of the daemon. Times are seconds since the epoch; LSNs are integers."""

    pid: int
    hostname: str
    started_at: float
    updated_at: float
    receiver: str = "wal"  # one of RECEIVERS; the file leaves it out for "wal", as before it
    phase: str = "starting"  # starting, waiting, streaming, reconnecting, stopping, stopped
    server: str | None = None
    system_identifier: str | None = None
    timeline: int | None = None
    slot: str | None = None
    slot_restart_lsn: int | None = None  # read at connect, then the flush we last reported
    received_lsn: int | None = None
    written_lsn: int | None = None
    flushed_lsn: int | None = None
    server_wal_end: int | None = None  # IDENTIFY_SYSTEM's, then XLogData's walEnd
    last_contact: float | None = None
    compression: str | None = None  # the current stream's: zstd, lz4, none; None: no WAL yet
    stream_wire_bytes: int = 0  # bytes on the wire / of WAL on the current connection
    stream_wal_bytes: int = 0
    wire_bytes: int = 0  # the same since the daemon started
    wal_bytes: int = 0
    segments_completed: int = 0
    last_segment: str | None = None
    reconnects: int = 0
    last_error: LastError | None = field(default=None)
    archive_warning: str | None = None  # found at start-up: an older island before a hole
    # --upload-to: where, the backlog (files, bytes, completion time of the oldest), what went
    # up since start, and the last failed try (upload_failing_since: None once a try succeeds);
    # upload_stopped: the error that stops the uploads at one object, until that object goes up
    upload_to: str | None = None
    upload_pending_files: int = 0
    upload_pending_bytes: int = 0
    upload_oldest_pending: float | None = None
    uploaded_files: int = 0
    last_uploaded: str | None = None
    upload_error: LastError | None = None
    upload_failing_since: float | None = None
    upload_stopped: LastError | None = None
    # --keep-local: the local copy's rule in words (None: every file is kept), the files and
    # bytes it left in the directory, what it removed since start and last, its last failure
    local_rule: str | None = None
    local_files: int = 0
    local_bytes: int = 0
    local_window_files: int = 0
    local_removed_files: int = 0
    local_removed_bytes: int = 0
    local_last_removed: str | None = None
    local_last_removed_at: float | None = None
    local_error: LastError | None = None


def state_path(directory: Path) -> Path:
    """Where the state file of the archive in ``directory`` lives."""
    return directory / STATE_FILE


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


def _epoch(text: str) -> float:
    """Seconds since the epoch of an ISO 8601 time that can be printed back in UTC (ValueError
    for one that cannot, e.g. 9999-12-31T23:59:59-12:00, which is in year 10000 in UTC)."""
    value = datetime.fromisoformat(text)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    seconds = value.timestamp()
    try:
        datetime.fromtimestamp(seconds, UTC)
    except (ValueError, OverflowError, OSError) as exc:
        raise ValueError(f"time {text[:40]!r} is out of range") from exc
    return seconds


def state_to_dict(state: State) -> dict[str, Any]:
    """The JSON-ready form of ``state`` (LSNs as ``X/X``, times as ISO 8601 UTC)."""
    data = asdict(state)
    if data["receiver"] == "wal":  # stream's state file as it always was
        del data["receiver"]
    for key in _LSN_FIELDS:
        if data[key] is not None:
            data[key] = format_lsn(data[key])
    for key in _TIME_FIELDS:
        if data[key] is not None:
            data[key] = _iso(data[key])
    for key in _ERROR_FIELDS:
        if data[key] is not None:
            data[key]["at"] = _iso(data[key]["at"])
    return {"version": FORMAT_VERSION, **data}


def encode_state(state: State) -> bytes:
    """The bytes of the state file."""
    return (json.dumps(state_to_dict(state), indent=2) + "\n").encode()


def decode_state(data: bytes) -> State:
    """Parse a state file; raise ArchiveError saying what is wrong with it."""
    try:
        return _state_from_json(json.loads(data))
    except (ValueError, TypeError, KeyError, AttributeError, ReceivewalError) as exc:
        # JSONDecodeError and UnicodeDecodeError are ValueErrors, a missing or unknown key in
        # State(**raw) is a TypeError, and parse_lsn raises the project's ConfigurationError.
        raise ArchiveError(f"invalid state file: {exc}") from exc
    except RecursionError:  # json nested deeper than the interpreter's stack
        raise ArchiveError("invalid state file: JSON nested too deeply") from None


def _state_from_json(raw: Any) -> State:
    if not isinstance(raw, dict):
        raise TypeError("not a JSON object")
    version = raw.pop("version", None)
    if version != FORMAT_VERSION:
        raise ValueError(f"unsupported format version {version!r}")
    for key in _LSN_FIELDS:
        if raw.get(key) is not None:
            raw[key] = parse_lsn(raw[key])
    for key in _TIME_FIELDS:
        if raw.get(key) is not None:
            raw[key] = _epoch(raw[key])
    for key in _ERROR_FIELDS:
        error = raw.get(key)
        if error is not None:
            raw[key] = LastError(kind=str(error["kind"]), message=str(error["message"]),
                                 at=_epoch(error["at"]))
    state = State(**raw)
    _check_values(state)
    return state


_KINDS = {int: "an integer", float: "a time", str: "a string", LastError: "an object",
          type(None): "null"}


def _check_values(state: State) -> None:
    """TypeError or ValueError unless every field has its declared type and a possible value."""
    hints = typing.get_type_hints(State)
    for item in fields(State):
        value = getattr(state, item.name)
        allowed = typing.get_args(hints[item.name]) or (hints[item.name],)
        if isinstance(value, bool) or not isinstance(value, allowed):
            kinds = " or ".join(_KINDS[kind] for kind in allowed)
            raise TypeError(f"{item.name} must be {kinds}, not {repr(value)[:40]}")
        if isinstance(value, int) and not 0 <= value < _MAX_COUNT:
            raise ValueError(f"{item.name} {str(value)[:40]} is out of range")
    if state.receiver not in RECEIVERS:
        raise ValueError(f"receiver {state.receiver[:40]!r} is not one of {', '.join(RECEIVERS)}")
    if not 0 < state.pid <= _MAX_PID:
        raise ValueError(f"pid {state.pid} is out of range")
    if state.timeline is not None and not is_timeline_id(state.timeline):
        raise ValueError(f"timeline {state.timeline} is out of range")


def read_state(directory: Path) -> State | None:
    """The state in ``directory``; None when there is no state file; ArchiveError if unreadable."""
    path = state_path(directory)
    try:
        data = read_small_file(path)  # ArchiveError naming a FIFO, device or huge file
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ArchiveError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        return decode_state(data)
    except ArchiveError as exc:
        raise ArchiveError(f"{path}: {exc}") from exc


def write_state(directory: Path, state: State, mode: int = 0o600) -> None:
    """Atomically replace the state file (through :func:`write_file_durably`: a fresh temporary
    file, fsync, rename, fsync of the directory; never through a symlink).

    Raises OSError; the caller decides how loud a failed write is.
    """
    write_file_durably(directory, STATE_FILE, encode_state(state), mode=mode)


def previous_flush(directory: Path) -> tuple[int, int] | None:
    """(timeline, flushed LSN) from the state file a previous run left, if it says both."""
    try:
        previous = read_state(directory)
    except ArchiveError as exc:
        get_logger(component="state").warning("state_unreadable", directory=str(directory),
                                               error=str(exc))
        return None
    if previous is None or previous.timeline is None or previous.flushed_lsn is None:
        return None
    return previous.timeline, previous.flushed_lsn
