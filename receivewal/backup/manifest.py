"""The backup manifest (``backup_manifest``) and the check of a backup against it (pure).

PostgreSQL writes the manifest as JSON, one file per line (``PostgreSQL-Backup-Manifest-Version``
1 in 13 to 16, 2 with ``System-Identifier`` from 17): ``Files`` with each file's ``Path`` (or
``Encoded-Path`` in hex when the name is not UTF-8), ``Size``, ``Last-Modified``, and
``Checksum-Algorithm`` and ``Checksum`` unless checksums are off; ``WAL-Ranges`` with
``Timeline``, ``Start-LSN`` and ``End-LSN``; and last the ``Manifest-Checksum``, a SHA-256 of
every byte before the line that holds it (as pg_verifybackup reads it: up to and including the
next-to-last newline).

:class:`ManifestCheck` is what pg_verifybackup checks of the files, done on a stream: each
file's size and digest as its bytes pass (:meth:`ManifestCheck.follow`), then every file of the
manifest present exactly once, with its size and checksum, and nothing that the manifest does
not list. It holds one digest per file, never a file's bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from receivewal.backup.tar import MemberData, MemberKind, MemberStart, TarEvent
from receivewal.errors import ArchiveError, ReceivewalError
from receivewal.wal.lsn import format_lsn, parse_lsn
from receivewal.wal.timeline import is_timeline_id

MANIFEST_NAME = "backup_manifest"
VERSIONS = (1, 2)
MANIFEST_CAP = 1 << 30  # a manifest held in memory, at most (about 150 bytes per file)
_SHOWN = 5  # problems named in one error, before "and N more"


class ManifestError(ArchiveError):
    """A backup manifest that cannot be read, or whose own checksum does not match."""


class BackupMismatch(ManifestError):  # noqa: N818 - reads as what the caller is told
    """A backup whose files do not match its manifest: one missing, extra, repeated, of
    another size or with another checksum (named in the message)."""


@dataclass(frozen=True, slots=True)
class ManifestFile:
    """One entry of ``Files``; ``algorithm`` "" when the manifest has no checksums."""

    path: str
    size: int
    algorithm: str
    checksum: str  # lower-case hex


@dataclass(frozen=True, slots=True)
class WalRange:
    """One entry of ``WAL-Ranges``: the WAL the backup needs on one timeline."""

    timeline: int
    start: int
    end: int


@dataclass(frozen=True)
class Manifest:
    """A parsed and checked backup manifest."""

    version: int
    files: dict[str, ManifestFile]
    wal_ranges: tuple[WalRange, ...]
    checksum: str
    system_identifier: int | None = None


def manifest_checksum(data: bytes, where: str = MANIFEST_NAME) -> str:
    """The SHA-256 PostgreSQL records in the manifest's last line: of every byte up to and
    including the next-to-last newline."""
    if not data.endswith(b"\n"):
        raise ManifestError(f"{where}: last line not newline-terminated")
    penultimate = data.rfind(b"\n", 0, len(data) - 1)
    if penultimate < 0:
        raise ManifestError(f"{where}: expected at least 2 lines")
    return hashlib.sha256(data[:penultimate + 1]).hexdigest()


def parse_manifest(data: bytes, where: str = MANIFEST_NAME) -> Manifest:
    """Parse ``data`` and check its own checksum; ManifestError naming ``where`` otherwise."""
    if len(data) > MANIFEST_CAP:
        raise ManifestError(f"{where}: larger than {MANIFEST_CAP} bytes")
    computed = manifest_checksum(data, where)
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ManifestError(f"{where}: not JSON: {exc}") from None
    try:
        manifest = _manifest_of(document)
    except (KeyError, TypeError, ValueError, ReceivewalError) as exc:
        raise ManifestError(f"{where}: {_reason(exc)}") from None
    if manifest.checksum != computed:
        raise ManifestError(f"{where}: manifest checksum mismatch (it records "
                            f"{manifest.checksum}, its content hashes to {computed})")
    return manifest


def _reason(exc: Exception) -> str:
    return f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)


def _field(mapping: Any, key: str, kind: type) -> Any:
    if not isinstance(mapping, dict):
        raise TypeError(f"expected an object where {key!r} should be")
    value = mapping[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"{key!r} is not of type {kind.__name__}")
    return value


def _manifest_of(document: Any) -> Manifest:
    version = _field(document, "PostgreSQL-Backup-Manifest-Version", int)
    if version not in VERSIONS:
        raise ValueError(f"unexpected manifest version {version}")
    sysid = _field(document, "System-Identifier", int) if version >= 2 else None
    files: dict[str, ManifestFile] = {}
    for entry in _field(document, "Files", list):
        item = _file_of(entry)
        if item.path in files:
            raise ValueError(f'file "{item.path}" listed twice')
        files[item.path] = item
    ranges = tuple(_range_of(entry) for entry in _field(document, "WAL-Ranges", list))
    if not ranges:
        raise ValueError("no WAL-Ranges")
    checksum = _field(document, "Manifest-Checksum", str).lower()
    return Manifest(version, files, ranges, checksum, sysid)


def _file_of(entry: Any) -> ManifestFile:
    if isinstance(entry, dict) and "Encoded-Path" in entry:
        path = bytes.fromhex(_field(entry, "Encoded-Path", str)).decode("utf-8",
                                                                         "surrogateescape")
    else:
        path = _field(entry, "Path", str)
    size = _field(entry, "Size", int)
    if size < 0:
        raise ValueError(f'file "{path}" has a negative size')
    algorithm = entry.get("Checksum-Algorithm", "")
    checksum = entry.get("Checksum", "") if algorithm else ""
    if not isinstance(algorithm, str) or not isinstance(checksum, str) \
            or (algorithm and not checksum):
        raise ValueError(f'file "{path}" has a malformed checksum')
    bytes.fromhex(checksum)  # ValueError when not hex
    return ManifestFile(path, size, algorithm.upper(), checksum.lower())


def _range_of(entry: Any) -> WalRange:
    timeline = _field(entry, "Timeline", int)
    if not is_timeline_id(timeline):
        raise ValueError(f"WAL range on timeline {timeline}, not a timeline ID")
    start = parse_lsn(_field(entry, "Start-LSN", str))
    end = parse_lsn(_field(entry, "End-LSN", str))
    if end < start:
        raise ValueError(f"WAL range ends at {format_lsn(end)} before it starts at "
                         f"{format_lsn(start)}")
    return WalRange(timeline, start, end)


class ManifestCheck:
    """The files of a backup as they arrive, then compared with its manifest.

    ``algorithm`` is the checksum the manifest was asked to carry (a hashlib name such as
    SHA256). ``where`` names the backup in errors, ``seen`` where its files were read ("on
    receipt", "as stored").
    """

    def __init__(self, algorithm: str, where: str, seen: str = "on receipt") -> None:
        self.algorithm = algorithm.upper()
        self.where = where
        self.seen = seen
        self.received: dict[str, tuple[int, str]] = {}
        self._problems: list[str] = []
        self._digest: Any = None  # of the file being read
        self._size = 0

    def hasher(self) -> Any:
        """A fresh digest for one file's bytes (``update``, ``hexdigest``)."""
        return hashlib.new(self.algorithm.lower())

    def follow(self, event: TarEvent, path_of: Callable[[str], str]) -> None:
        """Take one event of a tar archive being read: a file's bytes are hashed as they pass,
        and at its end the file is added under ``path_of(member name)``, how the manifest
        names it."""
        if isinstance(event, MemberData):
            self.member_data(event.data)
        elif event.member.kind is not MemberKind.FILE:
            return
        elif isinstance(event, MemberStart):
            self._digest, self._size = self.hasher(), 0
        else:
            assert self._digest is not None
            self.add(path_of(event.member.name), self._size, self._digest.hexdigest())
            self._digest = None

    def member_data(self, data: bytes | memoryview) -> None:
        """The current member's next bytes (a :class:`MemberData` event's, or those
        :meth:`~receivewal.backup.tar.TarReader.take_data` took): hashed when it is a file."""
        if self._digest is not None:
            self._digest.update(data)
            self._size += len(data)

    def add(self, path: str, size: int, digest: str) -> None:
        """A file arrived whole: its path as the manifest names it, size and hex digest."""
        if path in self.received:
            self._problems.append(f'"{path}" appears twice in the backup')
        self.received[path] = (size, digest)

    def compare(self, manifest: Manifest) -> None:
        """Every manifest file present exactly once, of its size and checksum, and nothing
        else; BackupMismatch naming the files otherwise."""
        problems = list(self._problems)
        for entry in manifest.files.values():
            got = self.received.get(entry.path)
            if got is None:
                problems.append(f'"{entry.path}" is in the manifest but not in the backup')
            elif got[0] != entry.size:
                problems.append(f'"{entry.path}" has size {got[0]} {self.seen} but size '
                                f"{entry.size} in the manifest")
            elif entry.algorithm and entry.algorithm != self.algorithm:
                problems.append(f'"{entry.path}" has a {entry.algorithm} checksum in the '
                                f"manifest, {self.algorithm} was expected")
            elif entry.algorithm and got[1] != entry.checksum:
                problems.append(f'"{entry.path}" has {entry.algorithm} checksum {got[1]} '
                                f"{self.seen}, {entry.checksum} in the manifest")
        problems.extend(f'"{path}" is in the backup but not in the manifest'
                        for path in self.received if path not in manifest.files)
        if problems:
            raise BackupMismatch(_summary(self.where, problems))


def _summary(where: str, problems: Iterable[str]) -> str:
    listed = list(problems)
    shown = "; ".join(listed[:_SHOWN])
    more = f"; and {len(listed) - _SHOWN} more" if len(listed) > _SHOWN else ""
    return f"{where} does not match its manifest: {shown}{more}"
