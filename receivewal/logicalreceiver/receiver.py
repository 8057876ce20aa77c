"""The logical change log as what the daemon receives into, across its connections.

The supervisor (:mod:`receivewal.daemon.supervisor`) runs a
:class:`~receivewal.daemon.supervisor.Receiver`; :class:`LogicalReceiver` is a logical slot's,
beside the WAL archive's (:mod:`receivewal.walreceiver.receiver`): --create-slot (LOGICAL, with
TWO_PHASE when --two-phase; with --snapshot, the published tables copied in the slot's
exported snapshot: :mod:`receivewal.logicalreceiver.snapshot`, imported only then) and
--drop-slot; OUTDIR's one-writer lock (the archive's, on the directory itself:
:mod:`receivewal.archive.lock`); the change log store, opened once (a crash is recovered from
there: the partial file cut after its last complete transaction) and closed at the end; one
:class:`~receivewal.logicalreceiver.session.LogicalSession` per connection.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from receivewal.archive.directory import Archive
from receivewal.daemon.events import TICK_SECONDS, EventStream, Listener
from receivewal.daemon.lifecycle import (
    SlotCreating,
    SlotDropping,
    SlotExisted,
    TemporaryFileRemoved,
)
from receivewal.daemon.signals import StopSignal
from receivewal.errors import ConfigurationError
from receivewal.logical.store import ChangeLogStore
from receivewal.logicalreceiver.logicalsettings import LogicalSettings
from receivewal.logicalreceiver.session import LogicalSession
from receivewal.replication.commands import create_logical_slot, drop_slot
from receivewal.replication.link import ReplicationLink, SessionLink
from receivewal.replication.waiting import StopFlag

if TYPE_CHECKING:  # the uploads' modules are loaded only with --upload-to
    from receivewal.logicalreceiver.changeuploads import ChangeUploader


class LogicalReceiver:
    """A logical slot streamed into the change log directory ``settings.base.directory``."""

    def __init__(self, settings: LogicalSettings) -> None:
        self.settings = settings
        self.directory: Archive | None = None  # its lock, once open
        self.store: ChangeLogStore | None = None
        self.uploads: ChangeUploader | None = None  # with --upload-to only

    @property
    def file_mode(self) -> int:
        """The mode of the change files (the state file's too)."""
        return 0o600 if self.directory is None else self.directory.file_mode

    @property
    def kind(self) -> str:
        """A change log (the state file's ``receiver``)."""
        return "logical"

    def slot_command(self, conn: ReplicationLink, events: Listener) -> None:
        """--create-slot (--if-not-exists) or --drop-slot. With -D, --create-slot checks the
        directory first (ArchiveError): a slot made for a change log that cannot be written
        would hold the server's WAL with nobody reading it."""
        base = self.settings.base
        slot = base.slot
        assert slot is not None
        if base.drop_slot:
            events(SlotDropping(slot))
            drop_slot(conn, slot)
            return
        if self.settings.snapshot:
            if not isinstance(conn, SessionLink):
                raise ConfigurationError("--snapshot needs a connection that can open another")
            from receivewal.logicalreceiver.snapshot import take_snapshot  # noqa: PLC0415

            take_snapshot(conn, self.settings, events)
            return
        if base.directory is not None:
            Archive(base.directory, sync=base.sync).check_usable()
        events(SlotCreating(slot, False))
        if not create_logical_slot(conn, slot, self.settings.plugin,
                                   two_phase=self.settings.two_phase,
                                   if_not_exists=base.if_not_exists):
            events(SlotExisted(slot))

    def open(self, events: EventStream) -> None:
        """Become OUTDIR's one writer, then open the change log (recovering from a crash).
        Raises ReceivewalError."""
        assert self.settings.base.directory is not None
        directory = self.directory = Archive(self.settings.base.directory,
                                             sync=self.settings.base.sync)
        listing = directory.lock()
        for name in listing.removed:
            events(TemporaryFileRemoved(name))
        directory.check_usable()
        self.store = self._open_store()
        self.uploads = self._uploader(events)

    def session(self, conn: ReplicationLink, events: Listener, stop: StopFlag) -> LogicalSession:
        """The work of one connection: it streams from where the change log ends."""
        return LogicalSession(conn, settings=self.settings, store=self._usable_store,
                              events=events, stop=stop)

    def _open_store(self) -> ChangeLogStore:
        assert self.directory is not None
        return ChangeLogStore.open(self.directory.directory,
                                   self.settings.store_settings(self.directory.file_mode))

    def _usable_store(self) -> ChangeLogStore:
        """The change log for the next session: after a failed write (the disk full) it is
        closed and opened again, which cuts the partial file after its last complete run, as
        after a crash (the supervisor retries a full disk as it does for ``stream``)."""
        store = self.store
        assert store is not None
        if store.broken:
            self.store = None
            store.close()
            self.store = store = self._open_store()
        return store

    def drain(self, stop: StopSignal, tick: Callable[[], None]) -> str | None:
        """With --upload-to, before an exit no stop signal asked for: wait at most
        --upload-wait seconds for the completed files to go up; what is left, in words."""
        uploads = self.uploads
        if uploads is None:
            return None
        deadline = time.monotonic() + self.settings.base.upload_wait
        while (left := uploads.pending()) and not stop.requested \
                and (wait := deadline - time.monotonic()) > 0:
            stop.sleep(min(wait, TICK_SECONDS), on_tick=tick)
        if not left:
            return None
        return (f"{len(left)} completed change files not uploaded to {uploads.destination} "
                f"({left[0]} .. {left[-1]}); they stay in OUTDIR and go up at the next run")

    def close(self) -> None:
        """Stop the uploads; make the change log durable and close it (the partial file stays
        to be resumed)."""
        if self.uploads is not None:
            self.uploads.close()
        if self.store is not None:
            store, self.store = self.store, None
            store.close()

    def release(self) -> None:
        """Give OUTDIR up (its lock)."""
        if self.directory is not None:
            self.directory.unlock()

    def _uploader(self, events: EventStream) -> ChangeUploader | None:
        """The uploads of --upload-to (and --keep-local's rule), begun."""
        base = self.settings.base
        if base.upload_to is None or self.directory is None:
            return None
        from receivewal.archive.bucket import Bucket  # noqa: PLC0415 - only with --upload-to
        from receivewal.daemon.uploadpolicy import (  # noqa: PLC0415
            ONE_TRY,
            retry_policy,
            upload_patience,
        )
        from receivewal.logicalreceiver.changeuploads import ChangeUploader  # noqa: PLC0415
        from receivewal.logs import get_logger  # noqa: PLC0415

        bucket = Bucket.connect(base.upload_to, ONE_TRY, upload_patience(os.environ))
        uploads = ChangeUploader(self.directory.directory, bucket, events,
                                 get_logger(component="change-uploads"),
                                 retry_policy(os.environ), keep=base.keep_local,
                                 mode=self.directory.file_mode,
                                 sealed=base.encrypt_to is not None, sync=base.sync,
                                 environ=os.environ)
        uploads.begin()
        return uploads
