"""The archive directory on disk: its lock, the scan where streaming resumes, its identity.

This module holds the directory itself: the one-writer lock (taken as
:mod:`receivewal.archive.lock` says), the scan that decides where streaming resumes, the
identity file, and durable writes of small files. The segment writers are in
:mod:`receivewal.archive.writer`.

Every file receivewal creates is written as :mod:`receivewal.archive.durable` says (a new
temporary file, fsync, rename, fsync of the directory); the lock holder removes the temporaries
a crash left behind. Nothing is ever written through a symbolic link.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from receivewal.archive.compression import CorruptFile, decompress_chunks, decompressed_size
from receivewal.archive.durable import (
    DirectoryNotSynced,
    is_temporary,
    probe_writable,
    sync_path,
    write_file_durably,
)
from receivewal.archive.identity import (
    IDENTITY_FILE,
    ArchiveIdentity,
    check_same_cluster,
    identity_to_json,
    read_identity_file,
)
from receivewal.archive.layout import resume_order
from receivewal.archive.listing import Listing
from receivewal.archive.lock import LOCK_FILE, lock_directory
from receivewal.archive.reading import open_regular
from receivewal.archive.recipients import RecipientSet, adopting
from receivewal.archive.sealed import sealed_problem
from receivewal.errors import (
    OUT_OF_DESCRIPTORS,
    ArchiveError,
    DescriptorLimitError,
    DiskFullError,
)
from receivewal.wal.names import SegmentFile
from receivewal.wal.pageheader import SIZE_OF_LONG_PHD, first_page_problem, parse_long_header

if TYPE_CHECKING:
    from datetime import datetime

_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}


def os_error(exc: OSError, what: str) -> ArchiveError:
    """Turn an OSError into the project's error, marking a full disk and a lack of file
    descriptors as retryable. A directory's failed fsync after a rename
    (:class:`~receivewal.archive.durable.DirectoryNotSynced`) is said as such, whatever
    ``what`` was."""
    if isinstance(exc, DirectoryNotSynced):
        what = f'could not fsync directory "{exc.filename}"'
    if exc.errno in _DISK_FULL:
        return DiskFullError(f"{what}: no space left on device ({exc.strerror})")
    if exc.errno in OUT_OF_DESCRIPTORS:
        return DescriptorLimitError(f"{what}: out of file descriptors ({exc.strerror})")
    if exc.errno == errno.ELOOP:
        return ArchiveError(f"{what}: it is a symbolic link, which receivewal never follows "
                            "when writing")
    return ArchiveError(f"{what}: {exc.strerror or exc}")


@dataclass(frozen=True)
class RejectedFile:
    """A segment file passed over as the resume point: its name, and why."""

    file: str
    reason: str


class Archive:
    """An archive directory: its lock, scanning, identity, and durable writes of small files."""

    def __init__(self, directory: Path, *, sync: bool = True, file_mode: int = 0o600) -> None:
        self.directory = directory
        self.sync = sync
        self.file_mode = file_mode
        self._lock_fd: int | None = None

    # -- checks ------------------------------------------------------------------------------
    def check_exists(self) -> None:
        """Raise ArchiveError unless the directory exists."""
        if not self.directory.exists():
            raise ArchiveError(f'directory "{self.directory}" does not exist')
        if not self.directory.is_dir():
            raise ArchiveError(f'"{self.directory}" is not a directory')

    def check_usable(self) -> None:
        """Raise ArchiveError unless the directory exists and we can create files in it."""
        self.check_exists()
        try:
            probe_writable(self.directory)
        except OSError as exc:
            raise ArchiveError(
                f'directory "{self.directory}" is not writable: {exc.strerror or exc}'
            ) from exc

    def file_mode_for(self, server_mode: int) -> int:
        """The mode of the files written here: the server's (0640 when its data directory is
        group-readable, as pg_receivewal does), and group-readable too when the archive
        directory lets its group in (g+rx): the directory's mode decides, as a data directory's
        does for PostgreSQL, so that members of its group (the postgres user, in the
        package's ``receivewal`` group) can restore from it."""
        try:
            group_in = stat.S_IMODE(os.stat(self.directory).st_mode) & 0o050 == 0o050
        except OSError:
            group_in = False
        return server_mode | (0o040 if group_in else 0)

    def fsync_directory(self) -> None:
        """Make renames and new entries in the directory durable (raises ArchiveError)."""
        if self.sync:
            try:
                sync_path(self.directory)
            except OSError as exc:
                raise os_error(exc, f'could not fsync directory "{self.directory}"') from exc

    def remove_superseded(self, path: Path) -> bool:
        """Remove a file another one supersedes; False when it was not there (the caller
        fsyncs the directory once for all it removed)."""
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise os_error(exc, f'could not remove superseded file "{path}"') from exc
        return True

    # -- the one-writer lock ------------------------------------------------------------------
    def lock(self) -> Listing:
        """Become the archive's only writer for the life of the process (flock on the
        directory itself, see :mod:`receivewal.archive.lock`), and record pid and host in
        LOCK_FILE.

        Raises ArchiveError naming the holder when another process has it. Then lists the
        directory, removes the temporary files a crashed writer left, and returns the listing
        (without them; their names in its ``removed``) for the rest of the start-up. Until the
        server says whether its data directory allows group access (:meth:`adopt_file_mode`),
        files are written with the mode the archive directory alone decides.
        """
        self.check_exists()
        fd = lock_directory(self.directory)
        self.file_mode = self.file_mode_for(self.file_mode)
        try:
            self._write_lock_record()
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise ArchiveError(f'directory "{self.directory}" is not writable: could not '
                                   f"write its lock record {LOCK_FILE} ({exc.strerror})"
                                   ) from exc
            raise os_error(exc, f'could not write the lock record "{self.directory / LOCK_FILE}"'
                           ) from exc
        self._lock_fd = fd
        listing = self.listing()
        return listing.without(self.remove_temporaries(listing))

    def _write_lock_record(self) -> None:
        """pid and host in LOCK_FILE, with the archive's file mode. Atomic but not fsynced: it
        only names the holder to a second writer while this process lives (the flock is the
        lock), and two fsyncs would delay every start. Raises OSError."""
        import socket  # noqa: PLC0415 - a writer's only: not on restore's call path

        record = f"{os.getpid()} {socket.gethostname()}\n".encode()
        write_file_durably(self.directory, LOCK_FILE, record, mode=self.file_mode, sync=False)

    def adopt_file_mode(self, server_mode: int) -> int:
        """Write the archive's files from now on with the mode the server's data directory
        asks for (pg_receivewal's rule, see :meth:`file_mode_for`); the lock record, written
        before the server was known, is rewritten when its mode differs. Returns the mode;
        raises ArchiveError."""
        mode = self.file_mode_for(server_mode)
        if mode != self.file_mode:
            self.file_mode = mode
            if self._lock_fd is not None:
                try:
                    self._write_lock_record()
                except OSError as exc:
                    raise os_error(exc, "could not write the lock record "
                                   f'"{self.directory / LOCK_FILE}"') from exc
        return mode

    def unlock(self) -> None:
        """Give the archive up (the lock record stays; the directory's lock is what counts)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def remove_temporaries(self, listing: Listing | None = None) -> list[str]:
        """Remove temporary files a crash left behind (those of ``listing``, else of a new
        one); return their names."""
        if listing is None:
            listing = self.listing()
        removed = [entry.name for entry in listing.entries
                   if is_temporary(entry.name)]
        for name in removed:
            try:
                (self.directory / name).unlink()
            except OSError as exc:
                raise os_error(exc, f'could not remove temporary file "{name}"') from exc
        if removed:
            self.fsync_directory()
        return removed

    # -- scanning ----------------------------------------------------------------------------
    def listing(self) -> Listing:
        """The directory's entries now (one ``os.scandir``)."""
        return Listing.take(self.directory)

    def segment_names(self, segment_size: int) -> list[SegmentFile]:
        """Every segment file in the directory, by name only (nothing is opened)."""
        return self.listing().segments(segment_size)

    def resume_point(self, segment_size: int, system_identifier: int | None = None,
                     files: list[SegmentFile] | None = None,
                     ) -> tuple[SegmentFile | None, list[RejectedFile]]:
        """The newest segment file whose content proves it, and the files passed over.

        Candidates are checked newest first, so only the files that matter are opened: the
        first page header (magic, timeline, page address matching the name, segment size,
        system identifier) and, for a complete file, its size. Streaming resumes in the run
        of consecutive segments that ends at the archive's end: an island of older segments
        before a hole is never resumed from (the server has long removed the WAL after it);
        :func:`~receivewal.archive.layout.older_islands` names such islands. ``files`` are
        the segment files of a listing already taken (else the directory is listed).
        """
        rejected: list[RejectedFile] = []
        if files is None:
            files = self.segment_names(segment_size)
        for parsed in sorted(files, key=resume_order, reverse=True):
            # a sealed file is complete by its name, its age header and its recipients file:
            # its WAL was checked before it was sealed, and no key is at hand to read it
            reason = sealed_problem(str(self.directory / parsed.file_name(segment_size))) \
                if parsed.encrypted else \
                self._content_problem(parsed, segment_size, system_identifier)
            if reason is None:
                return parsed, rejected
            rejected.append(RejectedFile(parsed.file_name(segment_size), reason))
        return None, rejected

    def _content_problem(self, parsed: SegmentFile, segment_size: int,
                         system_identifier: int | None) -> str | None:
        """Why a segment file cannot be trusted as the resume point, or None."""
        path = self.directory / parsed.file_name(segment_size)
        try:
            problem = _size_problem(path, parsed, segment_size)
            if problem is not None:
                return problem
            first = _first_bytes(path, parsed, SIZE_OF_LONG_PHD)
        except OSError as exc:
            if exc.errno in OUT_OF_DESCRIPTORS:  # says nothing about the file: retry later
                raise os_error(exc, f'could not open "{path}"') from exc
            return f"cannot be read: {exc.strerror or exc}"
        except ArchiveError as exc:  # damaged, or not a regular file
            return str(exc)
        if parsed.partial and (len(first) < SIZE_OF_LONG_PHD or not any(first)):
            return None  # preallocated or restarted, nothing received yet: restreamed anyway
        header = parse_long_header(first)
        if header is None:
            return "too short for a page header"
        return first_page_problem(header, timeline=parsed.timeline,
                                  page_address=parsed.start_lsn(segment_size),
                                  segment_size=segment_size, system_identifier=system_identifier)

    # -- identity ----------------------------------------------------------------------------
    def read_identity(self) -> ArchiveIdentity | None:
        """The recorded identity, None when the archive has none yet."""
        return read_identity_file(self.directory)

    def sniff_system_identifier(self, files: list[SegmentFile], segment_size: int) -> str | None:
        """The system identifier in the long page header of the newest complete plain segment."""
        plain = sorted(f for f in files
                       if not f.partial and not f.compression and not f.encrypted)
        if not plain:
            return None
        path = self.directory / plain[-1].file_name(segment_size)
        with open_regular(path) as fh:
            header = parse_long_header(fh.read(SIZE_OF_LONG_PHD))
        return None if header is None else str(header.system_identifier)

    def write_identity(self, identity: ArchiveIdentity) -> None:
        """Record whose archive this is (durably)."""
        self.write_file_durably(IDENTITY_FILE, identity_to_json(identity))

    def adopt_identity(self, server: ArchiveIdentity,
                       files: list[SegmentFile] | None = None) -> None:
        """Make sure the archive is the server's: record its identity in a new archive (unless
        the WAL already there, ``files`` or the directory's, says another system wrote it),
        refuse another cluster's."""
        recorded = self.read_identity()
        where = f'directory "{self.directory}"'
        if recorded is not None:
            check_same_cluster(where, recorded, server)
            return
        if files is None:
            files = self.segment_names(server.segment_size)
        sniffed = self.sniff_system_identifier(files, server.segment_size)
        if sniffed is not None and sniffed != server.system_identifier:
            raise ArchiveError(f"{where} holds WAL of database system {sniffed}, but the server "
                               f"is database system {server.system_identifier}")
        self.write_identity(server)

    def adopt_recipients(self, recipients: RecipientSet,
                         now: Callable[[], datetime] | None = None) -> ArchiveIdentity:
        """Record ``recipients`` (``--encrypt-to``) in the identity record, durably, unless it
        is the newest set there already; the record as it now is. Called once the identity is
        adopted, before anything is encrypted to the set (``stream``, ``backup`` and
        ``logical`` alike). ArchiveError when the archive has no record."""
        recorded = self.read_identity()
        if recorded is None:
            raise ArchiveError(f'directory "{self.directory}" has no identity record to list '
                               "the recipients in")
        if now is None:
            from datetime import UTC, datetime  # noqa: PLC0415 - a writer's only

            at = datetime.now(UTC)
        else:
            at = now()
        sets = adopting(recorded.recipient_sets, recipients, at.strftime("%Y-%m-%dT%H:%M:%SZ"))
        if sets == recorded.recipient_sets:
            return recorded
        updated = replace(recorded, recipient_sets=sets)
        self.write_identity(updated)
        return updated

    # -- small files -------------------------------------------------------------------------
    def write_file_durably(self, name: str, body: bytes) -> None:
        """Write ``name`` through a fresh temporary file, fsync, rename, fsync the directory."""
        try:
            write_file_durably(self.directory, name, body, mode=self.file_mode, sync=self.sync)
        except OSError as exc:
            raise os_error(exc, f'could not write file "{self.directory / name}"') from exc

    def write_history(self, name: str, body: bytes) -> None:
        """Write the timeline history file ``name`` durably."""
        self.write_file_durably(name, body)


def _first_bytes(path: Path, parsed: SegmentFile, count: int) -> bytes:
    """Up to ``count`` decompressed bytes from the start of a segment file (never a symlink)."""
    out = b""
    with open_regular(path) as fh:
        try:
            for chunk in decompress_chunks(fh, parsed.compression, truncated_ok=parsed.partial):
                out += chunk
                if len(out) >= count:
                    break
        except CorruptFile:
            if not parsed.partial:
                raise
    return out[:count]


def _size_problem(path: Path, parsed: SegmentFile, segment_size: int) -> str | None:
    """Why a complete segment file cannot be trusted as complete, or None."""
    if parsed.partial:
        return None
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if parsed.compression == "":
            return None if size == segment_size else \
                f"has {size} bytes, should be {segment_size}"
        if parsed.compression == "gzip":
            if size < 4:
                return "gzip file too short"
            fh.seek(-4, os.SEEK_END)
            (isize,) = struct.unpack("<I", fh.read(4))
            expected = segment_size & 0xFFFFFFFF
            return None if isize == expected else \
                f"gzip trailer says {isize} bytes, should be {segment_size}"
        # LZ4 and zstd frames do not record the size: decompress, as pg_receivewal does for .lz4
        size = decompressed_size(fh, parsed.compression, cap=segment_size)
    return None if size == segment_size else f"decompresses to {size} bytes, should be " \
        f"{segment_size}"
