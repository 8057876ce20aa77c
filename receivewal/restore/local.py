"""Restoring one file from a local archive directory for PostgreSQL's ``restore_command``
(``%f`` to ``%p``): which of the directory's files serves the name (:func:`candidates`), the
archive's segment size, and the next segment's first bytes for the check of the record that
runs into it; the file is then written by :func:`~receivewal.restore.writing.write_restored`.

Nothing the archive holds can make recovery end early by mistake: only a file the archive does
not have is :class:`~receivewal.restore.writing.NotInArchive`. A file that is there but cannot
be trusted (undecodable, larger than a segment, WAL that fails the check, a symlink, a FIFO, a
socket or a device) or an archive whose identity file cannot be trusted raises the project's
:class:`~receivewal.errors.ArchiveError` naming the file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from receivewal.archive.compression import read_wal_file
from receivewal.archive.directory import Archive
from receivewal.archive.identity import ArchiveIdentity
from receivewal.archive.reading import open_regular
from receivewal.archive.segmentcheck import Following
from receivewal.errors import ArchiveError, ConfigurationError
from receivewal.restore.writing import Candidate, NotInArchive, write_restored
from receivewal.wal.lsn import DEFAULT_SEGMENT_SIZE
from receivewal.wal.names import (
    PARTIAL_SUFFIX,
    AtRest,
    is_other_wal_file_name,
    is_wal_file_name,
    parse_segment_file_name,
    wal_file_name,
)
from receivewal.wal.pageheader import SIZE_OF_LONG_PHD, archive_segment_size


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


def restore_file(directory: Path, name: str, target: str, *, partial: bool = False,
                 system_identifier: int | None = None) -> Path:
    """Restore ``name`` from the archive in ``directory`` to ``target``; return the source.
    An archive without an identity file holds a segment to ``system_identifier`` when given
    (the one the segments a caller read before had).

    Raises NotInArchive when no form of the file exists, ConfigurationError for a bad name or
    target, ArchiveError (CorruptFile for a file that cannot be decoded, DamagedSegment for
    one that decodes to WAL that must not be served) naming the file otherwise.
    """
    if not target:
        raise ConfigurationError("the target file name (%p) is empty")
    if not directory.is_dir():
        raise ArchiveError(f'archive directory "{directory}" does not exist or is not a '
                           "directory")
    identity = Archive(directory).read_identity()
    for candidate in candidates(directory, name, partial=partial):
        try:
            source = open_regular(candidate.path)  # a symlink, FIFO or device is damage
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ArchiveError(f'cannot open "{candidate.path}": {exc.strerror}') from exc
        with source:
            size = _segment_size(identity, candidate)
            write_restored(source, candidate, size, Path(target), str(candidate.path),
                           identity=identity, system_identifier=system_identifier,
                           following=_following(directory, candidate, size))
        return candidate.path
    raise NotInArchive(f'"{name}" is not in the archive "{directory}"')


def _following(directory: Path, candidate: Candidate, size: int) -> Following | None:
    """The first bytes of the complete segment after ``candidate`` in the archive, when it
    is there (a complete segment's last record often runs into it: its CRC covers both); None
    for a ``.partial`` (nothing after it is served) or a file that is not a segment. A next
    segment that cannot be read is not at hand: its own call judges it."""
    parsed = parse_segment_file_name(candidate.path.name, size)
    if not candidate.segment or candidate.partial or parsed is None:
        return None
    name = wal_file_name(parsed.timeline, parsed.segno + 1, size)

    def read(count: int) -> bytes | None:
        for fmt in AtRest:
            path = directory / (name + fmt.suffix)
            if os.path.lexists(path):
                try:
                    return read_wal_file(str(path), fmt, count)
                except ArchiveError:
                    return None
        return None

    return read


def segment_size(directory: Path, candidate: Candidate) -> int:
    """The archive's segment size by the one rule, :func:`~receivewal.wal.pageheader.
    archive_segment_size` (verify's too): its identity file's (validated), else the size the
    file's own first page header states when its page address is where its name puts it,
    else PostgreSQL's default (the checks then judge the file)."""
    return _segment_size(Archive(directory).read_identity(), candidate)


def _segment_size(identity: ArchiveIdentity | None, candidate: Candidate) -> int:
    recorded = None if identity is None else identity.segment_size
    return archive_segment_size(recorded, _head(candidate)) or DEFAULT_SEGMENT_SIZE


def _head(candidate: Candidate) -> Iterator[tuple[str, bytes]]:
    """The candidate's name and first bytes, read when asked for (a segment's only)."""
    if candidate.segment:
        yield candidate.path.name, read_wal_file(str(candidate.path), candidate.fmt,
                                                 SIZE_OF_LONG_PHD)
