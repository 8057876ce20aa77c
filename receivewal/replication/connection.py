"""A replication connection on psycopg's libpq layer (``psycopg.pq``).

This is the only module that imports psycopg. It speaks the simple query protocol only (the
walsender accepts nothing else) and exposes the COPY BOTH stream as non-blocking reads of whole
CopyData payloads; waiting on the socket is the caller's business.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from receivewal.errors import ConfigurationError, ConnectionLost, ServerError, WalRemovedError

ExecStatus = pq.ExecStatus

#: What ``read_copy`` returns when the server ended its side of the COPY stream.
COPY_DONE = object()


def build_conninfo(
    dbname: str | None, *, host: str | None = None, port: str | None = None,
    user: str | None = None, password: str | None = None, options: str | None = None,
) -> str:
    """A replication connection string from pg_receivewal-style options.

    ``dbname`` may be a connection string or URI, as with pg_receivewal's ``-d``; explicit
    host, port and user override what it says. ``replication=true`` is always forced and the
    application name defaults to ``receivewal``.
    """
    try:
        base = make_conninfo(dbname or "")
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"invalid connection string: {one_line(str(exc))}") from exc
    extra: dict[str, str] = {"replication": "true", "fallback_application_name": "receivewal"}
    for key, value in (("host", host), ("port", port), ("user", user), ("password", password),
                       ("options", options)):
        if value is not None:
            extra[key] = value
    return make_conninfo(base, **extra)


def conninfo_options(conninfo: str) -> str | None:
    """The ``options`` parameter of a connection string, if any."""
    return conninfo_to_dict(conninfo).get("options")  # type: ignore[return-value]


_PASSWORD_RE = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_URI_PASSWORD_RE = re.compile(r"(postgres(?:ql)?://[^:/@\s]*:)[^@\s]*@", re.IGNORECASE)


def redacted(text: str) -> str:
    """``text`` with every password (``password=``, ``sslpassword=``, a URI's ``user:pw@``)
    replaced by ``****``: for connection strings and any message that may quote one."""
    return _URI_PASSWORD_RE.sub(r"\1****@", _PASSWORD_RE.sub(r"\1****", text))


def one_line(text: str) -> str:
    """Collapse a multi-line libpq message into one line."""
    return " ".join(text.split())


@dataclass(frozen=True)
class Result:
    """The outcome of one command: its status and rows (text values, None for NULL)."""

    status: ExecStatus
    rows: list[tuple[str | None, ...]]


class ReplicationConnection:
    """One libpq connection in replication mode."""

    def __init__(self, pgconn: pq.abc.PGconn) -> None:
        self.pgconn = pgconn
        self.closed = False

    @classmethod
    def open(
        cls, conninfo: str, prompt_password: Callable[[], str | None] | None = None
    ) -> ReplicationConnection:
        """Connect; ask ``prompt_password`` once when the server wants a password we lack."""
        pgconn = pq.PGconn.connect(conninfo.encode())
        if pgconn.status != pq.ConnStatus.OK and pgconn.needs_password and prompt_password:
            password = prompt_password()
            if password is not None:
                pgconn.finish()
                pgconn = pq.PGconn.connect(make_conninfo(conninfo, password=password).encode())
        if pgconn.status != pq.ConnStatus.OK:
            message = one_line(pgconn.get_error_message())
            pgconn.finish()
            raise ConnectionLost(message or "could not connect to server")
        return cls(pgconn)

    # -- properties --------------------------------------------------------------------------
    @property
    def server_version(self) -> int:
        """The server's version number, e.g. 150018."""
        return int(self.pgconn.server_version)

    def describe(self) -> str:
        """host, port and user of this connection (never the password)."""
        host = self.pgconn.host.decode() or "local socket"
        return f"host={host} port={self.pgconn.port.decode()} user={self.pgconn.user.decode()}"

    def fileno(self) -> int:
        """The socket to wait on."""
        return int(self.pgconn.socket)

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

    def _rows(self, res: pq.abc.PGresult) -> list[tuple[str | None, ...]]:
        rows = []
        for r in range(res.ntuples):
            row = []
            for c in range(res.nfields):
                value = res.get_value(r, c)
                row.append(None if value is None else bytes(value).decode())
            rows.append(tuple(row))
        return rows

    def query(self, sql: str) -> list[tuple[str | None, ...]]:
        """Run one command with the simple query protocol; return its rows."""
        command = sql.split(maxsplit=1)[0]
        try:
            res = self.pgconn.exec_(sql.encode())
        except psycopg.Error as exc:
            raise ConnectionLost(f"{command} failed: {one_line(str(exc))}") from exc
        if res.status in (ExecStatus.TUPLES_OK, ExecStatus.COMMAND_OK):
            return self._rows(res)
        raise self._error(f"{command} failed", res)

    def start_copy_both(self, sql: str) -> None:
        """Send START_REPLICATION and expect the server to enter COPY BOTH."""
        try:
            res = self.pgconn.exec_(sql.encode())
        except psycopg.Error as exc:
            raise ConnectionLost(f"could not send replication command: {exc}") from exc
        if res.status != ExecStatus.COPY_BOTH:
            raise self._error("could not start WAL streaming", res)

    # -- the COPY stream ---------------------------------------------------------------------
    def read_copy(self, block: bool = False) -> bytes | memoryview | object | None:
        """The next CopyData payload; None when none is buffered; COPY_DONE at its end."""
        try:
            nbytes, data = self.pgconn.get_copy_data(0 if block else 1)
        except psycopg.Error as exc:
            raise ConnectionLost(f"could not receive data from WAL stream: "
                                 f"{one_line(str(exc))}") from exc
        if nbytes > 0:
            return data
        if nbytes == 0:
            return None
        return COPY_DONE

    def consume_input(self) -> None:
        """Read what the socket has into libpq's buffer."""
        try:
            self.pgconn.consume_input()
        except psycopg.Error as exc:
            raise ConnectionLost(f"could not receive data from WAL stream: "
                                 f"{one_line(str(exc))}") from exc

    def send_copy(self, data: bytes) -> None:
        """Send one CopyData message and flush it."""
        try:
            self.pgconn.put_copy_data(data)
            self.pgconn.flush()
        except psycopg.Error as exc:
            raise ConnectionLost(f"could not send feedback packet: {one_line(str(exc))}") from exc

    def end_copy(self) -> None:
        """Send CopyDone: we will send nothing more on this stream."""
        try:
            self.pgconn.put_copy_end()
            self.pgconn.flush()
        except psycopg.Error as exc:
            raise ConnectionLost(f"could not send end-of-streaming message: "
                                 f"{one_line(str(exc))}") from exc

    def next_result(self) -> Result | None:
        """The next result after the COPY stream ended; None when there is no more."""
        res = self.pgconn.get_result()
        if res is None:
            return None
        if res.status in (ExecStatus.TUPLES_OK, ExecStatus.COMMAND_OK, ExecStatus.COPY_IN,
                          ExecStatus.COPY_BOTH):
            status = ExecStatus(res.status)
            return Result(status, self._rows(res) if status == ExecStatus.TUPLES_OK else [])
        raise self._error("unexpected termination of replication stream", res)
