"""Where streaming starts: pg_receivewal's FindStreamingStart, apart from the COPY loop.

Once per connection, before START_REPLICATION, :func:`find_start` identifies the server,
makes sure the archive is its (the identity file; with --upload-to the bucket's prefix,
claimed before anything is written), checks the archive against the server's timeline
history (:class:`ServerHistory`: another branch under one of its timeline IDs is refused
before anything is written), reads what the archive holds along that history
(:func:`read_archive`: the newest segment file whose content proves it, the files passed over,
the islands of older segments before a hole, where to restream from), follows a fork that
lies inside what the archive holds (:class:`ForkInsideArchive`: after a point-in-time
recovery the old timeline's files past the fork stay, and the new timeline starts at the
segment holding the fork), leaves one ``.partial`` per segment, reads (or creates) the slot
when the archive has nothing, chooses the start as pg_receivewal does, checks that the
start's timeline leads to the server's, and stores the server's history file. What it finds
it states as typed events on the way, defined here (:class:`SegmentFileRejected`,
:class:`OlderIsland`, :class:`PartialFileSettled`...); what it returns is a :class:`Start`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from receivewal.archive.directory import Archive, RejectedFile, os_error
from receivewal.archive.identity import ArchiveIdentity
from receivewal.archive.layout import (
    StartPoint,
    before_its_timeline,
    choose_start,
    island_names,
    on_path,
)
from receivewal.archive.listing import Listing
from receivewal.archive.partials import partial_end, settle_partials
from receivewal.archive.reading import HISTORY_FILE_CAP, read_small_file
from receivewal.archive.recipients import RecipientSet, adopting
from receivewal.archive.sealed import Sealing
from receivewal.archive.syncer import restart_point
from receivewal.daemon import events as ev
from receivewal.daemon.events import Event, SessionMonitor
from receivewal.daemon.settings import Settings
from receivewal.errors import ArchiveError, ConfigurationError, ServerError
from receivewal.replication.commands import (
    ServerInfo,
    create_slot,
    identify_server,
    read_slot,
    slot_exists,
    timeline_history,
)
from receivewal.replication.link import ReplicationLink
from receivewal.wal.lsn import format_lsn, round_down_to_segment
from receivewal.wal.majors import server_major_problem
from receivewal.wal.names import SegmentFile, history_file_name
from receivewal.wal.timeline import (
    TimelineSwitch,
    ancestors_of,
    check_follows,
    describe_fork,
    parse_history,
    switchpoint_of,
    timeline_of,
    timeline_spans,
)

if TYPE_CHECKING:  # loaded only with --upload-to
    from receivewal.walreceiver.uploader import Uploader


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
    module's docstring); ``stopping`` says whether a stop signal came.

    Everything that can refuse the server is decided before the archive is changed: its
    identity, the server's timeline history against the archive's history files and
    segments; only then are ``.partial`` files settled and the history file written."""
    info = identify_server(conn)
    unknown = server_major_problem(info.version)  # its WAL would be refused on every restart
    if unknown is not None:
        raise ConfigurationError(unknown)
    identity = ArchiveIdentity(info.system_identifier, info.segment_size, info.timeline)
    # before the uploader's thread starts: it writes the upload record
    events(FileModeChosen(archive.adopt_file_mode(info.file_mode)))
    if uploads is not None:  # another cluster's prefix: refused before any write
        uploads.begin(claimed_identity(archive, identity, settings.encrypt_to), listing,
                      stopping)
    files = listing.segments(info.segment_size)
    archive.adopt_identity(identity, files)
    server_history = ServerHistory.read(conn, archive, info.timeline)
    path_files = server_history.check_archive(archive, files, info.segment_size)
    sealing = None
    if settings.encrypt_to is not None:  # recorded before anything is encrypted to it
        sealing = Sealing(settings.encrypt_to,
                          archive.adopt_recipients(settings.encrypt_to))
    found = read_archive(archive, path_files, info)
    for event in found.events():
        events(event)
    forked = _past_fork(archive, found, files, server_history, info)
    if forked is not None:
        events(forked)
    for settled in settle_partials(archive, info.segment_size, found.files, settings.at_rest,
                                   None if forked is not None else found.restart):
        events(PartialFileSettled(settled.file, settled.action))
    slot_restart = None
    # as pg_receivewal: the slot's position only matters when the archive has none
    if settings.slot and info.version >= 150000 \
            and (found.restart is None or settings.create_slot_if_missing):
        slot_restart = _read_or_create_slot(conn, settings, events)
        events(SlotState(settings.slot, slot_restart[0] if slot_restart else None))
    point = choose_start(found.restart, slot_restart, (info.xlogpos, info.timeline),
                         info.segment_size)
    if forked is not None:
        point = StartPoint(forked.start, forked.timeline, "archive")
    if point.timeline > info.timeline:
        raise ArchiveError(f"starting timeline {point.timeline} is not present in the "
                           f"server (the server is on timeline {info.timeline})")
    check_follows(point.timeline, point.lsn, server_history.entries, info.timeline)
    server_history.store(archive, events)
    if uploads is not None:
        uploads.streaming_from(point.lsn)
    return Start(info, point, sealing)


