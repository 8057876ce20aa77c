"""An archive wherever it lives, seen once: the user's text made a location (:func:`locate`),
and what every command asks of an archive read from it once (:class:`ArchiveView`).

The view lists the location once and keeps what it read: the files and their sizes, the
identity record, the timeline histories (:func:`read_histories`: the one reader of history
files), the segments held, the segment size (by :func:`~receivewal.archive.sources.
decide_segment_size`'s one rule) and the listing of ``backups/``, which
:func:`receivewal.backup.catalog.catalog_of` reads as the catalog of backups. ``cleanup``,
``backup``, ``recover`` and ``verify``'s backups ask it the same questions for a directory and
a bucket.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from receivewal.archive.identity import IDENTITY_FILE, ArchiveIdentity, sealed_fingerprints
from receivewal.archive.location import DirectoryLocation, Location, is_bucket_url
from receivewal.archive.reading import HISTORY_FILE_CAP
from receivewal.errors import ArchiveError, StoreError
from receivewal.wal.names import (
    AtRest,
    encrypted_file_name,
    is_other_wal_file_name,
    looks_like_segment,
    parse_encrypted_segment_name,
    parse_history_file_name,
    parse_segment_file_name,
    unsealed_name,
)
from receivewal.wal.timeline import TimelineSwitch, parse_history

if TYPE_CHECKING:
    from receivewal.archive.sources import ArchiveSource

def locate(text: str) -> Location:
    """The location the user's ``text`` names (:func:`~receivewal.archive.location.
    is_bucket_url` decides): a bucket's prefix (a client of the store, no request sent yet;
    ConfigurationError for a bad URL) or a directory (which need not exist: listing it says
    so)."""
    if is_bucket_url(text):
        from receivewal.archive.bucket import Bucket  # noqa: PLC0415 - boto3 only for a bucket

        return Bucket.connect(text)
    return DirectoryLocation(text)


def read_histories(location: Location, names: Iterable[str],
                   failed: list[tuple[str, Exception]] | None = None) -> dict[int, bytes]:
    """The history files among ``names`` at ``location``, by timeline, each read whole up to
    :data:`~receivewal.archive.reading.HISTORY_FILE_CAP`. One that cannot be read raises
    (ArchiveError naming it; a store's error as the store said it), or with ``failed`` goes
    there as (name, error) and is left out."""
    found = {}
    for name in names:
        timeline = parse_history_file_name(name)
        if timeline is None:
            continue
        try:
            found[timeline] = location.read_small(name, HISTORY_FILE_CAP)
        except OSError as exc:
            if failed is None:
                raise ArchiveError(f'could not read history file "{location.where(name)}": '
                                   f"{exc}") from exc
            failed.append((name, exc))
        except (ArchiveError, StoreError) as exc:
            if failed is None:
                raise
            failed.append((name, exc))
    return found


def parsed_histories(location: Location, raw: dict[int, bytes]
                     ) -> dict[int, list[TimelineSwitch]]:
    """The history files :func:`read_histories` read, parsed (ArchiveError naming one that is
    not text or not a history)."""
    found = {}
    for timeline, data in sorted(raw.items()):
        try:
            text = data.decode()
        except UnicodeDecodeError as exc:
            where = location.where(f"{timeline:08X}.history")
            raise ArchiveError(f'could not read history file "{where}": {exc}') from exc
        found[timeline] = parse_history(text, timeline)
    return found


def held_segments(names: Iterable[str], segment_size: int) -> set[str]:
    """The WAL file names of the segments ``names`` hold complete (plain, compressed or
    encrypted; never a ``.partial``)."""
    held = set()
    for name in names:
        segment = parse_segment_file_name(name, segment_size) \
            or parse_encrypted_segment_name(name, segment_size)
        if segment is not None and not segment.partial:
            held.add(segment.wal_name(segment_size))
    return held


def is_wal_archive(names: Iterable[str]) -> bool:
    """Whether a listing is a WAL archive's: its identity file (an archive stream has just
    created holds nothing else yet), or a WAL file in any form (a segment, plain, compressed,
    encrypted or ``.partial``; a history or backup history file), as a directory that
    archive_command fills holds without an identity file."""
    return any(name == IDENTITY_FILE or looks_like_segment(unsealed_name(name))
               or is_other_wal_file_name(name) for name in names)


def segment_forms(wal_name: str, fingerprints: tuple[str, ...] = ("",)) -> list[str]:
    """The file names a complete segment may have in an archive (sealed: to each set of
    ``fingerprints``, :func:`~receivewal.archive.identity.sealed_fingerprints`)."""
    plain = [wal_name + fmt.suffix for fmt in AtRest]
    return plain + [encrypted_file_name(name, fingerprint)
                    for fingerprint in fingerprints for name in plain]


class ArchiveView:
    """An archive (its WAL files, identity, histories and backups) as read once from its
    location; ask again with a new view."""

    def __init__(self, archive: str, location: Location) -> None:
        self.archive = archive  # the user's text, for messages
        self.location = location
        self.poll = 0.1 if location.is_local else 1.0  # seconds between looks for a segment
        self._files: list[tuple[str, int]] | None = None
        self._identity: tuple[ArchiveIdentity | None] | None = None
        self._histories: dict[int, list[TimelineSwitch]] | None = None
        self._under: dict[str, list[tuple[str, int]]] = {}

    @classmethod
    def open(cls, archive: str) -> ArchiveView:
        """The archive ``archive`` names: a directory (which must exist) or a bucket's
        prefix."""
        location = locate(archive)
        if location.is_local and not Path(archive).is_dir():
            raise ArchiveError(f"{archive} is not a directory")
        return cls(archive, location)

    @property
    def files(self) -> list[tuple[str, int]]:
        """(name, size) of the archive's files at its top, listed once."""
        if self._files is None:
            self._files = self.location.listing()
        return self._files

    @property
    def names(self) -> list[str]:
        """The names of the archive's files at its top, sorted."""
        return [name for name, _ in self.files]

    def identity(self) -> ArchiveIdentity | None:
        """The archive's identity record; None when it has none (ArchiveError naming it when
        it cannot be read or is no valid one)."""
        if self._identity is None:
            from receivewal.archive.identity import read_identity  # noqa: PLC0415

            self._identity = (read_identity(self.location) if IDENTITY_FILE in self.names
                              else None,)
        return self._identity[0]

    def histories(self) -> dict[int, list[TimelineSwitch]]:
        """The archive's timeline history files, parsed, by timeline."""
        if self._histories is None:
            self._histories = parsed_histories(
                self.location, read_histories(self.location, self.names))
        return self._histories

    def segment_size(self) -> int | None:
        """The archive's segment size by the one rule every reader takes it by
        (:func:`~receivewal.archive.sources.decide_segment_size`); None when nothing decides."""
        from receivewal.archive.sources import decide_segment_size  # noqa: PLC0415

        source = self.source()
        return decide_segment_size(self.identity(), source.base, self.names, source.open_binary)

    def held(self, segment_size: int) -> set[str]:
        """The segments the archive holds complete, as listed."""
        return held_segments(self.names, segment_size)

    def holds_segment(self, wal_name: str) -> bool:
        """Whether the archive holds the segment ``wal_name`` complete now (looked at again)."""
        return any(self.location.exists(name) for name in
                   segment_forms(wal_name, sealed_fingerprints(self.identity())))

    def files_under(self, folder: str) -> list[tuple[str, int]]:
        """(name from the top, size) of every file under ``folder`` (``backups``: the base
        backups'), listed once."""
        if folder not in self._under:
            self._under[folder] = self.location.listing(folder)
        return self._under[folder]

    def source(self) -> ArchiveSource:
        """The archive's files as verify's and analyze's readers take them."""
        from receivewal.archive.sources import ArchiveSource, BucketOpener  # noqa: PLC0415

        if self.location.is_local:
            return ArchiveSource(str(self.archive), None, tuple(self.files))
        from receivewal.archive.bucket import Bucket  # noqa: PLC0415 - a bucket's location

        assert isinstance(self.location, Bucket)  # what is_local says
        base = self.location.where()
        return ArchiveSource(base, BucketOpener(base, self.location), tuple(self.files))
