"""Writing what a restore serves to ``%p``: a file of the archive (local or in a bucket),
decoded, checked and written atomically.

A segment is decoded whole (any :class:`~receivewal.wal.names.AtRest` form, bounded by the
segment size: memory and the temporary file stay bounded whatever the file holds), handed out
only once :func:`~receivewal.archive.segmentcheck.checked_segment` has passed it (page headers
against its name and the archive's identity, the CRC of every record), and written to a new
temporary file next to ``%p``, fsynced, renamed into place and the directory fsynced
(:func:`~receivewal.archive.durable.durable_file`, never through a planted symlink): recovery
never sees half a file, nor a byte the check has not passed. A ``.partial`` is padded with
zeros to the segment size, as PostgreSQL expects.

Only a file the archive does not have is :class:`NotInArchive` (recovery may end there);
everything else that goes wrong is the project's :class:`~receivewal.errors.ArchiveError`
naming the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from receivewal.archive.compression import CorruptFile
from receivewal.archive.durable import durable_file
from receivewal.archive.identity import ArchiveIdentity
from receivewal.archive.segmentbuffer import decode_segment
from receivewal.archive.segmentcheck import CheckedSegment, Following, checked_segment
from receivewal.archive.storedform import plain_chunks
from receivewal.errors import ReceivewalError
from receivewal.wal.names import AtRest


class NotInArchive(ReceivewalError):  # noqa: N818 - names the outcome, as recovery sees it
    """The archive has no file of that name (recovery may end there)."""


@dataclass(frozen=True)
class Candidate:
    """An archive file that can serve the asked name."""

    path: Path
    fmt: AtRest
    partial: bool
    segment: bool  # a WAL segment (else a history or backup history file, served as it is)
    encrypted: bool = False  # sealed (``.age`` after the ``fmt`` suffix): decrypted first
    fingerprint: str = ""  # a sealed file's recipient set, as its name says ("": older form)


def write_restored(source: BinaryIO, candidate: Candidate, size: int, target: Path,
                   what: str, *, identity: ArchiveIdentity | None,
                   system_identifier: int | None = None,
                   following: Following | None = None) -> CheckedSegment | None:
    """Decode ``source`` (the file ``candidate`` names, ``what`` in messages) and write it to
    ``target`` atomically. A segment is decoded whole (at most ``size`` bytes) and handed out
    only once :func:`~receivewal.archive.segmentcheck.checked_segment` has passed it against
    the archive's ``identity`` (``following``: the next segment's first bytes, to check the
    record that runs into it); a ``.partial`` is padded with zeros to ``size``. The check is
    returned. Any other file (a history file) is copied as it is, at most ``size`` bytes."""
    if not candidate.segment:
        chunks = plain_chunks(source, candidate.fmt, cap=size)
        try:
            with durable_file(target) as out:
                for chunk in chunks:
                    out.write(chunk)
        except CorruptFile as exc:
            raise CorruptFile(f'"{what}" {exc}') from exc
        return None
    try:
        data = decode_segment(source, candidate.fmt, size, partial=candidate.partial)
    except CorruptFile as exc:
        raise CorruptFile(f'"{what}" {exc}') from exc
    checked = checked_segment(data, candidate.path.name[:24], identity,
                              partial=candidate.partial, file=what, segment_size=size,
                              system_identifier=system_identifier, following=following)
    with durable_file(target) as out:
        _write_padded(out, checked.data, size)
    return checked


def _write_padded(out: BinaryIO, data: bytes | bytearray, size: int) -> None:
    """Write a checked segment's bytes, then zeros up to ``size`` (a .partial's padding)."""
    out.write(data)
    out.truncate(size)  # zeros past the received WAL of a .partial
