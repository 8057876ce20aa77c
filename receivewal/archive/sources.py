"""Where an archive's files are read from: a local directory or ``s3://BUCKET/PREFIX``.

Readers of a whole archive (verify, analyze) name files as ``BASE/<name>`` and open them with an
:data:`~receivewal.archive.compression.Opener`: the local one (regular files only, see
:mod:`receivewal.archive.reading`), or :class:`BucketOpener`, which streams the object from the
store (:meth:`~receivewal.archive.bucket.Bucket.open_object`). Everything after the open (the
decompression, the caps, the scanner) is the same code for both. The listing is the
location's (:class:`~receivewal.archive.view.ArchiveView` lists it once); analyze's archives in
a Hadoop file system, which Spark lists, are read as an :class:`OpenedLocation`.

An archive's segment size is decided here, by one rule for every reader
(:func:`decide_segment_size`: verify, analyze, restore from a directory or a bucket, the
prefetch filler), from the same inputs: the identity record, else the first page headers of
its segment files in name order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, cast

from receivewal.archive.compression import Opener, open_local, read_wal_file
from receivewal.archive.identity import IDENTITY_FILE, ArchiveIdentity, parse_identity_record
from receivewal.archive.location import Location
from receivewal.archive.reading import capped
from receivewal.errors import ArchiveError, ConfigurationError, StoreError
from receivewal.wal.names import at_rest_of, looks_like_segment
from receivewal.wal.pageheader import SIZE_OF_LONG_PHD, archive_segment_size, header_segment_size

if TYPE_CHECKING:
    from receivewal.archive.bucket import Bucket

IDENTITY_CAP = 64 * 1024  # an identity record is a few lines
_BUCKETS: dict[str, Bucket] = {}  # a worker's clients, one per archive: connect once


class BucketOpener:
    """Opens ``BASE/<name>`` by streaming the object ``PREFIX/<name>``. Picklable: the
    client stays behind, and a worker process or Spark task connects on its first call."""

    def __init__(self, base: str, bucket: Bucket | None = None) -> None:
        self.base, self._bucket = base, bucket

    def __getstate__(self) -> dict[str, object]:
        return {"base": self.base, "_bucket": None}

    def __call__(self, path: str) -> BinaryIO:
        root = self.base.rstrip("/") + "/"
        if not path.startswith(root):
            raise ArchiveError(f"{path} is not in the archive {self.base}")
        if self._bucket is None:
            self._bucket = _BUCKETS.get(self.base) or _BUCKETS.setdefault(
                self.base, connect(self.base))
        return cast(BinaryIO, self._bucket.open_object(path[len(root):]))


def connect(base: str) -> Bucket:
    """A client for the archive at ``base`` (no request sent yet)."""
    from receivewal.archive.bucket import Bucket  # noqa: PLC0415 - boto3 only if used

    return Bucket.connect(base)


@dataclass(frozen=True)
class ArchiveSource:
    """An archive's location, how to open its files, and its files (name, size if known)."""

    base: str
    open_binary: Opener | None  # None: local files
    files: tuple[tuple[str, int | None], ...]

    @property
    def names(self) -> list[str]:
        """The file names, sorted."""
        return [name for name, _ in self.files]

    @property
    def is_local(self) -> bool:
        """Whether the archive is a local directory."""
        return self.open_binary is None

    def path(self, name: str) -> str:
        """How readers name the file ``name``."""
        return self.base.rstrip("/") + "/" + name


class OpenedLocation(Location):
    """Files named ``BASE/<name>`` read through an opener, as a location to read from (analyze's
    archives in a Hadoop file system, read with pyarrow): nothing is listed or written here."""

    def __init__(self, base: str, open_binary: Opener | None) -> None:
        self.base, self.open_binary = base.rstrip("/"), open_binary

    def where(self, name: str = "") -> str:
        return f"{self.base}/{name}" if name else self.base

    def open(self, name: str) -> BinaryIO:
        return (self.open_binary or open_local)(self.where(name))

    def read_small(self, name: str, cap: int) -> bytes:
        with self.open(name) as fh:
            return capped(fh, cap, self.where(name))


def read_capped(path: str, cap: int, open_binary: Opener | None = None) -> bytes:
    """A small file's content (at most ``cap`` bytes, else ArchiveError naming it). Raises
    OSError for a local file that cannot be read, ArchiveError for an object that cannot."""
    try:
        with (open_binary or open_local)(path) as fh:
            return capped(fh, cap, path)
    except StoreError as exc:
        raise ArchiveError(str(exc)) from exc


def recorded_identity(base: str, names: Iterable[str],
                      open_binary: Opener | None = None) -> ArchiveIdentity | None:
    """The archive's identity record (its file among ``names``, at ``base``: the identity
    object of a bucket prefix); None when it has none. ArchiveError naming the record when it
    cannot be read or is not a valid one."""
    if IDENTITY_FILE not in names:
        return None
    path = base.rstrip("/") + "/" + IDENTITY_FILE
    try:
        body = read_capped(path, IDENTITY_CAP, open_binary)
    except OSError as exc:
        raise ArchiveError(f'invalid archive identity file "{path}": {str(exc)[:200]}'
                           ) from exc
    return parse_identity_record(body, path)


def decide_segment_size(identity: ArchiveIdentity | None, base: str, names: Iterable[str],
                        open_binary: Opener | None = None,
                        problems: list[ArchiveError] | None = None) -> int | None:
    """The archive's segment size, by the one rule every reader takes it by
    (:func:`~receivewal.wal.pageheader.archive_segment_size`): its identity record's
    (``identity``, validated), else the size most of its segment files' first page headers
    state, a header counting only where its page address is where its file name puts it.
    ``names`` are the archive's file names (its listing, sorted), iterated only when there is
    no identity record, and read as :func:`segment_heads` reads them (what makes a file
    unusable goes to ``problems``). None when nothing decides: the caller then takes
    PostgreSQL's default (verify first says why no file could be read)."""
    recorded = None if identity is None else identity.segment_size
    return archive_segment_size(recorded, segment_heads(base, names, open_binary, problems))


def segment_heads(base: str, names: Iterable[str], open_binary: Opener | None = None,
                  problems: list[ArchiveError] | None = None) -> Iterator[tuple[str, bytes]]:
    """(name, first bytes) of each segment-named file among ``names``, read when asked for;
    what makes one unusable (unreadable, or without a valid header) goes to ``problems``."""
    for name in names:
        if not looks_like_segment(name):
            continue
        path = base.rstrip("/") + "/" + name
        try:
            head = read_wal_file(path, at_rest_of(name), SIZE_OF_LONG_PHD, open_binary)
            header_segment_size(head)
        except ArchiveError as exc:
            if problems is not None:
                problems.append(exc)
            continue
        except ConfigurationError as exc:
            if problems is not None:
                problems.append(ArchiveError(f"{path}: {exc}"))
        yield name, head
