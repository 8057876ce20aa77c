"""Restoring one file from the archive for PostgreSQL's ``restore_command`` (``%f`` to ``%p``).

The archive may hold the segment plain or compressed (any :class:`~receivewal.wal.names.AtRest`
format); it is decoded into a new temporary file next to ``%p`` (created with O_CREAT|O_EXCL|
O_NOFOLLOW, so never through a planted symlink), fsynced, renamed into place and the directory
fsynced: recovery never sees half a file.

Nothing the archive holds can make recovery end early by mistake: only a file the archive does
not have is :class:`NotInArchive`. A file that is there but cannot be trusted (damaged, larger
than a segment, a complete segment of the wrong size, a symlink, a FIFO, a socket or a device)
or an archive whose identity file cannot be trusted raises the project's
:class:`~receivewal.errors.ArchiveError` naming the file. Decoding is bounded by the segment
size, so memory and the temporary file stay bounded whatever the file holds.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from receivewal.archive.compression import CorruptFile, decompress_chunks, read_wal_file
from receivewal.archive.directory import Archive, fsync_path
from receivewal.archive.identity import IDENTITY_FILE
from receivewal.archive.reading import open_regular
from receivewal.errors import ArchiveError, ConfigurationError, ReceivewalError
from receivewal.wal.lsn import DEFAULT_SEGMENT_SIZE, check_segment_size
from receivewal.wal.names import (
    PARTIAL_SUFFIX,
    AtRest,
    is_other_wal_file_name,
    is_wal_file_name,
    parse_segment_file_name,
)
from receivewal.wal.pageheader import (
    MAX_SYSTEM_IDENTIFIER,
    SIZE_OF_LONG_PHD,
    archive_segment_size,
)
from receivewal.wal.timeline import is_timeline_id


class NotInArchive(ReceivewalError):  # noqa: N818 - names the outcome, as recovery sees it
    """The archive has no file of that name (recovery may end there)."""


@dataclass(frozen=True)
class Candidate:
    """An archive file that can serve the asked name."""

    path: Path
    fmt: AtRest
    partial: bool
    segment: bool  # a WAL segment (else a history or backup history file, served as it is)


def candidates(directory: Path, name: str, *, partial: bool) -> list[Candidate]:
    """The archive files that can serve ``name``, best first: complete files (plain, then
    compressed), then with ``partial`` the ``.partial`` forms, the longest valid WAL first.

    Raises ArchiveError when two ``.partial`` forms hold different WAL where both hold some.
    """
    if is_other_wal_file_name(name):
        return [Candidate(directory / name, AtRest.PLAIN, partial=False, segment=False)]
    if not is_wal_file_name(name):
        raise ConfigurationError(f"{name!r} is not a WAL segment or history file name")
    found = [Candidate(directory / (name + fmt.suffix), fmt, partial=False, segment=True)
             for fmt in AtRest]
    if partial and not any(c.path.exists() for c in found):
        partials = [Candidate(directory / (name + fmt.suffix + PARTIAL_SUFFIX), fmt,
                              partial=True, segment=True) for fmt in AtRest]
        found += _longest_first(directory, name, [c for c in partials if c.path.exists()])
    return found


def _longest_first(directory: Path, name: str, partials: list[Candidate]) -> list[Candidate]:
    """``partials`` ranked by the valid WAL they hold (:mod:`receivewal.archive.partials`)."""
    if len(partials) < 2:
        return partials
    from receivewal.archive.partials import rank_partials  # noqa: PLC0415 - the WAL reader
    # only where two .partial forms compete, not on every restore_command call
    size = segment_size(directory, partials[0])
    forms = []
    for c in partials:
        parsed = parse_segment_file_name(c.path.name, size)
        if parsed is None:
            raise ConfigurationError(f"{name!r} is not a WAL segment name for {size}-byte "
                                     "segments")
        forms.append((c.path, parsed))
    try:
        ranked, conflict = rank_partials(forms, size)
    except OSError as exc:
        raise ArchiveError(f'cannot read "{exc.filename}": {exc.strerror}') from exc
    if conflict is not None:
        raise ArchiveError(conflict.describe())
    by_path = {c.path: c for c in partials}
    return [by_path[f.path] for f in ranked]


def restore_file(directory: Path, name: str, target: str, *, partial: bool = False) -> Path:
    """Restore ``name`` from the archive in ``directory`` to ``target``; return the source.

    Raises NotInArchive when no form of the file exists, ConfigurationError for a bad name or
    target, ArchiveError (CorruptFile for a damaged file) naming the file otherwise.
    """
    if not target:
        raise ConfigurationError("the target file name (%p) is empty")
    if not directory.is_dir():
        raise ArchiveError(f'archive directory "{directory}" does not exist or is not a '
                           "directory")
    for candidate in candidates(directory, name, partial=partial):
        try:
            source = open_regular(candidate.path)  # a symlink, FIFO or device is damage
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ArchiveError(f'cannot open "{candidate.path}": {exc.strerror}') from exc
        with source:
            _restore_from(directory, candidate, source, Path(target))
        return candidate.path
    raise NotInArchive(f'"{name}" is not in the archive "{directory}"')


def _restore_from(directory: Path, candidate: Candidate, source: BinaryIO, target: Path,
                  ) -> None:
    write_restored(source, candidate, segment_size(directory, candidate), target,
                   str(candidate.path), on_disk=True)


def write_restored(source: BinaryIO, candidate: Candidate, size: int, target: Path,
                   what: str, *, on_disk: bool = False) -> None:
    """Decode ``source`` (the file ``candidate`` names, ``what`` in messages) into ``target``
    atomically, checked against the segment ``size``: a complete segment must hold exactly
    ``size`` bytes, a ``.partial`` at most (padded with zeros), any file at most ``size``.
    A plain file ``on_disk`` is copied by the kernel."""
    if not candidate.segment:
        expect = None
    elif candidate.partial:
        expect = (0, size)  # padded with zeros: where the received WAL ends
    else:
        expect = (size, size)
    fill: Callable[[BinaryIO], int]
    if on_disk and candidate.fmt is AtRest.PLAIN and not candidate.partial:
        fill = lambda out: _copy_plain(source, out, size)  # noqa: E731 - one line
    else:
        chunks = decompress_chunks(source, candidate.fmt, truncated_ok=candidate.partial,
                                   cap=size)
        fill = lambda out: _write_chunks(out, chunks)  # noqa: E731 - one line
    try:
        _write_atomically(fill, target, expect)
    except CorruptFile as exc:
        raise CorruptFile(f'"{what}" {exc}') from exc


def segment_size(directory: Path, candidate: Candidate) -> int:
    """The archive's segment size by the one rule, :func:`~receivewal.wal.pageheader.
    archive_segment_size` (verify's too): its identity file's (validated), else the size the
    file's own first page header states when its page address is where its name puts it,
    else PostgreSQL's default (the size checks below then judge the file)."""
    return archive_segment_size(_identity_segment_size(directory), _head(candidate)) \
        or DEFAULT_SEGMENT_SIZE


def _head(candidate: Candidate) -> Iterator[tuple[str, bytes]]:
    """The candidate's name and first bytes, read when asked for (a segment's only)."""
    if candidate.segment:
        yield candidate.path.name, read_wal_file(str(candidate.path), candidate.fmt,
                                                 SIZE_OF_LONG_PHD)


def _identity_segment_size(directory: Path) -> int | None:
    """The identity file's segment size after checking every value it holds."""
    path = directory / IDENTITY_FILE
    identity = Archive(directory).read_identity()
    if identity is None:
        return None
    try:
        check_segment_size(identity.segment_size)
    except ConfigurationError as exc:
        raise ArchiveError(f'archive identity file "{path}": {exc}') from exc
    if not is_timeline_id(identity.timeline):
        raise ArchiveError(f'archive identity file "{path}": invalid timeline '
                           f"{identity.timeline}")
    sysid = identity.system_identifier
    if not (sysid.isascii() and sysid.isdigit() and int(sysid) <= MAX_SYSTEM_IDENTIFIER):
        raise ArchiveError(f'archive identity file "{path}": invalid system identifier '
                           f"{sysid[:40]!r}")
    return identity.segment_size


def _write_atomically(fill: Callable[[BinaryIO], int], target: Path,
                      expect: tuple[int, int] | None) -> None:
    """Write a new temporary file with ``fill`` (which returns the bytes it wrote), pad it to
    ``expect`` = (least, pad to) bytes, fsync, rename to ``target``, fsync the directory. The
    temporary file is removed on any error, SIGTERM (raised as an exception by the command)
    included."""
    fd, tmp = _create_temporary(target)
    try:
        with os.fdopen(fd, "wb") as out:
            _write_padded(out, fill, expect)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(target.parent)


def _write_padded(out: BinaryIO, fill: Callable[[BinaryIO], int],
                  expect: tuple[int, int] | None) -> None:
    written = fill(out)
    if expect is not None:
        least, pad_to = expect
        if written < least:
            raise CorruptFile(f"holds {written} bytes, a segment has {least}")
        out.truncate(pad_to)  # zeros past the received WAL of a .partial


def _write_chunks(out: BinaryIO, chunks: Iterable[bytes]) -> int:
    return sum(out.write(chunk) for chunk in chunks)


def _copy_plain(source: BinaryIO, out: BinaryIO, cap: int) -> int:
    """Copy a plain file of at most ``cap`` bytes in the kernel (copy_file_range, else
    sendfile): no byte passes through Python. Returns the bytes copied."""
    size = os.fstat(source.fileno()).st_size
    if size > cap:
        raise CorruptFile(f"holds more than {cap} bytes")
    out.flush()
    src, dst, copied = source.fileno(), out.fileno(), 0
    while copied < size:
        try:
            step = os.copy_file_range(src, dst, size - copied, copied, copied)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            os.lseek(dst, copied, os.SEEK_SET)
            step = os.sendfile(dst, src, copied, size - copied)
        if step == 0:
            break  # the file shrank while it was copied: the size check judges it
        copied += step
    out.seek(copied)
    return copied


def _create_temporary(target: Path) -> tuple[int, Path]:
    """A new file next to ``target``: never an existing file, never through a symlink."""
    first = target.with_name(f".{target.name}.receivewal-restore-{os.getpid()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(first, flags, 0o666), first  # the umask applies, as for a copy
    except FileExistsError:  # a leftover, or something planted: leave it, take a fresh name
        fd, name = tempfile.mkstemp(prefix=f"{first.name}-", dir=target.parent)
        return fd, Path(name)
