"""WAL file names read by their characters: the rules a restore call needs on its lean path
(see :mod:`receivewal.restore`), with no import beyond :mod:`receivewal.wal.lsn`.
:mod:`receivewal.wal.names`, the full parser (regular expressions, dataclasses), builds on them.

A segment is named ``TTTTTTTTXXXXXXXXYYYYYYYY``: its timeline (never 0), then its number split
into a "log" part and a "seg" part, each eight upper-case hex digits, as PostgreSQL names the
files in ``pg_wal``; a timeline's history file is ``TTTTTTTT.history``. An archive keeps a
segment plain or compressed, its name then carrying one of :data:`AT_REST_SUFFIXES`.
"""

from __future__ import annotations

from receivewal.wal.lsn import join_lsn

TYPE_CHECKING = False  # restore's lean path loads no typing (~10 ms): see receivewal.restore
if TYPE_CHECKING:
    from collections.abc import Iterable

#: The at-rest suffixes of a segment, in the order of :class:`receivewal.wal.names.AtRest`
#: (plain, gzip, lz4, zstd), which takes its suffixes from here.
AT_REST_SUFFIXES = ("", ".gz", ".lz4", ".zst")
#: What a file encrypted at rest adds after its at-rest suffix (:mod:`receivewal.wal.names`).
ENCRYPTED_SUFFIX = ".age"
#: A sealed file's name carries the fingerprint of the recipient set it is sealed to (16
#: lower-case hex digits, :attr:`receivewal.archive.recipients.RecipientSet.fingerprint`)
#: between what it was before sealing and ``.age``: ``000000010000000000000005.zst.`` +
#: ``0123456789abcdef.age``; the set itself is listed once, in the archive's identity record.
#: PostgreSQL never asks for such a name (its names are upper-case hex, ``.history``,
#: ``.partial``, ``.backup``), and no at-rest suffix is 16 hex digits. A sealed name without
#: one (``...05.zst.age``) is the older form, its set in a recipients file beside it.
FINGERPRINT_DIGITS = 16
_FINGERPRINT_HEX = frozenset("0123456789abcdef")
#: What a segment file not yet complete adds after its at-rest suffix (:mod:`receivewal.wal.names`).
PARTIAL_SUFFIX = ".partial"
SEGMENT_NAME_LENGTH = 24
HISTORY_SUFFIX = ".history"
_HEX = frozenset("0123456789ABCDEF")
_NO_TIMELINE = "00000000"


def segments_per_xlogid(segment_size: int) -> int:
    """How many segments share one "log" number in a file name."""
    return 0x1_0000_0000 // segment_size


def is_segment_name(name: str) -> bool:
    """Whether ``name`` is a WAL segment's name (24 upper-case hex digits, a timeline that is
    not 0), whatever the segment size (see :func:`segment_start` for a given one)."""
    return (len(name) == SEGMENT_NAME_LENGTH and _HEX.issuperset(name)
            and name[:8] != _NO_TIMELINE)


def is_history_name(name: str) -> bool:
    """Whether ``name`` is a timeline history file's name (``TTTTTTTT.history``)."""
    return (len(name) == 8 + len(HISTORY_SUFFIX) and name.endswith(HISTORY_SUFFIX)
            and _HEX.issuperset(name[:8]) and name[:8] != _NO_TIMELINE)


def name_timeline(name: str) -> int:
    """The timeline a segment or history file name states (its first eight digits)."""
    return int(name[:8], 16)


def segment_start(name: str, segment_size: int) -> int | None:
    """The LSN at which the segment named ``name`` (:func:`is_segment_name`) starts when
    segments are ``segment_size`` bytes; None when no segment of that size has the name (its
    "seg" part is out of range)."""
    log, seg = int(name[8:16], 16), int(name[16:SEGMENT_NAME_LENGTH], 16)
    if seg >= segments_per_xlogid(segment_size):
        return None
    return join_lsn(log, seg * segment_size)


def is_fingerprint(text: str) -> bool:
    """Whether ``text`` is a recipient set's fingerprint as a sealed name carries it."""
    return len(text) == FINGERPRINT_DIGITS and _FINGERPRINT_HEX.issuperset(text)


def sealed_suffix(fingerprint: str) -> str:
    """What sealing adds to a file's name: ``.FINGERPRINT.age`` (``fingerprint`` "": the older
    form's ``.age``, whose set is in its recipients file)."""
    return f".{fingerprint}{ENCRYPTED_SUFFIX}" if fingerprint else ENCRYPTED_SUFFIX


def split_sealed(name: str) -> tuple[str, str] | None:
    """A sealed file's name read back: the name of what was sealed (``...05.zst``) and the
    fingerprint of the set it is sealed to ("" in the older form, ``...05.zst.age``); None
    when ``name`` is not a sealed file's (no ``.age``)."""
    if not name.endswith(ENCRYPTED_SUFFIX):
        return None
    inner = name[:-len(ENCRYPTED_SUFFIX)]
    dot = inner.rfind(".")
    if dot >= 0 and is_fingerprint(inner[dot + 1:]):
        return inner[:dot], inner[dot + 1:]
    return inner, ""


#: Every suffix a segment's file in an archive can carry after its name but a fingerprint:
#: complete (plain, compressed, sealed in the older form) or ``.partial``.
_STORED_SUFFIXES = frozenset(rest + partial + sealed for rest in AT_REST_SUFFIXES
                             for partial in ("", PARTIAL_SUFFIX)
                             for sealed in ("", ENCRYPTED_SUFFIX))


def is_stored_suffix(suffix: str) -> bool:
    """Whether ``suffix`` is what a segment's file carries after its 24-digit name, in any
    stored form (sealed ones with or without a fingerprint)."""
    if suffix in _STORED_SUFFIXES:
        return True
    sealed = split_sealed(suffix)
    return sealed is not None and sealed[1] != "" and sealed[0] in AT_REST_SUFFIXES


def next_held_after(name: str, names: Iterable[str]) -> str | None:
    """The first segment after segment ``name`` on ``name``'s own timeline that the archive
    file names ``names`` hold, in any stored form (complete, compressed, sealed, or a
    ``.partial``: the daemon completes a segment before the next one's ``.partial`` exists);
    None when there is none.

    The one rule of "gap or end" (restore calls and ``recover`` alike): a missing segment
    with WAL of its timeline after it is a hole in the archive, never the archive's end.
    Other timelines are never counted: after a fork the archive holds the old timeline past
    the fork point, and PostgreSQL asks the new timeline's names from its first segment on,
    never an older timeline's once it has read a newer one."""
    timeline, found = name[:8], None
    for file in names:
        stem = file[:SEGMENT_NAME_LENGTH]
        if (stem > name and stem[:8] == timeline and (found is None or stem < found)
                and is_stored_suffix(file[SEGMENT_NAME_LENGTH:]) and is_segment_name(stem)):
            found = stem
    return found
