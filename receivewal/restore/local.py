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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from receivewal.archive.compression import read_wal_file
from receivewal.archive.identity import (
    ArchiveIdentity,
    read_identity_file,
    sealed_fingerprints,
)
from receivewal.archive.reading import open_regular
from receivewal.archive.segmentcheck import Following
from receivewal.archive.sources import decide_segment_size
from receivewal.errors import ArchiveError, ConfigurationError
from receivewal.restore.writing import Candidate, NotInArchive, write_restored
from receivewal.wal.leannames import sealed_suffix
from receivewal.wal.lsn import DEFAULT_SEGMENT_SIZE
from receivewal.wal.names import (
    PARTIAL_SUFFIX,
    AtRest,
    is_other_wal_file_name,
    is_wal_file_name,
    parse_archive_segment_name,
    parse_segment_file_name,
    wal_file_name,
)

if TYPE_CHECKING:
    from receivewal.archive.sealed import Unsealer


def candidates(directory: Path, name: str, *, partial: bool,
               fingerprints: tuple[str, ...] = ("",)) -> list[Candidate]:
    """The archive files that can serve ``name``, best first: complete files (plain, then
    compressed, then sealed: ``.FINGERPRINT.age`` for each of ``fingerprints``, the
    identity record's sets', then the older form's ``.age``), then with ``partial`` the
    ``.partial`` forms, the longest valid WAL first.

    Raises ArchiveError when two ``.partial`` forms hold different WAL where both hold some.
    """
    if is_other_wal_file_name(name):
        return [Candidate(directory / name, AtRest.PLAIN, partial=False, segment=False)]
    if not is_wal_file_name(name):
        raise ConfigurationError(f"{name!r} is not a WAL segment or history file name")
    found = complete_forms(directory, name, fingerprints)
    if partial and not any(c.path.exists() for c in found):
        partials = [Candidate(directory / (name + fmt.suffix + PARTIAL_SUFFIX), fmt,
                              partial=True, segment=True) for fmt in AtRest]
        found += _longest_first(directory, name, [c for c in partials if c.path.exists()])
    return found


def complete_forms(directory: Path, name: str,
                   fingerprints: tuple[str, ...] = ("",)) -> list[Candidate]:
    """The complete files that can hold segment ``name``, in the order they are looked for:
    plain, compressed, then sealed (each at-rest form encrypted to each set of
    ``fingerprints``, :func:`~receivewal.archive.identity.sealed_fingerprints`: "" is the
    older form)."""
    plain = [Candidate(directory / (name + fmt.suffix), fmt, partial=False, segment=True)
             for fmt in AtRest]
    return plain + [Candidate(directory / (name + fmt.suffix + sealed_suffix(fingerprint)), fmt,
                              partial=False, segment=True, encrypted=True,
                              fingerprint=fingerprint)
                    for fingerprint in fingerprints for fmt in AtRest]


def _longest_first(directory: Path, name: str, partials: list[Candidate]) -> list[Candidate]:
    """``partials`` ranked by the valid WAL they hold (:mod:`receivewal.archive.partials`)."""
    if len(partials) < 2:
        return partials
    from receivewal.archive.partials import rank_partials  # noqa: PLC0415 - the WAL reader
    # only where two .partial forms compete, not on every restore_command call
    size = archive_segment_size(directory, read_identity_file(directory))
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
                 system_identifier: int | None = None, segment_size: int | None = None,
                 identity_file: str | None = None) -> Path:
    """Restore ``name`` from the archive in ``directory`` to ``target``; return the source.
    An archive without an identity file holds a segment to ``system_identifier`` when given
    (the one the segments a caller read before had). ``segment_size`` is the archive's, when
    the caller has decided it by :func:`archive_segment_size` (the prefetch filler records
    it): else it is decided here. A sealed file is decrypted with ``identity_file``
    (``--identity``) first; without one it is NoIdentity naming who can read it.

    Raises NotInArchive when no form of the file exists, ConfigurationError for a bad name or
    target, ArchiveError (CorruptFile for a file that cannot be decoded, DamagedSegment for
    one that decodes to WAL that must not be served) naming the file otherwise.
    """
    if not target:
        raise ConfigurationError("the target file name (%p) is empty")
    if not directory.is_dir():
        raise ArchiveError(f'archive directory "{directory}" does not exist or is not a '
                           "directory")
    identity = read_identity_file(directory)
    unsealer = None
    fingerprints = sealed_fingerprints(identity)
    for candidate in candidates(directory, name, partial=partial, fingerprints=fingerprints):
        try:
            source = open_regular(candidate.path)  # a symlink, FIFO or device is damage
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ArchiveError(f'cannot open "{candidate.path}": {exc.strerror}') from exc
        with source:
            size = segment_size or archive_segment_size(directory, identity)
            if candidate.encrypted:
                from receivewal.archive.sealed import (  # noqa: PLC0415
                    Unsealer,
                    known_sets,
                    sealed_cap,
                )

                unsealer = Unsealer(identity_file, known_sets(
                    () if identity is None else identity.recipient_sets))
                source = unsealer.opened(str(candidate.path), sealed_cap(size), source=source)
            write_restored(source, candidate, size, Path(target), str(candidate.path),
                           identity=identity, system_identifier=system_identifier,
                           following=_following(directory, candidate, size, unsealer,
                                                fingerprints))
        return candidate.path
    raise NotInArchive(f'"{name}" is not in the archive "{directory}"')


def _following(directory: Path, candidate: Candidate, size: int,
               unsealer: Unsealer | None = None,
               fingerprints: tuple[str, ...] = ("",)) -> Following | None:
    """The first bytes of the complete segment after ``candidate`` in the archive, when it
    is there (a complete segment's last record often runs into it: its CRC covers both); None
    for a ``.partial`` (nothing after it is served) or a file that is not a segment. A next
    segment that cannot be read is not at hand: its own call judges it."""
    parsed = parse_archive_segment_name(candidate.path.name, size)
    if not candidate.segment or candidate.partial or parsed is None:
        return None
    name = wal_file_name(parsed.timeline, parsed.segno + 1, size)

    def read(count: int) -> bytes | None:
        for form in complete_forms(directory, name, fingerprints):
            if os.path.lexists(form.path):
                if form.encrypted and unsealer is None:
                    return None
                opener = None if not form.encrypted or unsealer is None else \
                    unsealed_opener(unsealer, size)
                try:
                    return read_wal_file(str(form.path), form.fmt, count, opener)
                except (ArchiveError, OSError):
                    return None
        return None

    return read


def unsealed_opener(unsealer: Unsealer, size: int) -> Callable[[str], BinaryIO]:
    """An opener of sealed segment files of ``size``-byte segments through ``unsealer``."""
    from receivewal.archive.sealed import sealed_cap  # noqa: PLC0415

    return lambda path: unsealer.opened(path, sealed_cap(size))


def archive_segment_size(directory: Path, identity: ArchiveIdentity | None) -> int:
    """The segment size of the archive in ``directory`` by the one rule,
    :func:`~receivewal.archive.sources.decide_segment_size` (verify's, a bucket's and the
    filler's too), from the same inputs: its identity file's (``identity``, validated), else
    the size most of its segment files' first page headers state (the directory is listed
    then), else PostgreSQL's default (the checks then judge the file)."""
    return decide_segment_size(identity, str(directory), _listed(directory)) \
        or DEFAULT_SEGMENT_SIZE


def _listed(directory: Path) -> Iterator[str]:
    """The directory's file names in order, listed when first asked for."""
    yield from sorted(os.listdir(directory))
