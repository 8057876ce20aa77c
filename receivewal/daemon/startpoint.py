"""Where streaming starts: pg_receivewal's FindStreamingStart, apart from the COPY loop.

Once per connection, before START_REPLICATION, :func:`find_start` identifies the server,
makes sure the archive is its (the identity file; with --upload-to the bucket's prefix,
claimed before anything is written), reads what the archive holds (:func:`read_archive`: the
newest segment file whose content proves it, the files passed over, the islands of older
segments before a hole, where to restream from), leaves one ``.partial`` per segment, reads
(or creates) the slot when the archive has nothing, chooses the start as pg_receivewal does,
and checks that the start's timeline leads to the server's. What it finds it states as typed
events on the way, defined here (:class:`SegmentFileRejected`, :class:`OlderIsland`,
:class:`PartialFileSettled`...); what it returns is a :class:`Start`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from receivewal.archive.directory import Archive, RejectedFile, os_error
from receivewal.archive.identity import ArchiveIdentity
from receivewal.archive.layout import StartPoint, choose_start, island_names
from receivewal.archive.listing import Listing
from receivewal.archive.partials import settle_partials
from receivewal.archive.reading import HISTORY_FILE_CAP, read_small_file
from receivewal.archive.recipients import RecipientSet, adopting
from receivewal.archive.sealed import Sealing
from receivewal.archive.syncer import restart_point
from receivewal.daemon import events as ev
from receivewal.daemon.events import Event, SessionMonitor
from receivewal.daemon.settings import Settings
from receivewal.errors import ArchiveError, ServerError
from receivewal.replication.commands import (
    ServerInfo,
    create_slot,
    identify_server,
    read_slot,
    slot_exists,
    timeline_history,
)
from receivewal.replication.link import ReplicationLink
from receivewal.wal.names import SegmentFile, history_file_name
from receivewal.wal.timeline import check_follows, parse_history

if TYPE_CHECKING:  # loaded only with --upload-to
    from receivewal.daemon.uploader import Uploader


# -- the findings, as the events that state them ---------------------------------------------
@dataclass(frozen=True, slots=True)
class FileModeChosen(Event):
    """The archive's files (and the state file) get ``file_mode``, the server's group access."""

    file_mode: int

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.file_mode = self.file_mode


@dataclass(frozen=True, slots=True)
class SlotState(Event):
    """The replication slot's restart_lsn as the server reports it (None: unknown)."""

    slot: str | None
    restart_lsn: int | None

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.slot_state(self.slot, self.restart_lsn)


@dataclass(frozen=True, slots=True)
class ArchiveWarning(Event):
    """What is wrong with the archive that streaming goes on despite (None: nothing)."""

    text: str | None

    def tell(self, monitor: SessionMonitor) -> None:
        monitor.archive_warning(self.text)


@dataclass(frozen=True, slots=True)
class SegmentFileRejected(Event):
    """Start-up passed ``file`` over as the resume point: its content does not prove it."""

    name, level = "segment_file_rejected", "warning"
    file: str
    reason: str


@dataclass(frozen=True, slots=True)
class OlderIsland(Event):
    """Segments ``first`` .. ``last`` lie before a hole (``missing_from`` .. ``missing_to``):
    streaming never resumes there."""

    name, level = "older_island", "warning"
    first: str
    last: str
    missing_from: str
    missing_to: str
    reason: str = "before a hole: streaming resumes after the newest run"


@dataclass(frozen=True, slots=True)
class PartialFileSettled(Event):
    """Start-up left one ``.partial`` per segment: what it did to ``file``."""

    name, level = "partial_file_settled", "warning"
    file: str
    action: str


@dataclass(frozen=True, slots=True)
class SlotCreated(Event):
    """--create-slot-if-missing created the replication slot the server lacked."""

    name, level = "replication_slot_created", "warning"
    slot: str
    server: str
    reason: str = "missing on this server (--create-slot-if-missing)"


@dataclass(frozen=True)
class ArchiveFindings:
    """What the archive directory holds, as start-up reads it (nothing written)."""

    files: list[SegmentFile]  # every segment file, by name
    newest: SegmentFile | None  # the newest one whose content proves it
    rejected: list[RejectedFile]  # the newer ones passed over, newest first
    islands: list[tuple[str, str, str, str]]  # older runs before a hole: first, last, hole
    restart: SegmentFile | None  # where streaming restarts: the oldest of a run of .partial

    def events(self) -> list[Event]:
        """The findings as the events that state them."""
        found: list[Event] = [SegmentFileRejected(r.file, r.reason) for r in self.rejected]
        found += [OlderIsland(*island) for island in self.islands]
        found.append(ArchiveWarning("; ".join(
            f"older island {first} .. {last} before a hole ({hole_from} .. {hole_to} missing), "
            "not resumed from" for first, last, hole_from, hole_to in self.islands) or None))
        return found


