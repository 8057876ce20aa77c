"""The archive as the spool of uploads: which completed files the object store has.

A file is pending upload once it is complete and durable in the archive directory: a segment
without ``.partial`` (in its at-rest format, ``-Z``) or a ``.history`` file. Uploads go in
order, so one small record says what is done: the last segment confirmed uploaded and the
history files confirmed uploaded, for one destination (``s3://BUCKET/PREFIX``). The record is
the dotfile ``.receivewal-uploaded.json``, rewritten durably (temporary file, fsync, rename,
fsync of the directory) after each confirmed upload. A crash between an upload and its record
only means the next run uploads that file again, which the store's create-only put answers
with "the same object is there": success. The bucket is never listed to decide any of this.

Nothing local is ever deleted here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from receivewal.archive.directory import Archive
from receivewal.archive.listing import Listing
from receivewal.archive.reading import read_small_file
from receivewal.errors import ArchiveError
from receivewal.wal.names import SegmentFile, parse_archive_segment_name, parse_history_file_name

UPLOADED_FILE = ".receivewal-uploaded.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class PendingFile:
    """A completed archive file waiting for its upload."""

    name: str
    size: int
    completed_at: float  # its modification time: when it became complete


@dataclass(frozen=True)
class UploadRecord:
    """What is confirmed uploaded to ``destination``: every segment up to ``segment`` (the file
    name as it stands in the archive) and the ``history`` files."""

    destination: str
    segment: str | None = None
    history: tuple[str, ...] = ()

    def with_uploaded(self, name: str, segment_size: int) -> UploadRecord:
        """The record once ``name`` is confirmed uploaded too."""
        if parse_history_file_name(name) is not None:
            return UploadRecord(self.destination, self.segment,
                                tuple(sorted({*self.history, name})))
        if self.segment is None or upload_order(name, segment_size) > \
                upload_order(self.segment, segment_size):
            return UploadRecord(self.destination, name, self.history)
        return self

    def covers(self, name: str, segment_size: int) -> bool:
        """Whether ``name`` is confirmed uploaded (segments in order, up to ``segment``)."""
        if parse_history_file_name(name) is not None:
            return name in self.history
        return self.segment is not None and \
            upload_order(name, segment_size) <= upload_order(self.segment, segment_size)


def upload_order(name: str, segment_size: int) -> tuple[int, int, int]:
    """The order files go up in: by timeline, each timeline's history file before its
    segments, segments by number (WAL order along the archive's history)."""
    timeline = parse_history_file_name(name)
    if timeline is not None:
        return timeline, 0, 0
    parsed = _segment(name, segment_size)
    return parsed.timeline, 1, parsed.segno


def segment_end(name: str, segment_size: int) -> int:
    """The LSN just past the last byte of segment file ``name``."""
    return (_segment(name, segment_size).segno + 1) * segment_size


def is_uploadable(name: str, segment_size: int) -> bool:
    """A completed segment (any at-rest format, sealed or not) or a history file."""
    parsed = parse_archive_segment_name(name, segment_size)
    return (parsed is not None and not parsed.partial) or \
        parse_history_file_name(name) is not None


def _segment(name: str, segment_size: int) -> SegmentFile:
    parsed = parse_archive_segment_name(name, segment_size)
    if parsed is None or parsed.partial:
        raise ArchiveError(f'"{name}" is not the name of a completed segment file')
    return parsed


def read_upload_record(archive: Archive, destination: str) -> UploadRecord:
    """The record for ``destination``; an empty one when there is none, or when it is about
    another destination (everything goes up again there: create-only, nothing overwritten)."""
    path = archive.directory / UPLOADED_FILE
    try:
        raw = json.loads(read_small_file(path))  # ArchiveError naming a FIFO or huge file
    except FileNotFoundError:
        return UploadRecord(destination)
    except RecursionError:
        raise ArchiveError(f'invalid upload record "{path}": nested too deeply') from None
    except (OSError, ValueError) as exc:
        raise ArchiveError(f'invalid upload record "{path}": {str(exc)[:200]}') from exc
    if not isinstance(raw, dict) or raw.get("version") != FORMAT_VERSION:
        raise ArchiveError(f'invalid upload record "{path}": not a version {FORMAT_VERSION} '
                           "upload record")
    segment, history = raw.get("segment"), raw.get("history")
    if not isinstance(segment, str | None) or not isinstance(history, list) \
            or not all(isinstance(item, str) for item in history):
        raise ArchiveError(f'invalid upload record "{path}": segment or history has the '
                           "wrong type")
    if raw.get("destination") != destination:
        return UploadRecord(destination)
    return UploadRecord(destination, segment, tuple(history))


def recorded_destination(directory: Path) -> str | None:
    """The destination the upload record of the archive in ``directory`` is about (None: no
    record, or one that names none); ArchiveError when it cannot be read."""
    path = directory / UPLOADED_FILE
    try:
        raw = json.loads(read_small_file(path))
    except FileNotFoundError:
        return None
    except RecursionError:
        raise ArchiveError(f'invalid upload record "{path}": nested too deeply') from None
    except (OSError, ValueError) as exc:
        raise ArchiveError(f'invalid upload record "{path}": {str(exc)[:200]}') from exc
    destination = raw.get("destination") if isinstance(raw, dict) else None
    return destination if isinstance(destination, str) else None


def write_upload_record(archive: Archive, record: UploadRecord) -> None:
    """Replace the record durably (raises ArchiveError)."""
    body = json.dumps({"version": FORMAT_VERSION, "destination": record.destination,
                       "segment": record.segment, "history": list(record.history)},
                      indent=2).encode() + b"\n"
    archive.write_file_durably(UPLOADED_FILE, body)


def pending_files(archive: Archive, record: UploadRecord, segment_size: int,
                  listing: Listing | None = None) -> list[PendingFile]:
    """The archive's completed files that ``record`` does not cover, in upload order (from
    ``listing`` when one was taken, else from a new one)."""
    if listing is None:
        listing = archive.listing()
    names = [entry.name for entry in listing.entries
             if is_uploadable(entry.name, segment_size) and entry.is_file()
             and not record.covers(entry.name, segment_size)]
    names.sort(key=lambda name: upload_order(name, segment_size))
    return [pending for name in names if (pending := describe_file(archive, name)) is not None]


def describe_file(archive: Archive, name: str) -> PendingFile | None:
    """Size and completion time of an archive file; None when it is not there."""
    try:
        info = os.stat(archive.directory / name, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ArchiveError(f'cannot read "{archive.directory / name}": '
                           f"{exc.strerror or exc}") from exc
    return PendingFile(name, info.st_size, info.st_mtime)
