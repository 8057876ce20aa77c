"""The supervisor: signals, connections, reconnects with backoff, and the exit code.

Only this loop decides whether an error ends the program or is retried. Exit codes follow
pg_receivewal: 0 when stopped by a signal or at ``--endpos``, 1 on an error that retrying
cannot fix, on any error with ``--no-loop``, and when the first connection fails (unless
``--wait-for-server``: then the first connection is retried with backoff too); 4
(:data:`EXIT_STAY_DOWN`) on an error that a new start cannot fix either (``final``: the
server refusing a logical slot's stream for good, a slot confirmed past the change log), so
that the service unit does not restart it. Two more
make an exit 1: a stop signal that came while the disk had not made the newest WAL durable
and did not within the stop's bound (``ArchiveNotDurable``), and, with ``--upload-to``, an
exit no signal asked for (``--endpos``, ``--no-loop``) that leaves completed files not
uploaded after ``--upload-wait`` seconds.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from receivewal.allocator import skip_final_collection
from receivewal.daemon.events import EventLog, EventStream, Listener, Tick
from receivewal.daemon.lifecycle import (
    Connecting,
    Disconnected,
    DiskFull,
    ErrorCounted,
    Failed,
    GapDetected,
    Reconnecting,
    Stopped,
    Stopping,
    WaitingForServer,
)
from receivewal.daemon.monitor import Monitor
from receivewal.daemon.settings import Settings
from receivewal.daemon.signals import StopSignal
from receivewal.errors import (
    OUT_OF_DESCRIPTORS,
    ArchiveNotDurable,
    ConnectionLost,
    DescriptorLimitError,
    DiskFullError,
    ReceivewalError,
    WalRemovedError,
)
from receivewal.logs import get_logger
from receivewal.replication.connection import ReplicationConnection
from receivewal.replication.link import ReplicationLink
from receivewal.replication.waiting import StopFlag
from receivewal.secrets import redacted

#: The exit status of an error that neither retrying nor restarting the program can fix (the
#: server refusing the slot's stream for good, a slot confirmed past the change log): the
#: systemd unit names it in RestartPreventExitStatus, so it stays down until an operator acts.
EXIT_STAY_DOWN = 4


def backoff_delay(attempt: int, base: float, cap: float,
                  rand: Callable[[], float] = random.random) -> float:
    """Capped exponential backoff with jitter: base * 2^(attempt-1), capped, times 0.8-1.2."""
    if base == 0:
        return 0.0
    delay = min(cap, base * 2 ** max(0, attempt - 1))
    return float(min(cap, delay * (0.8 + 0.4 * rand())))


class Session(Protocol):
    """One connection's work, as the supervisor runs it (the WAL archive's:
    :class:`receivewal.walreceiver.session.Session`)."""

    def prepare(self) -> None:
        """Everything before streaming: identify the server, find where to start. An error
        here on the first connection ends the daemon."""

    def run(self) -> str:
        """Stream until a stop signal ("stopped") or --endpos ("endpos"); raise otherwise."""

    def close(self) -> None:
        """The connection ends (with an error too)."""


class Receiver(Protocol):
    """What the daemon receives into, across its connections: the supervisor opens it once,
    runs one of its sessions per connection, and closes it. The WAL archive's is
    :class:`receivewal.walreceiver.receiver.WalReceiver`."""

    @property
    def file_mode(self) -> int:
        """The mode of the files it writes (the state file's too)."""

    @property
    def kind(self) -> str:
        """What it receives, as the state file records it: ``wal`` or ``logical``."""

    def slot_command(self, conn: ReplicationLink, events: Listener) -> None:
        """--create-slot or --drop-slot: act on the slot (the daemon exits then)."""

    def open(self, events: EventStream) -> None:
        """Take the destination (its lock), before touching anything; what runs beside the
        sessions (the uploads) is made. Raises ReceivewalError: the daemon exits 1."""

    def session(self, conn: ReplicationLink, events: Listener, stop: StopFlag) -> Session:
        """The work of one connection."""

    def drain(self, stop: StopSignal, tick: Callable[[], None]) -> str | None:
        """Before an exit no stop signal asked for: wait, a bounded time, for what must leave
        (the uploads); what is left, in words (None: nothing; the exit is then 0)."""

    def close(self) -> None:
        """Stop what runs beside the sessions (before the daemon says it stops)."""

    def release(self) -> None:
        """Give the destination up (its lock), last."""


class Supervisor:
    """Runs the ``receiver``'s sessions until told to stop, reconnecting after failures.

    What the sessions, the supervisor and the uploader report goes into one
    :class:`EventStream`: its consumers are the log (unless ``log_events`` is false: the
    drop-in words every event itself), then the monitor (once made), then ``listeners`` (the
    drop-in's pg_receivewal messages). ``prompt`` asks for a password when the server wants
    one the connection string lacks (the command's; None: never)."""

    def __init__(self, settings: Settings, receiver: Receiver,
                 prompt: Callable[[], str | None] | None = None,
                 listeners: tuple[Listener, ...] = (), *, log_events: bool = True) -> None:
        self.settings = settings
        self.receiver = receiver
        self.log = get_logger()
        self.prompt = prompt
        self.stop = StopSignal()
        self.listeners = listeners
        logged = (EventLog(self.log),) if log_events else ()
        self.events = EventStream(*logged, *listeners)

    def connect(self) -> ReplicationConnection:
        """Open a replication connection (the password never reaches a log line)."""
        self.events(Connecting(redacted(self.settings.conninfo)))
        return ReplicationConnection.open(self.settings.conninfo, self.prompt, stop=self.stop,
                                          timeout=self.settings.receive_timeout)

    def slot_command(self) -> int:
        """--create-slot / --drop-slot: act and exit, as pg_receivewal does."""
        conn = self.connect()
        try:
            self.receiver.slot_command(conn, self.events)
        finally:
            conn.close()
        return 0

    def run(self) -> int:
        """The whole program: returns the exit code."""
        skip_final_collection()  # the process ends after this: its heap need not be collected
        try:
            if self.settings.create_slot or self.settings.drop_slot:
                return self.slot_command()
        except ReceivewalError as exc:
            self.events(Failed(str(exc)))
            return 1
        receiver = self.receiver
        try:
            receiver.open(self.events)
            monitor = Monitor(self.settings.directory, self.settings.metrics_address,
                              progress=self.settings.progress, file_mode=receiver.file_mode,
                              receiver=receiver.kind)
        except ReceivewalError as exc:
            self.events(Failed(str(exc)))
            receiver.close()
            receiver.release()
            return 1
        # the monitor before the listeners, so that the drop-in's line follows the log's
        self.events.subscribe(monitor, before=self.listeners[0] if self.listeners else None)
        self.stop.install()
        try:
            code = self._loop()
            if not self.stop.requested and (left := receiver.drain(self.stop, self._tick)):
                self.events(Failed(left))
                code = 1
            return code
        finally:
            receiver.close()
            self.events(Stopping())
            monitor.close()
            self.stop.uninstall()
            receiver.release()

    def _loop(self) -> int:
        attempt = 0
        connected_once = False
        while True:
            streamed = False
            try:
                conn = self.connect() if connected_once or not self.settings.wait_for_server \
                    else self._wait_for_server()
            except ReceivewalError as exc:
                if not connected_once and not self.stop.requested:
                    self.events(Failed(str(exc), hint=exc.hint))
                    return 1
                error: ReceivewalError = exc
            else:
                connected_once = True
                session = self.receiver.session(conn, self.events, self.stop)
                try:
                    with descriptors_retryable():
                        session.prepare()
                        streamed = True
                        outcome = session.run()
                except ReceivewalError as exc:
                    error = exc
                else:
                    self.events(Stopped(outcome, self.stop.signal_name))
                    return 0
                finally:
                    session.close()
                    conn.close()
            if self.stop.requested:
                return self._stopped(error)
            kind = error_kind(error)
            self.events(ErrorCounted(kind, str(error)))
            if not error.retryable or self.settings.no_loop or \
                    (not streamed and not connected_once):
                self.events(Failed(str(error), kind, error.hint))
                return EXIT_STAY_DOWN if error.final else 1
            if isinstance(error, WalRemovedError):
                self.events(GapDetected(str(error)))
            if isinstance(error, DiskFullError):
                self.events(DiskFull(str(error), str(self.settings.directory)))
            self.events(Disconnected(str(error), kind, error.hint))
            attempt = 1 if streamed and isinstance(error, ConnectionLost) else attempt + 1
            delay = backoff_delay(attempt, self.settings.reconnect_delay,
                                  self.settings.reconnect_delay_max)
            self.events(Reconnecting(delay, attempt))
            self.stop.sleep(delay, on_tick=self._tick)
            if self.stop.requested:
                return self._stopped(None)

    def _stopped(self, error: ReceivewalError | None) -> int:
        """The exit code once a stop signal came, after ``error`` (None: none): 0, as
        pg_receivewal; 1 when the disk did not make the newest WAL durable in time."""
        if isinstance(error, ArchiveNotDurable):
            self.events(Failed(str(error), error_kind(error)))
            return 1
        self.events(Stopped("signal", self.stop.signal_name))
        return 0

    # -- --wait-for-server: the first connection is retried (as a service), not fatal ------
    def _wait_for_server(self) -> ReplicationConnection:
        """Connect, retrying with backoff while the error is retryable, until a stop signal
        (which re-raises the last error; the loop then exits 0 as for any stop).

        pg_receivewal exits 1 when its first connection fails; under systemd that only makes
        the unit loop on restarts, so with ``--wait-for-server`` it waits instead (STATUS
        "Waiting for server: ...") and the unit's TimeoutStartSec bounds the wait for READY.
        """
        attempt = 0
        while True:
            try:
                return self.connect()
            except ReceivewalError as exc:
                if not exc.retryable:
                    raise
                attempt += 1
                delay = backoff_delay(attempt, self.settings.reconnect_delay,
                                      self.settings.reconnect_delay_max)
                self.events(WaitingForServer(str(exc), attempt, delay))
                self.stop.sleep(delay, on_tick=self._tick)
                if self.stop.requested:
                    raise

    def _tick(self) -> None:
        self.events(Tick(time.time()))


@contextlib.contextmanager
def descriptors_retryable() -> Iterator[None]:
    """EMFILE/ENFILE from anywhere in a session raise the retryable DescriptorLimitError (the
    archive's writes already do; this covers its reads and scans). Other errors pass as they
    are."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in OUT_OF_DESCRIPTORS:
            raise
        where = f' "{exc.filename}"' if exc.filename else ""
        raise DescriptorLimitError(f"out of file descriptors{where}: {exc.strerror}") from exc


def error_kind(error: ReceivewalError) -> str:
    """The label an error is counted under in metrics and the state file."""
    if isinstance(error, WalRemovedError):
        return "gap"
    if isinstance(error, DiskFullError):
        return "disk_full"
    return type(error).__name__

