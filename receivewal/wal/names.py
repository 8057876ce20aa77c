"""The archive's naming rules (pure): WAL segment, `.partial`, compressed and history file names.

A segment file is named ``TTTTTTTTXXXXXXXXYYYYYYYY``: timeline, then the segment number split
into a "log" part and a "seg" part, each eight upper-case hex digits, as PostgreSQL names the
files in ``pg_wal``. An archive may also hold the same name with a compression suffix (``.gz``
and ``.lz4`` as pg_receivewal 15 writes them, ``.zst`` which receivewal adds) and with a
``.partial`` suffix for a segment that is still being received. A file encrypted at rest adds
``.age`` after the compression suffix, with the fingerprint of the recipient set it is sealed
to between them (``.zst.0123456789abcdef.age``; ``.zst.age`` in the older form): encryption is
a layer over the at-rest format, not a member of :class:`AtRest`; see the end of this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from receivewal.wal import leannames
from receivewal.wal.leannames import (
    AT_REST_SUFFIXES,
    sealed_suffix,
    segments_per_xlogid,
)
from receivewal.wal.leannames import split_sealed as split_sealed  # noqa: PLC0414 - readers' one
from receivewal.wal.lsn import segment_start
from receivewal.wal.timeline import is_timeline_id

PARTIAL_SUFFIX = leannames.PARTIAL_SUFFIX


class AtRest(StrEnum):
    """The at-rest formats of an archive file: the value is ``-Z``'s method name ("" for
    plain), ``suffix`` what the file name carries. This is the one list of formats: the name
    parser below, and the codec table in :mod:`receivewal.archive.compression` (readers and
    writers, keyed by these members), are built from it."""

    PLAIN = ""
    GZIP = "gzip"
    LZ4 = "lz4"
    ZSTD = "zstd"

    @property
    def suffix(self) -> str:
        """The file name suffix of this format (``.gz``, ``.lz4``, ``.zst``; "" for plain)."""
        return _SUFFIXES[self]


_SUFFIXES = dict(zip(AtRest, AT_REST_SUFFIXES, strict=True))
_BY_SUFFIX = {fmt.suffix: fmt for fmt in AtRest}
#: method -> suffix, for callers that index by the method name
COMPRESSION_SUFFIXES = {fmt.value: fmt.suffix for fmt in AtRest}

_HEX8 = "([0-9A-F]{8})"
_SEGMENT_RE = re.compile(
    _HEX8 * 3
    + "(" + "|".join(re.escape(fmt.suffix) for fmt in AtRest if fmt.suffix) + ")?"
    + f"({re.escape(PARTIAL_SUFFIX)})?"
)
_HISTORY_RE = re.compile(r"([0-9A-F]{8})\.history")


def looks_like_segment(name: str) -> bool:
    """Whether ``name`` has the shape of a segment file name, whatever the segment size (the
    segment number may still be impossible for a given size: see parse_segment_file_name)."""
    return _SEGMENT_RE.fullmatch(name) is not None

_OTHER_WAL_RE = re.compile(r"[0-9A-F]{24}\.[0-9A-F]{8}\.backup")


def at_rest_of(name: str) -> AtRest:
    """The at-rest format a file name says (by its suffix, before any ``.partial``)."""
    stem = name.removesuffix(PARTIAL_SUFFIX)
    dot = stem.rfind(".")
    return _BY_SUFFIX.get(stem[dot:], AtRest.PLAIN) if dot >= 0 else AtRest.PLAIN


@dataclass(frozen=True, order=True)
class SegmentFile:
    """A parsed segment file name. Orders by segment number, then timeline."""

    segno: int
    timeline: int
    compression: str = AtRest.PLAIN  # an AtRest member: "", "gzip", "lz4" or "zstd"
    partial: bool = False
    encrypted: bool = False  # ``.age`` after the compression suffix (never a ``.partial``)
    fingerprint: str = ""  # a sealed file's recipient set, as its name says ("": older form)

    def wal_name(self, segment_size: int) -> str:
        """The bare WAL file name, without compression or `.partial` suffix."""
        return wal_file_name(self.timeline, self.segno, segment_size)

    def file_name(self, segment_size: int) -> str:
        """The name of this file as it stands in the archive."""
        suffix = AtRest(self.compression).suffix
        return self.wal_name(segment_size) + suffix + (PARTIAL_SUFFIX if self.partial else "") \
            + (sealed_suffix(self.fingerprint) if self.encrypted else "")

    def start_lsn(self, segment_size: int) -> int:
        """The LSN of the segment's first byte."""
        return segment_start(self.segno, segment_size)


def wal_file_name(timeline: int, segno: int, segment_size: int) -> str:
    """The name PostgreSQL gives segment ``segno`` of ``timeline``."""
    per_id = segments_per_xlogid(segment_size)
    return f"{timeline:08X}{segno // per_id:08X}{segno % per_id:08X}"


