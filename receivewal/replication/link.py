"""What receivewal needs of a replication connection, in its own types: psycopg's door.

:class:`ReplicationLink` is what the replication commands and the COPY stream
(:class:`~receivewal.replication.copystream.CopyStream`) use.
:class:`~receivewal.replication.connection.ReplicationConnection` (the one module that imports
psycopg) is the real one; the tests' scripted connection is another. Only receivewal's types
cross it: rows of text, a :class:`Result` with its :class:`ResultStatus`, CopyData payloads as
bytes (or, from the compiled receive loop, a :class:`WalRun` of plain XLogData messages), and
:data:`COPY_DONE` when the server ended the COPY stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final, Protocol, runtime_checkable

Row = tuple[str | None, ...]

CopyData = bytes | memoryview
"""One CopyData payload as received (a message of the replication protocol)."""


class CopyDone(Enum):
    """The server ended its side of the COPY stream (its CopyDone)."""

    COPY_DONE = "CopyDone"


COPY_DONE: Final = CopyDone.COPY_DONE


@dataclass(frozen=True, slots=True)
class WalRun:
    """XLogData messages received back to back, each beginning where the one before ended
    (the first at ``wal_start``): what the compiled receive loop hands over in one call, and
    what :class:`~receivewal.replication.copystream.CopyStream` makes of every XLogData
    message, a run of one. ``payload`` is their bytes, one view per message (the compiled
    loop's: of the buffers libpq allocated, nothing copied); ``wal_end`` is the last
    message's walEnd, ``wire`` the messages' CopyData bytes. A scattered run (a logical
    stream's, asked for with ``read_batch(..., scattered=True)``) lists each message's own
    walStart in ``starts``: they need not follow on; the compiled loop hands its messages
    over as bytes (small, and read whole by the change log: a copy costs less than a view)."""

    wal_start: int
    wal_end: int
    payload: list[memoryview] | list[bytes]
    wire: int
    starts: list[int] | None = None

    @property
    def end(self) -> int:
        """The LSN just past the run's last message."""
        if self.starts:
            return self.starts[-1] + len(self.payload[-1])
        return self.wal_start + self.size

    @property
    def size(self) -> int:
        """The bytes of the messages' payloads."""
        return sum(map(len, self.payload))


class ResultStatus(Enum):
    """A command's result, in libpq's words, as far as a replication connection sees them
    without an error."""

    COMMAND_OK = "COMMAND_OK"
    TUPLES_OK = "TUPLES_OK"
    COPY_IN = "COPY_IN"
    COPY_BOTH = "COPY_BOTH"


@dataclass(frozen=True)
class Result:
    """The outcome of one command: its status and rows (text values, None for NULL)."""

    status: ResultStatus
    rows: list[Row]


class ReplicationLink(Protocol):
    """What the session and the replication commands need of a replication connection.

    Every wait for the server (a command, a flush, a result, CopyData) waits on the socket and
    the stop signal together, in :mod:`receivewal.replication.waiting`.
    """

    @property
    def server_version(self) -> int: ...

    def describe(self) -> str: ...

    def query(self, sql: str) -> list[Row]: ...

    def start_copy_both(self, sql: str) -> None: ...

    def read_copy(self, timeout: float) -> CopyData | CopyDone | None:
        """The next CopyData payload, or COPY_DONE at the end of the server's stream; None
        when none arrived within ``timeout`` seconds (0: only what has arrived) or a stop
        signal came meanwhile (the caller looks at its stop flag)."""

    def read_batch(self, timeout: float, until: int | None = None, scattered: bool = False,
                   ) -> WalRun | CopyData | CopyDone | None:
        """As :meth:`read_copy`, but every plain XLogData message that has arrived, up to the
        one that reaches LSN ``until``, at once as a :class:`WalRun`, where the compiled
        receive loop runs (:attr:`receive_path`); with ``scattered``, whatever their
        walStarts (each in the run's ``starts``)."""

    @property
    def receive_path(self) -> str:
        """Which receive loop runs: ``"c"`` or ``"python"``."""

    def send_copy(self, data: bytes) -> None: ...

    def end_copy(self) -> None: ...

    def next_result(self) -> Result | None: ...


class SqlLink(Protocol):
    """A plain connection: SQL and COPY ... TO STDOUT (a snapshot's copy)."""

    def query(self, sql: str) -> list[Row]: ...

    def start_copy_out(self, sql: str) -> list[list[Row]]: ...

    def read_copy(self, timeout: float) -> CopyData | CopyDone | None: ...

    def next_result(self) -> Result | None: ...

    def close(self) -> None: ...

    @property
    def stopping(self) -> bool:
        """Whether a stop signal came (a read that returned nothing may say why)."""


@runtime_checkable
class SessionLink(ReplicationLink, Protocol):
    """A replication connection that can open a plain one beside it: what a slot's exported
    snapshot is copied through."""

    def sql_session(self) -> SqlLink:
        """A plain connection beside this one, to the same database with the same
        credentials (SQL while this one holds an exported snapshot)."""
