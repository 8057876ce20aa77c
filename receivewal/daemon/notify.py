"""sd_notify: tell systemd about readiness, status, watchdog pings and shutdown.

The protocol is one datagram of ``KEY=VALUE`` lines sent to the AF_UNIX socket named by
``NOTIFY_SOCKET`` (a path, or an abstract socket when it starts with ``@``). Without
``NOTIFY_SOCKET`` every call is a no-op, so the daemon runs the same outside systemd.

Parsing the environment is pure (:func:`socket_address`, :func:`watchdog_interval`); only
:class:`Notifier` touches a socket, and it never raises: a failed send is logged.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from receivewal.logs import get_logger

log = get_logger(component="notify")


def socket_address(environ: Mapping[str, str]) -> str | bytes | None:
    """The address to send notifications to, from ``NOTIFY_SOCKET``; None when unset.

    ``@name`` is the abstract socket ``\\0name`` (as sd_notify(3) documents). Other values are
    file system paths.
    """
    value = environ.get("NOTIFY_SOCKET", "")
    if not value:
        return None
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    return value


def watchdog_interval(environ: Mapping[str, str], pid: int) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of ``WATCHDOG_USEC``); None when not asked for.

    systemd sets ``WATCHDOG_PID`` to the process it expects pings from; when it names another
    process (a parent that exec'd us, a child that inherited the environment), we must not ping.
    """
    usec = environ.get("WATCHDOG_USEC", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    watchdog_pid = environ.get("WATCHDOG_PID", "")
    if watchdog_pid and (not watchdog_pid.isdigit() or int(watchdog_pid) != pid):
        return None
    return int(usec) / 1_000_000 / 2


def format_message(**fields: str) -> bytes:
    """One notification datagram: ``KEY=VALUE`` lines; a newline inside a value is flattened."""
    return "\n".join(
        f"{key}={value.replace(chr(10), ' ')}" for key, value in fields.items()
    ).encode()


class Notifier:
    """Sends sd_notify datagrams to one address; does nothing when the address is None."""

    def __init__(self, address: str | bytes | None) -> None:
        self.address = address
        self._sock: socket.socket | None = None
        self._failure: str | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        """A notifier for ``NOTIFY_SOCKET`` in ``environ`` (default: the process environment)."""
        return cls(socket_address(os.environ if environ is None else environ))

    @property
    def enabled(self) -> bool:
        """True when there is a socket to notify."""
        return self.address is not None

    def notify(self, **fields: str) -> bool:
        """Send ``fields`` as one datagram (e.g. ``READY="1", STATUS="..."``); True when sent.

        Never blocks: when the receiver's queue is full the message is dropped and logged, as
        a stalled reader must not stall streaming. A failure is logged once until a send
        succeeds again (``notify_failed``, then ``notify_recovered``).
        """
        if self.address is None:
            return False
        message = format_message(**fields)
        try:
            if self._sock is None:
                self._sock = socket.socket(
                    socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
                )
            self._sock.sendto(message, self.address)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if reason != self._failure:
                log.warning(
                    "notify_failed", socket=_printable(self.address), fields=sorted(fields),
                    error=reason,
                )
            self._failure = reason
            self.close()
            return False
        if self._failure is not None:
            log.info("notify_recovered", socket=_printable(self.address))
            self._failure = None
        return True

    def close(self) -> None:
        """Close the socket; a later notify opens a new one."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _printable(address: str | bytes) -> str:
    if isinstance(address, bytes):
        return "@" + address[1:].decode(errors="replace")
    return address
