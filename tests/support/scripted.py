"""A replication connection that plays a script: the COPY loop and the session without a
server."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator, Sequence

from receivewal.replication.link import (
    COPY_DONE,
    CopyData,
    CopyDone,
    Result,
    ResultStatus,
    WalRun,
)
from support.stopflag import Stop


class ScriptedConnection:
    """Plays CopyData payloads from a script and records what the session sends.

    It implements the same ReplicationLink protocol as the real connection (mypy checks it
    where the session is made)."""

    server_version = 150000

    def __init__(self, script: Sequence[bytes | WalRun], stop: Stop) -> None:
        self.script = list(script)
        self.stop = stop
        self.sent: list[bytes] = []
        self.sock_a, self.sock_b = socket.socketpair()
        self.ended = False
        self.results: Iterator[Result | None] = iter([Result(ResultStatus.COMMAND_OK, []), None])

    def describe(self) -> str:
        return "scripted"

    def query(self, sql: str) -> list[tuple[str | None, ...]]:
        raise AssertionError(f"unexpected command {sql}")

    def start_copy_both(self, sql: str) -> None:
        self.started = sql

    receive_path = "python"

    def read_copy(self, timeout: float) -> CopyData | CopyDone | None:
        message = self.read_batch(timeout)
        assert not isinstance(message, WalRun), "a run after the copy loop ended"
        return message

    def read_batch(self, timeout: float, until: int | None = None, scattered: bool = False,
                   ) -> WalRun | CopyData | CopyDone | None:
        if self.ended:
            return COPY_DONE
        if self.script:
            return self.script.pop(0)
        self.stop.requested = True
        self.stop.w.send(b"x")  # wake the selector as a signal would
        return None

    def send_copy(self, data: bytes) -> None:
        self.sent.append(bytes(data))

    def end_copy(self) -> None:
        self.ended = True

    def next_result(self) -> Result | None:
        return next(self.results)


def status_updates(conn: ScriptedConnection) -> list[tuple[int, int, int]]:
    """The (write, flush, apply) of every standby status update sent."""
    return [struct.unpack(">cQQQqB", m)[1:4] for m in conn.sent if m[:1] == b"r"]