@dataclass(frozen=True)
class ServerHistory:
    """The server's timeline history (``text``, its history file; None on timeline 1), as
    start-up checks the archive against it."""

    timeline: int
    text: str | None
    entries: list[TimelineSwitch]
    stored: bool  # the archive holds the history file already

    @classmethod
    def read(cls, conn: ReplicationLink, archive: Archive, timeline: int) -> ServerHistory:
        """TIMELINE_HISTORY of the server's timeline (nothing written)."""
        if timeline == 1:
            return cls(timeline, None, [], True)
        _, text = timeline_history(conn, timeline)
        return cls(timeline, text, parse_history(text, timeline),
                   archived_history(archive, timeline) is not None)

    def check_archive(self, archive: Archive, files: list[SegmentFile], segment_size: int,
                      ) -> list[SegmentFile]:
        """Refuse an archive whose timelines contradict the server's history (raises
        ArchiveError, before anything is written); the segment files on that history, which
        streaming may resume from. Files of a timeline past the point where the server's
        history left it (the branch a recovery to an earlier point left behind, or the old
        primary's) stay as they are: restore serves WAL by timeline."""
        newer = sorted(f for f in files if f.timeline > self.timeline)
        if newer:
            raise ArchiveError(
                f"the archive holds timeline {newer[-1].timeline} "
                f"({newer[-1].file_name(segment_size)}), newer than the server's timeline "
                f"{self.timeline}: not streaming an older timeline into it")
        for span in timeline_spans(self.entries, self.timeline)[1:]:
            recorded = archived_history(archive, span.timeline)
            if recorded is None:
                continue
            ours = parse_history(recorded, span.timeline)
            theirs = ancestors_of(span.timeline, self.entries)
            if ours != theirs:
                raise ArchiveError(
                    f"the archive's {history_file_name(span.timeline)} says "
                    f"{describe_fork(span.timeline, ours)}, but the server's history says "
                    f"{describe_fork(span.timeline, theirs)}: the archive's timeline "
                    f"{span.timeline} is another branch; not streaming into this archive")
        spans = timeline_spans(self.entries, self.timeline)
        early = before_its_timeline(files, spans, segment_size)
        if early is not None:
            segment, span = early
            raise ArchiveError(
                f"the archive holds {segment.file_name(segment_size)}, before the point "
                f"{format_lsn(span.begin)} where the server's timeline {span.timeline} began: "
                f"the archive's timeline {span.timeline} is another branch; not streaming "
                "into this archive")
        return [f for f in files if on_path(f, spans, segment_size)]

    def store(self, archive: Archive, events: ev.Listener) -> None:
        """Write the server's history file into the archive, when it lacks it (once the
        server is accepted)."""
        if self.text is None or self.stored:
            return
        name = history_file_name(self.timeline)
        archive.write_history(name, self.text.encode())
        events(ev.HistoryFileWritten(name, self.timeline))


@dataclass(frozen=True, slots=True)
class ForkInsideArchive(Event):
    """The server's history left ``left`` at ``fork``, inside what the archive holds of it
    (up to ``held``, ``branch`` files past the fork, kept as they are): streaming goes on on
    ``timeline`` at ``start``, the segment holding the fork."""

    name, lsns = "timeline_forked_inside_archive", ("fork", "held", "start")
    left: int
    fork: int
    held: int
    branch: int
    timeline: int
    start: int


def _past_fork(archive: Archive, found: ArchiveFindings, files: list[SegmentFile],
               history: ServerHistory, info: ServerInfo) -> ForkInsideArchive | None:
    """When the archive holds the timeline it resumes on up to or past the point where the
    server's history left that timeline (a recovery ended there, or a standby was promoted
    while the old primary went on): streaming continues on the timeline that followed, at
    the segment holding the fork, as pg_receivewal does at a timeline switch. None when the
    archive resumes before the fork (it streams the old timeline up to it first). ``files``:
    every segment file of the archive."""
    restart = found.restart
    if restart is None or restart.timeline == info.timeline:
        return None
    fork = switchpoint_of(restart.timeline, history.entries)
    if fork is None:
        return None  # check_follows says why
    size = info.segment_size
    held = restart.start_lsn(size) + (0 if restart.partial else size)
    if restart.partial and restart.segno == fork // size:
        held = partial_end(archive, restart, size)
    if held < fork:
        return None
    branch = [f for f in files if f.timeline == restart.timeline
              and f.start_lsn(size) + size > fork]
    end = max([held, *(f.start_lsn(size) + (0 if f.partial else size) for f in branch)])
    return ForkInsideArchive(restart.timeline, fork, end, len(branch),
                             timeline_of(fork, history.entries, info.timeline),
                             round_down_to_segment(fork, size))


def archived_history(archive: Archive, timeline: int) -> str | None:
    """The archive's history file of ``timeline``, None when it has none."""
    path = archive.directory / history_file_name(timeline)
    try:
        return read_small_file(path, HISTORY_FILE_CAP).decode()
    except FileNotFoundError:
        return None
    except OSError as exc:  # out of descriptors stays retryable
        raise os_error(exc, f'cannot read history file "{path}"') from exc
    except UnicodeDecodeError as exc:
        raise ArchiveError(f'history file "{path}" is not text: {exc}') from exc


def fetch_history(conn: ReplicationLink, archive: Archive, timeline: int,
                  events: ev.Listener) -> str:
    """The history file of ``timeline``: from the archive, else from the server (stored, and
    stated: :class:`~receivewal.daemon.events.HistoryFileWritten`)."""
    stored = archived_history(archive, timeline)
    if stored is not None:
        return stored
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
    except ServerError as exc:
        if slot_exists(conn, slot):
            raise
        if not settings.create_slot_if_missing:
            exc.hint = ("create it with --create-slot (receivewal stream --slot NAME "
                        "--create-slot, once), or start with --create-slot-if-missing")
            raise
    create_slot(conn, slot, reserve_wal=True, if_not_exists=True)
    events(SlotCreated(slot, conn.describe()))
    return read_slot(conn, slot)
