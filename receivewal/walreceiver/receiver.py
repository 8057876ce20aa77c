"""The WAL archive as what the daemon receives into, across its connections.

The supervisor (:mod:`receivewal.daemon.supervisor`) runs a
:class:`~receivewal.daemon.supervisor.Receiver` and does the rest itself (signals,
connections, reconnects, exit codes, the event stream and the monitor). :class:`WalReceiver`
is physical streaming's: --create-slot and --drop-slot; the archive directory's one-writer
lock (the temporary files a crashed writer left are removed); the uploader of --upload-to and
the local copy's rule of --keep-local (:mod:`receivewal.walreceiver.localcopy`); one
:class:`~receivewal.walreceiver.session.Session` per connection; and, before an exit no stop signal
asked for, the wait for the uploads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from receivewal.archive.directory import Archive
from receivewal.archive.listing import Listing
from receivewal.daemon.events import TICK_SECONDS, Event, EventStream, Listener
from receivewal.daemon.lifecycle import (
    SlotCreating,
    SlotDropping,
    SlotExisted,
    TemporaryFileRemoved,
    WaitingForServer,
)
from receivewal.daemon.settings import Settings
from receivewal.daemon.signals import StopSignal
from receivewal.daemon.state import previous_flush
from receivewal.replication.commands import create_slot, drop_slot
from receivewal.replication.link import ReplicationLink
from receivewal.replication.waiting import StopFlag
from receivewal.walreceiver.session import Session

if TYPE_CHECKING:  # the uploader's modules are loaded only with --upload-to
    from receivewal.walreceiver.archivemeter import ArchiveMeter
    from receivewal.walreceiver.localcopy import LocalCopy
    from receivewal.walreceiver.uploader import Uploader


class WalReceiver:
    """Physical streaming into the archive directory ``settings.directory``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.archive: Archive | None = None  # once open
        self.uploads: Uploader | None = None
        self.meter: ArchiveMeter | None = None  # with --metrics-address only
        self.local: LocalCopy | None = None  # with --keep-local only
        self._listing: Listing | None = None  # the lock's, for the first session
        self._last: Session | None = None
        # (timeline, LSN) up to which the WAL was durable when the last session ended: the
        # state file's (the last run's) for the first session
        self._previous: tuple[int, int] | None = None

    @property
    def file_mode(self) -> int:
        """The mode of the archive's files (the state file's too)."""
        return 0o600 if self.archive is None else self.archive.file_mode

    @property
    def kind(self) -> str:
        """WAL segments (the state file's ``receiver``)."""
        return "wal"

    def slot_command(self, conn: ReplicationLink, events: Listener) -> None:
        """--create-slot (--if-not-exists) or --drop-slot, as pg_receivewal acts on them."""
        slot = self.settings.slot
        assert slot is not None
        if self.settings.drop_slot:
            events(SlotDropping(slot))
            drop_slot(conn, slot)
            return
        events(SlotCreating(slot, self.settings.reserve_wal))
        if not create_slot(conn, slot, reserve_wal=self.settings.reserve_wal,
                           if_not_exists=self.settings.if_not_exists):
            events(SlotExisted(slot))

    def open(self, events: EventStream) -> None:
        """Become the archive's one writer, before touching anything; make the uploader of
        --upload-to (nothing is sent yet). Raises ReceivewalError."""
        assert self.settings.directory is not None
        archive = self.archive = Archive(self.settings.directory, sync=self.settings.sync)
        self._listing = archive.lock()
        for name in self._listing.removed:
            events(TemporaryFileRemoved(name))
        archive.check_usable()
        if not self.settings.at_rest.method:  # a plain .partial keeps what it held
            self._previous = previous_flush(archive.directory)
        events.subscribe(self._waited)
        self.uploads = self._uploader(archive, events)
        self.local = self._local_copy(archive, events)
        if self.settings.metrics_address is not None:
            from receivewal.walreceiver.archivemeter import (  # noqa: PLC0415 - with metrics only
                ArchiveMeter,
                measure_interval,
            )

            self.meter = ArchiveMeter(archive.directory, events, measure_interval(os.environ))
            self.meter.start()

    def session(self, conn: ReplicationLink, events: Listener, stop: StopFlag) -> Session:
        """The work of one connection (the first one uses the lock's listing); it takes over
        where the last one left the WAL durable."""
        assert self.archive is not None
        listing, self._listing = self._listing, None  # later sessions list the archive anew
        if self._last is not None:
            self._previous = self._last.durable
        self._last = Session(conn, settings=self.settings, archive=self.archive, events=events,
                             stop=stop, uploads=self.uploads, listing=listing,
                             previous=self._previous)
        return self._last

    def drain(self, stop: StopSignal, tick: Callable[[], None]) -> str | None:
        """Before an exit no stop signal asked for (--endpos, --no-loop): wait for the
        completed files to go up, at most --upload-wait seconds (less when a stop signal comes
        or the uploads are stopped at an object). What is left, in words (None: nothing)."""
        uploads = self.uploads
        if uploads is None or not uploads.started:
            return None
        deadline = time.monotonic() + self.settings.upload_wait
        while (left := uploads.waiting()) and uploads.running \
                and uploads.status().stopped is None and not stop.requested \
                and (wait := deadline - time.monotonic()) > 0:
            stop.sleep(min(wait, TICK_SECONDS), on_tick=tick)
        if not left:
            return None
        status = uploads.status()
        if status.stopped is not None:
            why = f"the uploads are stopped: {status.stopped.message}"
        elif stop.requested:
            why = f"{stop.signal_name} came while they were uploaded"
        else:
            why = f"not within --upload-wait {self.settings.upload_wait:g} s"
            if status.failing_since is not None and status.last_error is not None:
                why += f"; the last try failed: {status.last_error.message}"
        return (f"{len(left)} completed files not uploaded to {status.destination} "
                f"({left[0]} .. {left[-1]}), {why}; they stay in the archive directory and go "
                "up at the next run")

    def close(self) -> None:
        """Stop the uploads (an upload in flight gets a few seconds), the local copy's rule
        and the archive's meter."""
        if self.meter is not None:
            self.meter.close()
        if self.local is not None:
            self.local.close()
        if self.uploads is not None:
            self.uploads.close()

    def release(self) -> None:
        """Give the archive up (its lock)."""
        if self.archive is not None:
            self.archive.unlock()

    def _waited(self, event: Event) -> None:
        """A wait for the server may be long: the first session lists the archive anew."""
        if isinstance(event, WaitingForServer):
            self._listing = None

    def _uploader(self, archive: Archive, events: EventStream) -> Uploader | None:
        """The uploader of --upload-to (its client is made now; nothing is sent yet)."""
        if self.settings.upload_to is None:
            return None
        from receivewal.archive.bucket import Bucket  # noqa: PLC0415 - only with --upload-to
        from receivewal.daemon.uploadpolicy import (  # noqa: PLC0415
            ONE_TRY,
            retry_policy,
            upload_patience,
        )
        from receivewal.logs import get_logger  # noqa: PLC0415
        from receivewal.walreceiver.uploader import Uploader  # noqa: PLC0415

        bucket = Bucket.connect(self.settings.upload_to, ONE_TRY, upload_patience(os.environ))
        return Uploader(archive, bucket, get_logger(), retry_policy(os.environ), events,
                        environ=os.environ)

    def _local_copy(self, archive: Archive, events: EventStream) -> LocalCopy | None:
        """The local copy's rule of --keep-local, started (it removes only what the upload
        record says the bucket holds)."""
        rule, destination = self.settings.keep_local, self.settings.upload_to
        if rule is None or destination is None:
            return None
        from receivewal.logs import get_logger  # noqa: PLC0415
        from receivewal.walreceiver.localcopy import LocalCopy  # noqa: PLC0415 - with --keep-local

        local = LocalCopy(archive.directory, destination, rule, events,
                          get_logger(component="local-copy"), sync=self.settings.sync,
                          environ=os.environ)
        local.start()
        return local
