"""BASE_BACKUP's COPY OUT stream as PostgreSQL 15 sends it (``TARGET 'client'``), decoded (pure).

The whole backup travels in one COPY OUT. Each CopyData payload starts with a type byte:

    'n'  a new archive starts: its file name and the tablespace's location, two strings each
         ended by a zero byte (the location is empty for the main data directory)
    'd'  bytes of the current archive, or of the manifest once 'm' came
    'p'  progress: an Int64, the bytes of the backup sent so far
    'm'  the backup manifest starts; every later 'd' is manifest data

(basebackup_copy.c, the ``copystream`` sink; an archive here is a tar, ``base.tar`` or a
tablespace's.) An archive ends where the next one, the manifest
or the COPY starts or ends: there is no message for it. :func:`parse_backup_message` reads one
payload; :class:`BackupStream` also checks their order. Anything else is a
:class:`BackupStreamError` saying which message, never another exception.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from enum import Enum

from receivewal.errors import ProtocolError

_INT64 = struct.Struct(">q")
_DATA = ord("d")
#: what PostgreSQL 15 names an archive (a tar): base.tar, or <tablespace oid>.tar, with the
#: suffix of a server-side compression
TAR_NAME = re.compile(r"(base|[1-9][0-9]{0,9})\.tar(\.gz|\.lz4|\.zst)?")


class BackupStreamError(ProtocolError):
    """A message of BASE_BACKUP's COPY stream broke the protocol (its kind, its fields, or the
    order of the messages)."""


@dataclass(frozen=True, slots=True)
class NewArchive:
    """'n': the archive ``name`` starts; ``location`` is the tablespace's directory on the
    server ("" for the main data directory)."""

    name: str
    location: str


@dataclass(frozen=True, slots=True)
class BackupData:
    """'d': bytes of the current archive or of the manifest."""

    data: memoryview


@dataclass(frozen=True, slots=True)
class Progress:
    """'p': the bytes of the backup the server has sent so far."""

    done: int


@dataclass(frozen=True, slots=True)
class ManifestStart:
    """'m': the manifest starts."""


BackupMessage = NewArchive | BackupData | Progress | ManifestStart


def _strings(body: memoryview, count: int) -> list[str]:
    """``count`` zero-terminated strings filling ``body`` exactly (bytes that are not UTF-8
    kept as surrogates, so that a path comes back to the same bytes)."""
    raw = bytes(body)
    if not raw.endswith(b"\0") or raw.count(b"\0") != count:
        raise BackupStreamError(f"new-archive message does not hold {count} zero-terminated "
                                f"strings ({len(raw)} bytes)")
    return [part.decode("utf-8", "surrogateescape") for part in raw.split(b"\0")[:count]]


def parse_backup_message(payload: bytes | memoryview) -> BackupMessage:
    """One CopyData payload of the stream."""
    view = memoryview(payload).cast("B")
    if not view:
        raise BackupStreamError("empty CopyData message in the base backup stream")
    kind, body = view[0], view[1:]
    if kind == _DATA:
        return BackupData(body)
    if kind == ord("n"):
        name, location = _strings(body, 2)
        if not TAR_NAME.fullmatch(name):
            raise BackupStreamError(f"server announced an archive named {name[:80]!r}, not "
                                    "base.tar or <oid>.tar (with .gz, .lz4 or .zst)")
        return NewArchive(name, location)
    if kind == ord("p"):
        if len(body) != _INT64.size:
            raise BackupStreamError(f"progress message of {len(body)} bytes, expected 8")
        (done,) = _INT64.unpack(body)
        if done < 0:
            raise BackupStreamError(f"progress message with a negative count {done}")
        return Progress(done)
    if kind == ord("m"):
        if body:
            raise BackupStreamError(f"manifest message with {len(body)} unexpected bytes")
        return ManifestStart()
    raise BackupStreamError(f"unexpected message type 0x{kind:02x} in the base backup stream")


class Part(Enum):
    """Where the stream stands: before any archive, in an archive, in the manifest."""

    NOTHING = "nothing yet"
    ARCHIVE = "an archive"
    MANIFEST = "the manifest"


class BackupStream:
    """The order of the stream's messages: data only inside an archive or the manifest, every
    archive named once, the base archive among them, the manifest last and once."""

    def __init__(self) -> None:
        self.part = Part.NOTHING
        self.archives: list[NewArchive] = []
        self.progress = 0

    def archive_data(self, payload: bytes | memoryview) -> memoryview | None:
        """The bytes of a 'd' message inside an archive (the bulk of the stream, taken
        without a message object); None for any other payload, which :meth:`read` reads."""
        if self.part is not Part.ARCHIVE or not payload or payload[0] != _DATA:
            return None
        return memoryview(payload).cast("B")[1:]

    def read(self, payload: bytes | memoryview) -> BackupMessage:
        """Decode one payload and check that it may come now."""
        message = parse_backup_message(payload)
        if isinstance(message, BackupData):
            if self.part is Part.NOTHING:
                raise BackupStreamError("data before any archive in the base backup stream")
        elif isinstance(message, NewArchive):
            if self.part is Part.MANIFEST:
                raise BackupStreamError(f"archive {message.name} announced after the manifest")
            if any(_stem(a.name) == _stem(message.name) for a in self.archives):
                raise BackupStreamError(f"archive {message.name} announced twice")
            self.archives.append(message)
            self.part = Part.ARCHIVE
        elif isinstance(message, ManifestStart):
            if self.part is Part.MANIFEST:
                raise BackupStreamError("the manifest announced twice")
            self.part = Part.MANIFEST
        else:
            self.progress = message.done
        return message

    def finish(self, *, manifest: bool) -> None:
        """The COPY ended: the base archive came, and the manifest when one was asked for."""
        if not any(_stem(a.name) == "base" for a in self.archives):
            raise BackupStreamError("the base backup stream ended without the base archive")
        if manifest and self.part is not Part.MANIFEST:
            raise BackupStreamError("the base backup stream ended without the manifest")


def _stem(name: str) -> str:
    return name.split(".", 1)[0]
