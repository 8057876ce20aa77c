"""A stored backup read back: its manifest and its tars' members, every file checked
against the manifest as it passes (files opened: the backup directory's, or the objects of a
bucket's backup through :class:`BackupFiles`).

:func:`read_members` yields the members of one stored tar, decompressed as read, and
feeds each file's size and digest to a :class:`~receivewal.backup.manifest.ManifestCheck`;
:func:`verify_backup` reads a whole backup so, which is what ``verify`` (and ``recover``,
while it unpacks) check: every file of the manifest there once, of its size and checksum.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from receivewal.archive.compression import decompress_chunks
from receivewal.archive.location import Location
from receivewal.archive.reading import open_regular, read_small_file
from receivewal.backup.manifest import MANIFEST_CAP, Manifest, ManifestCheck, parse_manifest
from receivewal.backup.record import BackupRecord, StoredArchive
from receivewal.backup.tar import (
    MemberEnd,
    MemberKind,
    TarEvent,
    TarReader,
)
from receivewal.errors import ArchiveError, StoreError


class BackupFiles(Protocol):
    """The files of one stored backup, wherever they are."""

    def where(self, name: str) -> str:
        """The file ``name`` as messages name it (a path, an s3:// URL)."""

    def open(self, name: str) -> BinaryIO:
        """The file ``name`` for reading, streamed; OSError or the project's error."""

    def read_small(self, name: str, cap: int) -> bytes:
        """The file ``name``'s content, at most ``cap`` bytes."""


@dataclass(frozen=True)
class DirectoryFiles:
    """A backup directory's files (regular files only)."""

    path: Path

    def where(self, name: str) -> str:
        return str(self.path / name)

    def open(self, name: str) -> BinaryIO:
        return open_regular(self.path / name)

    def read_small(self, name: str, cap: int) -> bytes:
        return read_small_file(self.path / name, cap)


@dataclass(frozen=True)
class LocationFiles:
    """A backup's files in a folder of a location (a bucket's ``backups/<id>/``)."""

    location: Location
    folder: str

    def where(self, name: str) -> str:
        return self.location.where(f"{self.folder}/{name}")

    def open(self, name: str) -> BinaryIO:
        return self.location.open(f"{self.folder}/{name}")

    def read_small(self, name: str, cap: int) -> bytes:
        return self.location.read_small(f"{self.folder}/{name}", cap)


def files_of(backup: Path | BackupFiles) -> BackupFiles:
    """A backup directory's path as its files; files as they are."""
    return DirectoryFiles(backup) if isinstance(backup, Path) else backup


@dataclass(frozen=True)
class Verified:
    """What a stored backup holds: its files and their bytes."""

    files: int
    bytes: int


def stored_manifest(backup_dir: Path | BackupFiles, record: BackupRecord) -> Manifest:
    """The backup's manifest: the file its record names (by SHA-256), parsed and checked."""
    files = files_of(backup_dir)
    path = files.where(record.manifest_name)
    try:
        data = files.read_small(record.manifest_name, MANIFEST_CAP)
    except OSError as exc:
        raise ArchiveError(f'could not read "{path}": {exc.strerror or exc}') from exc
    except StoreError as exc:
        raise ArchiveError(f'could not read "{path}": {exc}') from exc
    if hashlib.sha256(data).hexdigest() != record.manifest_sha256:
        raise ArchiveError(f'"{path}" is not the manifest its record names (SHA-256 differs)')
    return parse_manifest(data, str(path))


def manifest_check(manifest: Manifest, record: BackupRecord) -> ManifestCheck:
    """A check of the backup's files against ``manifest``, with the manifest's algorithm."""
    found = {entry.algorithm for entry in manifest.files.values() if entry.algorithm}
    return ManifestCheck(found.pop() if len(found) == 1 else "SHA256",
                         f"backup {record.backup_id}", "as stored")


def manifest_path(archive: StoredArchive, member: str) -> str:
    """How the manifest names a member of ``archive``."""
    oid = archive.tablespace_oid
    return member if oid is None else f"pg_tblspc/{oid}/{member}"


def read_members(backup_dir: Path | BackupFiles, archive: StoredArchive, check: ManifestCheck,
                 ) -> Iterator[TarEvent]:
    """The members of one stored tar; each file's size and digest go to ``check`` when
    it ends. Errors (unreadable, damaged, not a tar) name the file."""
    files = files_of(backup_dir)
    path = files.where(archive.name)
    reader = TarReader(path)
    try:
        with files.open(archive.name) as fh:
            for chunk in decompress_chunks(fh, archive.compression):
                for event in reader.feed(chunk):
                    check.follow(event, functools.partial(manifest_path, archive))
                    yield event
        reader.close()
    except OSError as exc:
        raise ArchiveError(f'could not read "{path}": {exc.strerror or exc}') from exc
    except (ArchiveError, StoreError) as exc:
        raise ArchiveError(f'could not read "{path}": {exc}') from exc


def verify_backup(backup_dir: Path | BackupFiles, record: BackupRecord) -> Verified:
    """Read every tar of the backup and check its files against the manifest;
    BackupMismatch naming the files, or an ArchiveError naming the damaged file."""
    manifest = stored_manifest(backup_dir, record)
    check = manifest_check(manifest, record)
    files = size = 0
    for archive in record.archives:
        for event in read_members(backup_dir, archive, check):
            if isinstance(event, MemberEnd) and event.member.kind is MemberKind.FILE:
                files, size = files + 1, size + event.member.size
    check.compare(manifest)
    return Verified(files, size)
