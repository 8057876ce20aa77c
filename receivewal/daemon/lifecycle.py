"""The daemon's life as typed events: what the supervisor, the receiver and the uploader state.

Connecting, the slot commands (--create-slot, --drop-slot), the temporary files the lock
holder removed, failures and how they are counted, disconnections and reconnects, the wait for
the first server, the uploads' status (posted from the uploader's thread), the local copy's
(posted from its rule's thread), stopping and
stopped. The stream's own facts are in :mod:`receivewal.daemon.events`, the start-up's
findings in :mod:`receivewal.walreceiver.startpoint`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from receivewal.daemon.events import Event, SessionMonitor
from receivewal.daemon.state import LocalCopyStatus, UploadStatus


@dataclass(frozen=True, slots=True)
class Connecting(Event):
    """A replication connection is being opened with ``conninfo`` (no password in it)."""

    name, level = "connecting", "debug"
    conninfo: str


@dataclass(frozen=True, slots=True)
class SlotCreating(Event):
    """--create-slot: the replication slot ``slot`` is created."""

    name = "creating_replication_slot"
    slot: str
    reserve_wal: bool


@dataclass(frozen=True, slots=True)
class SlotExisted(Event):
    """--create-slot --if-not-exists: the slot was there already."""

    name = "replication_slot_exists"
    slot: str


@dataclass(frozen=True, slots=True)
class SlotDropping(Event):
    """--drop-slot: the replication slot ``slot`` is dropped."""

    name = "dropping_replication_slot"
    slot: str


@dataclass(frozen=True, slots=True)
class TemporaryFileRemoved(Event):
    """The lock holder removed ``file``, a temporary file a crashed writer left behind."""

    name = "temporary_file_removed"
    file: str


@dataclass(frozen=True, slots=True)
class Stopped(Event):
    """The daemon stops without an error: ``reason`` (``stopped``, ``endpos``, ``signal``),
    after ``signal`` (None: none came)."""

    name = "stopped"
    reason: str
    signal: str | None


@dataclass(frozen=True, slots=True)
class Failed(Event):
    """The daemon gives up with ``error`` (exit code 1, or 4 for an error that a new start
    cannot fix either); ``kind`` as errors are counted."""

    name, level = "failed", "error"
    error: str
    kind: str | None = None
    hint: str | None = None  # what the operator can do

    def log_fields(self) -> dict[str, Any]:
        fields = {"error": self.error} if self.kind is None else \
            {"error": self.error, "kind": self.kind}
        return fields if self.hint is None else {**fields, "hint": self.hint}


@dataclass(frozen=True, slots=True)
class ErrorCounted(Event):
    """A session ended with an error of ``kind`` (exception class name, ``disk_full``,
    ``gap``...): the state file and the metrics count it."""

    kind: str
    message: str

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.error(self.kind, self.message)


@dataclass(frozen=True, slots=True)
class GapDetected(Event):
    """The server no longer has the WAL the archive needs next."""

    name, level = "gap_detected", "error"
    error: str


@dataclass(frozen=True, slots=True)
class DiskFull(Event):
    """The archive's file system is full."""

    name, level = "disk_full", "error"
    error: str
    directory: str


@dataclass(frozen=True, slots=True)
class Disconnected(Event):
    """The connection is gone because of ``error`` (of ``kind``)."""

    name, level = "disconnected", "warning"
    error: str
    kind: str
    hint: str | None = None  # what the operator can do

    def log_fields(self) -> dict[str, Any]:
        fields = {"error": self.error, "kind": self.kind}
        return fields if self.hint is None else {**fields, "hint": self.hint}

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.disconnected(self.error)


@dataclass(frozen=True, slots=True)
class Reconnecting(Event):
    """The supervisor connects again in ``delay`` seconds (try number ``attempt``)."""

    name = "reconnecting"
    delay: float
    attempt: int

    def log_fields(self) -> dict[str, Any]:
        return {"delay": round(self.delay, 2), "attempt": self.attempt}

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.reconnecting(self.delay)


@dataclass(frozen=True, slots=True)
class WaitingForServer(Event):
    """The first connection failed with ``error``; try ``attempt`` again in ``delay`` s."""

    name, level = "waiting_for_server", "warning"
    error: str
    attempt: int
    delay: float

    def log_fields(self) -> dict[str, Any]:
        return {"error": self.error, "attempt": self.attempt, "delay": round(self.delay, 2)}

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.waiting_for_server(self.error)


@dataclass(frozen=True, slots=True)
class UploadsChanged(Event):
    """The uploads' backlog, progress or errors changed (stated on the uploader's thread)."""

    status: UploadStatus

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.uploads_changed(self.status)


@dataclass(frozen=True, slots=True)
class LocalCopyChanged(Event):
    """The local copy's rule (--keep-local) was applied, or failed (stated on its thread)."""

    status: LocalCopyStatus

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.local_copy_changed(self.status)


@dataclass(frozen=True, slots=True)
class Stopping(Event):
    """The daemon shuts down (a signal, --endpos or a fatal error)."""

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.stopping()
