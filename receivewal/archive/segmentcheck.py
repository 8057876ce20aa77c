"""The one check a segment passes before it leaves the archive: :func:`checked_segment`.

PostgreSQL trusts what restore_command gives it: handed a damaged segment, or another
cluster's, it ends replay at the first bad record, promotes and never reads the segments
after it. So every path that hands WAL out (restore from a directory or a bucket,
``--partial``, the prefetch filler before it spools a file, the uploader before an upload)
goes through this function, with the segment's bytes (decompressed), its name and the
archive's identity, and gets a :class:`CheckedSegment` or a :class:`DamagedSegment` naming
the file and the LSN. What is checked, by the WAL reader verify uses
(:class:`~receivewal.wal.reader.SegmentScanner`, the C scanner where it is built):

- every page header, against the segment's name (page address; timeline, as the reader's
  rules have it: no page of a later timeline than the file's, none going back), the segment
  size (the archive's, by the one rule of :mod:`receivewal.archive.sources`) and the block
  size;
- the system identifier in its first page header, against the archive's identity;
- every record that lies in the segment: length, resource manager, ``xl_prev`` link, CRC-32C
  and block references; the lengths of a record that runs into the next segment, and of the
  one the segment opens with, whose CRCs need that other segment (``following`` finishes the
  last record from the next segment's first pages when the caller has them);
- a complete segment is a whole segment of WAL (zeros only after an XLOG_SWITCH record);
  a ``.partial`` is valid WAL, then zeros.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

from receivewal.archive.compression import CorruptFile, decompress_chunks
from receivewal.archive.identity import ArchiveIdentity
from receivewal.archive.reading import open_regular
from receivewal.errors import ArchiveError, ConfigurationError
from receivewal.wal.lsn import DEFAULT_SEGMENT_SIZE, format_lsn
from receivewal.wal.names import at_rest_of, parse_segment_file_name
from receivewal.wal.reader import SegmentScanner


class DamagedSegment(ArchiveError):  # noqa: N818 - reads as what the caller is told
    """A segment that must not be handed out: ``file`` (a path or URL), the ``lsn`` where it
    goes wrong and what is wrong there (``outcome``: what is therefore not done). Never
    retryable: the bytes will not change."""

    def __init__(self, file: str, lsn: int, detail: str, outcome: str = "not served") -> None:
        super().__init__(f'"{file}" at {format_lsn(lsn)}: {detail}: {outcome}')
        self.file, self.lsn, self.detail = file, lsn, detail

    def refusing(self, outcome: str) -> DamagedSegment:
        """The same finding, saying ``outcome`` (e.g. "not uploaded") instead."""
        return DamagedSegment(self.file, self.lsn, self.detail, outcome)


@dataclass(frozen=True)
class CheckedSegment:
    """A segment that passed :func:`checked_segment`: its bytes as given (a ``.partial``'s
    without the zeros that pad it to a segment), and what they were checked against."""

    name: str
    data: bytes | bytearray
    segment_size: int
    system_identifier: int | None  # None: a .partial holding no WAL at all
    partial: bool


#: ``following(count)``: the first ``count`` bytes of the next segment (decompressed), or None
#: when it is not at hand.
Following = Callable[[int], bytes | None]


def checked_segment(data: bytes | bytearray, name: str, identity: ArchiveIdentity | None, *,
                    partial: bool = False, file: str | None = None,
                    segment_size: int | None = None, system_identifier: int | None = None,
                    following: Following | None = None) -> CheckedSegment:
    """Check the segment ``name`` (``TTTTTTTTXXXXXXXXYYYYYYYY``) whose decompressed bytes are
    ``data`` (``partial``: a ``.partial``'s, at most a segment) from the archive whose identity
    record is ``identity`` (None when it has none: then ``system_identifier``, when given, is
    the one its segments must have, e.g. the first one a recovery read, and ``segment_size``
    the archive's, as :func:`~receivewal.archive.sources.decide_segment_size` decides it for
    every reader; PostgreSQL's default when not given).

    Returns the :class:`CheckedSegment`; raises :class:`DamagedSegment` naming ``file``
    (default ``name``) and the LSN of the first thing wrong, ConfigurationError when ``name``
    is not a segment's name at that size.
    """
    file = file or name
    if identity is not None:
        size = identity.segment_size
        system_identifier = int(identity.system_identifier)
    else:
        size = segment_size or DEFAULT_SEGMENT_SIZE
    segment = parse_segment_file_name(name, size)
    if segment is None or segment.partial or segment.compression:
        raise ConfigurationError(f"{name!r} is not a WAL segment name for {size}-byte segments")
    start = segment.start_lsn(size)
    scanner = SegmentScanner(data, name, start_lsn=start, segment_size=size,
                             timeline=segment.timeline, segno=segment.segno, partial=partial)
    scanner.scan()
    if following is not None and scanner.next_bytes_needed():
        head = following(scanner.next_bytes_needed())
        if head is not None:
            scanner.continue_record(head, "the next segment")
    scan = scanner.result()
    errors = sorted((p for p in scan.problems if p.severity == "error"), key=lambda p: p.lsn)
    if errors:
        first = errors[0]
        where = "" if first.file == name else f" (in {first.file})"
        raise DamagedSegment(file, first.lsn, f"damaged WAL{where}: {first.detail} "
                                              f"({first.kind})")
    found = scan.system_identifier
    if found is not None and system_identifier is not None and found != system_identifier:
        raise DamagedSegment(file, start, f"WAL of database system {found}, but the archive "
                                          f"belongs to database system {system_identifier}")
    return CheckedSegment(name, data, size, found, partial)


def checked_file(path: Path, identity: ArchiveIdentity) -> bytes:
    """The bytes of the complete archive segment file at ``path`` (any at-rest form, as it
    sits), once its decompressed content has passed :func:`checked_segment` against
    ``identity``: what the uploader hands to the store, so that the bytes checked are the
    bytes uploaded, whatever happens to the file meanwhile. Raises DamagedSegment (saying
    "not uploaded") or CorruptFile naming the file, OSError when it cannot be read."""
    size = identity.segment_size
    with open_regular(path) as fh:
        raw = fh.read(size + size // 64 + 1)  # the largest a segment is, compressed or not
    fmt = at_rest_of(path.name)
    try:
        data = raw if not fmt else b"".join(decompress_chunks(BytesIO(raw), fmt, cap=size))
        checked_segment(data, path.name[:24], identity, file=str(path))
    except CorruptFile as exc:
        raise CorruptFile(f'"{path}" {exc}: not uploaded') from exc
    except DamagedSegment as exc:
        raise exc.refusing("not uploaded") from None
    return raw
