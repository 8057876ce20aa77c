"""A replication connection on psycopg's libpq layer (``psycopg.pq``).

This is the only module that imports psycopg, and what it hands out is receivewal's own
(:mod:`receivewal.replication.link`): :class:`ReplicationConnection` is a
:class:`~receivewal.replication.link.ReplicationLink`. It speaks the simple query protocol only
(the walsender accepts nothing else) and reads the COPY BOTH stream as whole CopyData payloads.
Nothing here blocks: the libpq dialogue is written as generators that
:mod:`receivewal.replication.waiting` drives, waiting on the socket and the stop signal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from receivewal.errors import ConfigurationError, ConnectionLost, ServerError, WalRemovedError
from receivewal.replication.link import (
    COPY_DONE,
    CopyData,
    CopyDone,
    Result,
    ResultStatus,
    Row,
    WalRun,
)
from receivewal.replication.nativerecv import receive_loop
from receivewal.replication.waiting import (
    BOTH,
    READ,
    WRITE,
    Steps,
    StopFlag,
    drive,
    drive_within,
)

T = TypeVar("T")

RUN_BYTES = 1 << 20  # the compiled receive loop hands over at most this much WAL per call
RUN_MESSAGES = 256  # ... and this many messages (one iovec each: IOV_MAX is 1024)
_NO_LSN = (1 << 64) - 1  # no --endpos: a run never ends for reaching it

#: The results a replication connection takes without an error, in receivewal's words.
_STATUSES = {pq.ExecStatus.COMMAND_OK: ResultStatus.COMMAND_OK,
             pq.ExecStatus.TUPLES_OK: ResultStatus.TUPLES_OK,
             pq.ExecStatus.COPY_IN: ResultStatus.COPY_IN,
             pq.ExecStatus.COPY_BOTH: ResultStatus.COPY_BOTH}


def build_conninfo(
    dbname: str | None, *, host: str | None = None, port: str | None = None,
    user: str | None = None, password: str | None = None, options: str | None = None,
    replication: str = "true",
) -> str:
    """A replication connection string from pg_receivewal-style options.

    ``dbname`` may be a connection string or URI, as with pg_receivewal's ``-d``; explicit
    host, port and user override what it says. ``replication`` is always forced (``true``
    for physical streaming, ``database`` for a logical slot, whose database is then the
    ``dbname`` the string names) and the application name defaults to ``receivewal``.
    """
    try:
        base = make_conninfo(dbname or "")
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"invalid connection string: {one_line(str(exc))}") from exc
    extra: dict[str, str] = {"replication": replication,
                             "fallback_application_name": "receivewal"}
    for key, value in (("host", host), ("port", port), ("user", user), ("password", password),
                       ("options", options)):
        if value is not None:
            extra[key] = value
    return make_conninfo(base, **extra)


def conninfo_options(conninfo: str) -> str | None:
    """The ``options`` parameter of a connection string, if any."""
    return conninfo_to_dict(conninfo).get("options")  # type: ignore[return-value]


def one_line(text: str) -> str:
    """Collapse a multi-line libpq message into one line."""
    return " ".join(text.split())


# -- the libpq dialogue as generators (they never block; waiting.drive waits for them) --------
def _connect_steps(pgconn: pq.abc.PGconn) -> Steps[None]:
    """PQconnectPoll until the connection is made or has failed."""
    while pgconn.status != pq.ConnStatus.BAD:
        status = pgconn.connect_poll()
        if status in (pq.PollingStatus.OK, pq.PollingStatus.FAILED):
            return
        yield pgconn.socket, READ if status == pq.PollingStatus.READING else WRITE


def _flush_steps(pgconn: pq.abc.PGconn) -> Steps[None]:
    """PQflush until libpq's output buffer is on the wire (reading meanwhile, so that a
    server waiting for us to read cannot deadlock us)."""
    while pgconn.flush() != 0:
        ready = yield pgconn.socket, BOTH
        if ready & READ:
            pgconn.consume_input()


def _put_steps(pgconn: pq.abc.PGconn, data: bytes | None) -> Steps[None]:
    """Queue CopyData (or CopyDone when ``data`` is None) and flush it."""
    while (pgconn.put_copy_end() if data is None else pgconn.put_copy_data(data)) == 0:
        yield from _flush_steps(pgconn)  # libpq's buffer is full: make room
    yield from _flush_steps(pgconn)


def _copy_data_steps(pgconn: pq.abc.PGconn) -> Steps[CopyData | CopyDone]:
    """The next CopyData payload, or COPY_DONE (psycopg's ``copy_from``), once libpq's buffer
    holds no whole message: read what the socket holds, else wait for it and read again."""
    while True:
        pgconn.consume_input()
        nbytes, data = pgconn.get_copy_data(1)
        if nbytes:
            return data if nbytes > 0 else COPY_DONE
        yield pgconn.socket, READ


def _readable_steps(pgconn: pq.abc.PGconn) -> Steps[bool]:
    """Wait until the socket is readable (the compiled receive loop reads it)."""
    yield pgconn.socket, READ
    return True


def _result_steps(pgconn: pq.abc.PGconn) -> Steps[pq.abc.PGresult | None]:
    """The next result, once libpq has all of it."""
    pgconn.consume_input()
    while pgconn.is_busy():
        yield pgconn.socket, READ
        pgconn.consume_input()
    return pgconn.get_result()


def _exec_steps(pgconn: pq.abc.PGconn, sql: bytes) -> Steps[pq.abc.PGresult | None]:
    """PQexec without blocking: send, flush, and keep the last result (stopping at COPY)."""
    pgconn.send_query(sql)
    yield from _flush_steps(pgconn)
    last = None
    while (res := (yield from _result_steps(pgconn))) is not None:
        last = res
        if res.status in (pq.ExecStatus.COPY_IN, pq.ExecStatus.COPY_OUT, pq.ExecStatus.COPY_BOTH):
            break
    return last


def _results_until_copy_steps(pgconn: pq.abc.PGconn, sql: bytes) -> Steps[list[pq.abc.PGresult]]:
    """Send ``sql``; every result up to and including the first COPY (or the last result)."""
    pgconn.send_query(sql)
    yield from _flush_steps(pgconn)
    results = []
    while (res := (yield from _result_steps(pgconn))) is not None:
        results.append(res)
        if res.status in (pq.ExecStatus.COPY_IN, pq.ExecStatus.COPY_OUT, pq.ExecStatus.COPY_BOTH):
            break
    return results


def _connect(conninfo: str, stop: StopFlag | None, timeout: float) -> pq.abc.PGconn:
    pgconn = pq.PGconn.connect_start(conninfo.encode())
    try:
        drive(_connect_steps(pgconn), "could not connect to server", stop, timeout)
    except BaseException:
        pgconn.finish()
        raise
    return pgconn


class ReplicationConnection:
    """One libpq connection in replication mode, in non-blocking mode.

    ``stop`` is the supervisor's stop signal and ``timeout`` the receive timeout (0: none):
    every wait for the server (connect, a command, a flush, a result) goes through
    :func:`~receivewal.replication.waiting.drive` with both.
    """

    def __init__(self, pgconn: pq.abc.PGconn, stop: StopFlag | None = None,
                 timeout: float = 0.0) -> None:
        self.pgconn = pgconn
        self.stop = stop
        self.timeout = timeout
        self.closed = False
        pgconn.nonblocking = 1
        # the compiled receive loop (None: pure Python), given psycopg's PGconn* to read
        self.native = receive_loop() if isinstance(self._pointer(), int) else None
        self.held: CopyData | CopyDone | ConnectionLost | None = None  # ended the last run

    @classmethod
    def open(
        cls, conninfo: str, prompt_password: Callable[[], str | None] | None = None, *,
        stop: StopFlag | None = None, timeout: float = 0.0,
    ) -> ReplicationConnection:
        """Connect; ask ``prompt_password`` once when the server wants a password we lack."""
        pgconn = _connect(conninfo, stop, timeout)
        if pgconn.status != pq.ConnStatus.OK and pgconn.needs_password and prompt_password:
            password = prompt_password()
            if password is not None:
                pgconn.finish()
                pgconn = _connect(make_conninfo(conninfo, password=password), stop, timeout)
        if pgconn.status != pq.ConnStatus.OK:
            message = one_line(pgconn.get_error_message())
            pgconn.finish()
            raise ConnectionLost(message or "could not connect to server")
        return cls(pgconn, stop, timeout)

    # -- properties --------------------------------------------------------------------------
    @property
    def server_version(self) -> int:
        """The server's version number, e.g. 150018."""
        return int(self.pgconn.server_version)

    def describe(self) -> str:
        """host, port and user of this connection (never the password)."""
        host = self.pgconn.host.decode() or "local socket"
        return f"host={host} port={self.pgconn.port.decode()} user={self.pgconn.user.decode()}"

    @property
    def receive_path(self) -> str:
        """Which receive loop runs: ``"c"`` (receivewal.replication._recv) or ``"python"``."""
        return "python" if self.native is None else "c"

    @property
    def stopping(self) -> bool:
        """Whether the stop signal this connection waits on has come."""
        return self.stop is not None and self.stop.requested

    def sql_session(self) -> ReplicationConnection:
        """A plain connection (no replication) to the same server and database with the
        settings and credentials this one was opened with (a password asked for included):
        SQL beside this connection while it holds something, such as the snapshot a new
        slot exported. ConnectionLost when it cannot connect."""
        params = {option.keyword.decode(): option.val.decode() for option in self.pgconn.info
                  if option.val is not None}
        params.pop("replication", None)
        pgconn = _connect(make_conninfo("", **params), self.stop, self.timeout)
        if pgconn.status != pq.ConnStatus.OK:
            message = one_line(pgconn.get_error_message())
            pgconn.finish()
            raise ConnectionLost(message or "could not connect to server")
        return ReplicationConnection(pgconn, self.stop, self.timeout)

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if not self.closed:
            self.closed = True
            self.pgconn.finish()

    # -- commands ----------------------------------------------------------------------------
    def _error(self, what: str, res: pq.abc.PGresult | None = None) -> Exception:
        message = one_line(
            res.get_error_message() if res is not None else self.pgconn.get_error_message()
        )
        if self.pgconn.status == pq.ConnStatus.BAD:
            return ConnectionLost(f"{what}: {message or 'connection lost'}")
        sqlstate = res.error_field(pq.DiagnosticField.SQLSTATE) if res is not None else None
        kind = WalRemovedError if "has already been removed" in message else ServerError
        return kind(f"{what}: {message}", sqlstate=(sqlstate or b"").decode())

    def _rows(self, res: pq.abc.PGresult) -> list[Row]:
        rows = []
        for r in range(res.ntuples):
            row = []
            for c in range(res.nfields):
                value = res.get_value(r, c)
                row.append(None if value is None else bytes(value).decode())
            rows.append(tuple(row))
        return rows

    def _run(self, steps: Steps[T], what: str) -> T:
        try:
            return drive(steps, what, self.stop, self.timeout)
        except psycopg.Error as exc:
            raise ConnectionLost(f"{what}: {one_line(str(exc))}") from exc

    def query(self, sql: str) -> list[Row]:
        """Run one command with the simple query protocol; return its rows."""
        command = sql.split(maxsplit=1)[0]
        res = self._run(_exec_steps(self.pgconn, sql.encode()), f"{command} failed")
        if res is not None and res.status in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            return self._rows(res)
        raise self._error(f"{command} failed", res)

    def start_copy_both(self, sql: str) -> None:
        """Send START_REPLICATION and expect the server to enter COPY BOTH."""
        res = self._run(_exec_steps(self.pgconn, sql.encode()),
                        "could not send replication command")
        if res is None or res.status != pq.ExecStatus.COPY_BOTH:
            raise self._error("could not start WAL streaming", res)

    def start_copy_out(self, sql: str) -> list[list[Row]]:
        """Send a command that answers with result sets and then a COPY OUT stream
        (BASE_BACKUP); return the rows of the result sets before the COPY."""
        command = sql.split(maxsplit=1)[0]
        results = self._run(_results_until_copy_steps(self.pgconn, sql.encode()),
                            f"{command} failed")
        last = results[-1] if results else None
        if last is None or last.status != pq.ExecStatus.COPY_OUT:
            raise self._error(f"{command} failed", last)
        rows = []
        for res in results[:-1]:
            if res.status != pq.ExecStatus.TUPLES_OK:
                raise self._error(f"{command} failed", res)
            rows.append(self._rows(res))
        return rows

    # -- the COPY stream ---------------------------------------------------------------------
    def read_copy(self, timeout: float) -> CopyData | CopyDone | None:
        """The next CopyData payload, or COPY_DONE at the end of the server's stream; None
        when none arrived within ``timeout`` seconds (0: only what has arrived) or a stop
        signal came meanwhile.

        A payload libpq already holds is returned at once (the hot path: no generator, no
        wait); otherwise :func:`_copy_data_steps` reads and waits.
        """
        if self.held is not None:
            return self._take_held()
        try:
            nbytes, data = self.pgconn.get_copy_data(1)
            if nbytes:
                return data if nbytes > 0 else COPY_DONE
            return drive_within(_copy_data_steps(self.pgconn), self.stop, timeout)
        except psycopg.Error as exc:
            raise ConnectionLost(f"could not receive data from WAL stream: "
                                 f"{one_line(str(exc))}") from exc

    def read_batch(self, timeout: float, until: int | None = None, scattered: bool = False,
                   ) -> WalRun | CopyData | CopyDone | None:
        """Every plain XLogData message that has arrived, up to the one that reaches LSN
        ``until``, as one :class:`WalRun` (the compiled loop; ``scattered``: whatever their
        walStarts), else as :meth:`read_copy`; the message that ended a run otherwise comes
        next time."""
        if self.native is None:
            return self.read_copy(timeout)
        if self.held is not None:
            return self._take_held()
        last = _NO_LSN if until is None else until
        deadline = time.monotonic() + timeout
        received = self._read_run(last, scattered)
        while received is None:  # readable, yet the message may still be arriving in pieces
            left = deadline - time.monotonic()
            if left <= 0 or not drive_within(_readable_steps(self.pgconn), self.stop, left):
                return None
            received = self._read_run(last, scattered)
        return received

    def _read_run(self, until: int, scattered: bool) -> WalRun | CopyData | CopyDone | None:
        assert self.native is not None
        start, end, payload, wire, other, starts = self.native.read(
            self._pointer() or 0, RUN_BYTES, RUN_MESSAGES, until, scattered)
        if isinstance(other, bytes):  # a message for Python's path: a keepalive, say
            self.held = other
        elif other == -1:
            self.held = COPY_DONE
        elif other == -2:
            message = one_line(self.pgconn.get_error_message()) or "connection lost"
            self.held = ConnectionLost(f"could not receive data from WAL stream: {message}")
        if payload:
            return WalRun(start, end, payload, wire, starts)
        return self._take_held() if self.held is not None else None

    def _pointer(self) -> int | None:
        """libpq's PGconn* of this connection (None once closed)."""
        return getattr(self.pgconn, "pgconn_ptr", None)

    def _take_held(self) -> CopyData | CopyDone:
        held, self.held = self.held, None
        if isinstance(held, ConnectionLost):
            raise held
        assert held is not None
        return held

    def send_copy(self, data: bytes) -> None:
        """Send one CopyData message and flush it."""
        self._run(_put_steps(self.pgconn, data), "could not send feedback packet")

    def end_copy(self) -> None:
        """Send CopyDone: we will send nothing more on this stream."""
        self._run(_put_steps(self.pgconn, None), "could not send end-of-streaming message")

    def next_result(self) -> Result | None:
        """The next result after the COPY stream ended; None when there is no more."""
        res = self._run(_result_steps(self.pgconn), "could not read the server's result")
        if res is None:
            return None
        status = _STATUSES.get(pq.ExecStatus(res.status))
        if status is None:
            raise self._error("unexpected termination of replication stream", res)
        return Result(status, self._rows(res) if status is ResultStatus.TUPLES_OK else [])