@dataclass(frozen=True)
class Start:
    """Where a connection starts streaming (``point``), on the server it identified;
    ``sealing``: what completed segments are sealed with (``--encrypt-to``), its set recorded
    in the archive's identity record."""

    info: ServerInfo
    point: StartPoint
    sealing: Sealing | None = None


def claimed_identity(archive: Archive, identity: ArchiveIdentity,
                     recipients: RecipientSet | None) -> ArchiveIdentity:
    """The identity a bucket's prefix is claimed with: the server's, with the recipient sets
    the archive's record lists and ``recipients`` (``--encrypt-to``) as the newest."""
    if recipients is None:
        return identity
    recorded = archive.read_identity()
    sets = () if recorded is None else recorded.recipient_sets
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return replace(identity, recipient_sets=adopting(sets, recipients, since))


def read_archive(archive: Archive, files: list[SegmentFile], info: ServerInfo,
                 ) -> ArchiveFindings:
    """Read what ``archive`` holds (``files``: its segment files, by name) for the server
    ``info``."""
    newest, rejected = archive.resume_point(info.segment_size, int(info.system_identifier),
                                            files)
    return ArchiveFindings(files, newest, rejected,
                           island_names(files, newest, info.segment_size),
                           restart_point(newest, files))


def find_start(conn: ReplicationLink, archive: Archive, listing: Listing, settings: Settings,
               *, events: ev.Listener, stopping: Callable[[], bool],
               uploads: Uploader | None = None) -> Start:
    """Identify the server, check the archive is its, and choose where to start (see the
    module's docstring); ``stopping`` says whether a stop signal came."""
    info = identify_server(conn)
    identity = ArchiveIdentity(info.system_identifier, info.segment_size, info.timeline)
    # before the uploader's thread starts: it writes the upload record
    events(FileModeChosen(archive.adopt_file_mode(info.file_mode)))
    if uploads is not None:  # another cluster's prefix: refused before any write
        uploads.begin(claimed_identity(archive, identity, settings.encrypt_to), listing,
                      stopping)
    files = listing.segments(info.segment_size)
    archive.adopt_identity(identity, files)
    sealing = None
    if settings.encrypt_to is not None:  # recorded before anything is encrypted to it
        sealing = Sealing(settings.encrypt_to,
                          archive.adopt_recipients(settings.encrypt_to))
    found = read_archive(archive, files, info)
    for event in found.events():
        events(event)
    for settled in settle_partials(archive, info.segment_size, found.files, settings.at_rest,
                                   found.restart):
        events(PartialFileSettled(settled.file, settled.action))
    slot_restart = None
    # as pg_receivewal: the slot's position only matters when the archive has none
    if settings.slot and info.version >= 150000 \
            and (found.restart is None or settings.create_slot_if_missing):
        slot_restart = _read_or_create_slot(conn, settings, events)
        events(SlotState(settings.slot, slot_restart[0] if slot_restart else None))
    point = choose_start(found.restart, slot_restart, (info.xlogpos, info.timeline),
                         info.segment_size)
    if point.timeline > info.timeline:
        raise ArchiveError(f"starting timeline {point.timeline} is not present in the "
                           f"server (the server is on timeline {info.timeline})")
    if point.timeline < info.timeline:
        history = parse_history(fetch_history(conn, archive, info.timeline, events),
                                info.timeline)
        check_follows(point.timeline, point.lsn, history, info.timeline)
    if uploads is not None:
        uploads.streaming_from(point.lsn)
    return Start(info, point, sealing)


def fetch_history(conn: ReplicationLink, archive: Archive, timeline: int,
                  events: ev.Listener) -> str:
    """The history file of ``timeline``: from the archive, else from the server (stored, and
    stated: :class:`~receivewal.daemon.events.HistoryFileWritten`)."""
    path = archive.directory / history_file_name(timeline)
    try:
        return read_small_file(path, HISTORY_FILE_CAP).decode()
    except FileNotFoundError:
        pass
    except OSError as exc:  # out of descriptors stays retryable
        raise os_error(exc, f'cannot read history file "{path}"') from exc
    except UnicodeDecodeError as exc:
        raise ArchiveError(f'history file "{path}" is not text: {exc}') from exc
    name, content = timeline_history(conn, timeline)
    archive.write_history(name, content.encode())
    events(ev.HistoryFileWritten(name, timeline))
    return content


def _read_or_create_slot(conn: ReplicationLink, settings: Settings,
                         events: ev.Listener) -> tuple[int, int] | None:
    """READ_REPLICATION_SLOT; with --create-slot-if-missing, create a missing slot."""
    slot = settings.slot
    assert slot is not None
    try:
        return read_slot(conn, slot)
    except ServerError:
        if not settings.create_slot_if_missing or slot_exists(conn, slot):
            raise
    create_slot(conn, slot, reserve_wal=True, if_not_exists=True)
    events(SlotCreated(slot, conn.describe()))
    return read_slot(conn, slot)
