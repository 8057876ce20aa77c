"""The supervisor: signals, connections, reconnects with backoff, and the exit code.

Only this loop decides whether an error ends the program or is retried. Exit codes follow
pg_receivewal: 0 when stopped by a signal or at ``--endpos``, 1 on an error that retrying
cannot fix, on any error with ``--no-loop``, and when the first connection fails (unless
``--wait-for-server``: then the first connection is retried with backoff too). Two more
make an exit 1: a stop signal that came while the disk had not made the newest WAL durable
and did not within the stop's bound (``ArchiveNotDurable``), and, with ``--upload-to``, an
exit no signal asked for (``--endpos``, ``--no-loop``) that leaves completed files not
uploaded after ``--upload-wait`` seconds.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

from receivewal.allocator import skip_final_collection
from receivewal.archive.directory import OUT_OF_DESCRIPTORS, Archive
from receivewal.archive.listing import Listing
from receivewal.daemon.events import (
    TICK_SECONDS,
    Connecting,
    Disconnected,
    DiskFull,
    ErrorCounted,
    EventLog,
    EventStream,
    Failed,
    GapDetected,
    Listener,
    Reconnecting,
    SlotCreating,
    SlotDropping,
    SlotExisted,
    Stopped,
    Stopping,
    TemporaryFileRemoved,
    Tick,
    WaitingForServer,
)
from receivewal.daemon.monitor import Monitor
from receivewal.daemon.session import Session
from receivewal.daemon.settings import Settings
from receivewal.errors import (
    ArchiveNotDurable,
    ConnectionLost,
    DescriptorLimitError,
    DiskFullError,
    ReceivewalError,
    WalRemovedError,
)
from receivewal.logs import get_logger
from receivewal.replication.commands import create_slot, drop_slot
from receivewal.replication.connection import ReplicationConnection
from receivewal.replication.waiting import pause
from receivewal.secrets import redacted

if TYPE_CHECKING:  # loaded only with --upload-to
    from receivewal.daemon.uploader import Uploader


class StopSignal:
    """SIGINT/SIGTERM set a flag and wake any selector waiting on :meth:`fileno`."""

    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """True once a stop signal arrived."""
        return self.signal_name is not None

    def install(self) -> None:
        """Handle SIGINT and SIGTERM from now on."""
        signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        """Restore the previous handlers."""
        signal.set_wakeup_fd(-1)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._reader.close()
        self._writer.close()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signal_name = signal.Signals(signum).name

    def fileno(self) -> int:
        """A descriptor that becomes readable when a signal arrives."""
        return self._reader.fileno()

    def drain(self) -> None:
        """Empty the wake-up socket."""
        try:
            while self._reader.recv(4096):
                pass
        except BlockingIOError:
            pass

    def sleep(self, seconds: float, on_tick: Callable[[], None] | None = None) -> None:
        """Sleep, waking early when a stop signal arrives; call ``on_tick`` 4 times a second."""
        deadline = time.monotonic() + seconds
        while not self.requested and (left := deadline - time.monotonic()) > 0:
            pause(self, min(left, TICK_SECONDS))
            if on_tick is not None:
                on_tick()


def backoff_delay(attempt: int, base: float, cap: float,
                  rand: Callable[[], float] = random.random) -> float:
    """Capped exponential backoff with jitter: base * 2^(attempt-1), capped, times 0.8-1.2."""
    if base == 0:
        return 0.0
    delay = min(cap, base * 2 ** max(0, attempt - 1))
    return float(min(cap, delay * (0.8 + 0.4 * rand())))


def prompt_password() -> str | None:
    """Ask on the terminal, as pg_receivewal does when the server wants a password."""
    if not sys.stdin.isatty():
        return None
    return getpass.getpass("Password: ")


class Supervisor:
    """Runs sessions until told to stop, reconnecting after failures.

    What the sessions, the supervisor and the uploader report goes into one
    :class:`EventStream`: its consumers are the log (unless ``log_events`` is false: the
    drop-in words every event itself), then the monitor (once made), then ``listeners`` (the
    drop-in's pg_receivewal messages)."""

    def __init__(self, settings: Settings, prompt: Callable[[], str | None] | None =
                 prompt_password, listeners: tuple[Listener, ...] = (), *,
                 log_events: bool = True) -> None:
        self.settings = settings
        self.log = get_logger()
        self.prompt = prompt
        self.stop = StopSignal()
        self.listeners = listeners
        logged = (EventLog(self.log),) if log_events else ()
        self.events = EventStream(*logged, *listeners)
        self._listing: Listing | None = None  # the lock's listing, for the first session

    def connect(self) -> ReplicationConnection:
        """Open a replication connection (the password never reaches a log line)."""
        self.events(Connecting(redacted(self.settings.conninfo)))
        return ReplicationConnection.open(self.settings.conninfo, self.prompt, stop=self.stop,
                                          timeout=self.settings.receive_timeout)

    def slot_command(self) -> int:
        """--create-slot / --drop-slot: act and exit, as pg_receivewal does."""
        slot = self.settings.slot
        assert slot is not None
        conn = self.connect()
        try:
            if self.settings.drop_slot:
                self.events(SlotDropping(slot))
                drop_slot(conn, slot)
            else:
                self.events(SlotCreating(slot, self.settings.reserve_wal))
                created = create_slot(conn, slot, reserve_wal=self.settings.reserve_wal,
                                      if_not_exists=self.settings.if_not_exists)
                if not created:
                    self.events(SlotExisted(slot))
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
        assert self.settings.directory is not None
        archive = Archive(self.settings.directory, sync=self.settings.sync)
        try:
            self._listing = archive.lock()  # one writer per archive, before touching anything
            for name in self._listing.removed:
                self.events(TemporaryFileRemoved(name))
            archive.check_usable()
        except ReceivewalError as exc:
            self.events(Failed(str(exc)))
            return 1
        try:
            uploads = self._uploader(archive)
            monitor = Monitor(self.settings.directory, self.settings.metrics_address,
                              keeps_partials=not self.settings.at_rest.method,
                              progress=self.settings.progress, file_mode=archive.file_mode)
        except ReceivewalError as exc:
            self.events(Failed(str(exc)))
            return 1
        # the monitor before the listeners, so that the drop-in's line follows the log's
        self.events.subscribe(monitor, before=self.listeners[0] if self.listeners else None)
        self.stop.install()
        try:
            code = self._loop(archive, uploads)
            if uploads is not None and uploads.started and not self.stop.requested:
                code = self._finish_uploads(uploads, code)
            return code
        finally:
            if uploads is not None:
                uploads.close()
            self.events(Stopping())
            monitor.close()
            self.stop.uninstall()
            archive.unlock()

    def _uploader(self, archive: Archive) -> Uploader | None:
        """The uploader of --upload-to (its client is made now; nothing is sent yet)."""
        if self.settings.upload_to is None:
            return None
        from receivewal.archive.bucket import Bucket  # noqa: PLC0415 - only with --upload-to
        from receivewal.daemon.uploader import (  # noqa: PLC0415
            ONE_TRY,
            Uploader,
            retry_policy,
            upload_patience,
        )

        bucket = Bucket.connect(self.settings.upload_to, ONE_TRY, upload_patience(os.environ))
        return Uploader(archive, bucket, self.log, retry_policy(os.environ), self.events,
                        environ=os.environ)

    def _finish_uploads(self, uploads: Uploader, code: int) -> int:
        """An exit no signal asked for (--endpos, --no-loop): wait for the completed files to
        go up, at most --upload-wait seconds (less when a stop signal comes or the uploads are
        stopped at an object); the exit code, 1 with a line naming what is left."""
        deadline = time.monotonic() + self.settings.upload_wait
        while (left := uploads.waiting()) and uploads.running \
                and uploads.status().stopped is None and not self.stop.requested \
                and (wait := deadline - time.monotonic()) > 0:
            self.stop.sleep(min(wait, TICK_SECONDS), on_tick=self._tick)
        if not left:
            return code
        status = uploads.status()
        if status.stopped is not None:
            why = f"the uploads are stopped: {status.stopped.message}"
        elif self.stop.requested:
            why = f"{self.stop.signal_name} came while they were uploaded"
        else:
            why = f"not within --upload-wait {self.settings.upload_wait:g} s"
            if status.failing_since is not None and status.last_error is not None:
                why += f"; the last try failed: {status.last_error.message}"
        self.events(Failed(f"{len(left)} completed files not uploaded to {status.destination}"
                           f" ({left[0]} .. {left[-1]}), {why}; they stay in the archive "
                           "directory and go up at the next run"))
        return 1

    def _loop(self, archive: Archive, uploads: Uploader | None) -> int:
        attempt = 0
        connected_once = False
        while True:
            streamed = False
            try:
                conn = self.connect() if connected_once or not self.settings.wait_for_server \
                    else self._wait_for_server()
            except ReceivewalError as exc:
                if not connected_once and not self.stop.requested:
                    self.events(Failed(str(exc)))
                    return 1
                error: ReceivewalError = exc
            else:
                connected_once = True
                session = Session(conn, settings=self.settings, archive=archive,
                                  events=self.events, stop=self.stop, uploads=uploads,
                                  listing=self._listing)
                self._listing = None  # later sessions list the archive as it is then
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
                self.events(Failed(str(error), kind))
                return 1
            if isinstance(error, WalRemovedError):
                self.events(GapDetected(str(error)))
            if isinstance(error, DiskFullError):
                self.events(DiskFull(str(error), str(archive.directory)))
            self.events(Disconnected(str(error), kind))
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
                self._listing = None  # the wait may be long: the session lists anew
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