def parse_segment_file_name(name: str, segment_size: int) -> SegmentFile | None:
    """Parse an archive file name; None when the name is not a segment file's."""
    match = _SEGMENT_RE.fullmatch(name)
    if match is None:
        return None
    timeline = int(match.group(1), 16)
    log, seg = int(match.group(2), 16), int(match.group(3), 16)
    per_id = segments_per_xlogid(segment_size)
    if not is_timeline_id(timeline) or seg >= per_id:
        return None
    return SegmentFile(
        segno=log * per_id + seg,
        timeline=timeline,
        compression=_BY_SUFFIX[match.group(4) or ""],
        partial=match.group(5) is not None,
    )


def history_file_name(timeline: int) -> str:
    """The name of the history file that describes how ``timeline`` began."""
    return f"{timeline:08X}.history"


def parse_history_file_name(name: str) -> int | None:
    """The timeline a history file name is for; None when it is not one."""
    match = _HISTORY_RE.fullmatch(name)
    return int(match.group(1), 16) if match else None


def is_wal_file_name(name: str) -> bool:
    """A bare segment name (``TTTTTTTTXXXXXXXXYYYYYYYY``), as PostgreSQL asks for one."""
    match = _SEGMENT_RE.fullmatch(name)
    return match is not None and match.group(4) is None and match.group(5) is None


def is_other_wal_file_name(name: str) -> bool:
    """A history or backup history file name, which an archive holds as it is."""
    return parse_history_file_name(name) is not None or _OTHER_WAL_RE.fullmatch(name) is not None


# -- encryption at rest ------------------------------------------------------------------------
#: The suffix of a file encrypted at rest (an age file), after any compression suffix and the
#: fingerprint of its recipient set: a segment is compressed, then encrypted
#: (``000000010000000000000004.zst.0123456789abcdef.age``; see
#: :func:`~receivewal.wal.leannames.split_sealed`, and ``...04.zst.age``, the older form whose
#: set is in its recipients file). Never before
#: ``.partial``: a segment is encrypted when it is completed; a ``.partial`` stays as it is
#: written (plain or compressed). History files stay plain. (Spelled in
#: :mod:`receivewal.wal.leannames`, which a restore call's lean path reads.)
ENCRYPTED_SUFFIX = leannames.ENCRYPTED_SUFFIX
#: The suffix of the file next to an encrypted file of the older form that lists the
#: recipients it is for (``000000010000000000000004.zst.age.recipients``; see
#: :mod:`receivewal.archive.recipients`): read, no longer written.
RECIPIENTS_SUFFIX = ".recipients"


def encrypted_file_name(name: str, fingerprint: str = "") -> str:
    """The name of the file ``name`` (complete, plain or compressed) once encrypted to the
    recipient set whose fingerprint is ``fingerprint`` (none: the older form's name)."""
    assert not name.endswith((PARTIAL_SUFFIX, ENCRYPTED_SUFFIX)), name
    return name + sealed_suffix(fingerprint)


def unsealed_name(name: str) -> str:
    """The name of what the sealed file ``name`` holds (``...04.zst``), in either form;
    ``name`` itself when it is not sealed."""
    sealed = split_sealed(name)
    return name if sealed is None else sealed[0]


def recipients_file_name(name: str) -> str:
    """The name of the recipients file of the encrypted file ``name``."""
    assert name.endswith(ENCRYPTED_SUFFIX), name
    return name + RECIPIENTS_SUFFIX


def parse_encrypted_segment_name(name: str, segment_size: int) -> SegmentFile | None:
    """The complete segment file an encrypted file holds, as :func:`parse_segment_file_name`
    parses its name without its sealed suffix (``...04.zst.0123456789abcdef.age``: segment 4,
    zstd, sealed to that set; ``...04.zst.age``, the older form); None when ``name``
    is not an encrypted complete segment's (a ``.partial`` is never encrypted).
    :func:`parse_segment_file_name` itself does not take encrypted names: the readers of
    an archive learn them when they learn to decrypt."""
    sealed = split_sealed(name)
    if sealed is None:
        return None
    segment = parse_segment_file_name(sealed[0], segment_size)
    if segment is None or segment.partial:
        return None
    return SegmentFile(segment.segno, segment.timeline, segment.compression, encrypted=True,
                       fingerprint=sealed[1])


def parse_archive_segment_name(name: str, segment_size: int) -> SegmentFile | None:
    """A segment file of an archive in any of its forms: :func:`parse_segment_file_name`'s,
    or an encrypted complete one (:func:`parse_encrypted_segment_name`, ``encrypted`` set):
    for the readers that know encrypted files (the resume scan, the uploads, verify)."""
    return parse_segment_file_name(name, segment_size) \
        or parse_encrypted_segment_name(name, segment_size)
