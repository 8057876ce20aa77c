"""Whose WAL an archive holds: the identity record, in a directory or at a bucket prefix.

One JSON document (system identifier as PostgreSQL prints it, in decimal; segment size;
timeline) read and written the same way wherever the archive lives, and one rule for a server
that is not the archive's own. An archive encrypted at rest also lists the recipient sets its
files were encrypted to (``recipient_sets``, see :mod:`receivewal.archive.recipients`); the
record of an archive that never was is written as before, and readers that predate the field
ignore it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# the record's name, spelled once at the location (restore's lean path), re-exported here
from receivewal.archive.location import IDENTITY_FILE as IDENTITY_FILE  # noqa: PLC0414
from receivewal.archive.location import DirectoryLocation, Location
from receivewal.archive.recipients import AdoptedSet, sets_from_json, sets_to_json
from receivewal.errors import (
    ArchiveError,
    ForeignArchive,
    ObjectConflict,
    ObjectNotFound,
    ReceivewalError,
)
from receivewal.wal.lsn import check_segment_size
from receivewal.wal.pageheader import MAX_SYSTEM_IDENTIFIER
from receivewal.wal.timeline import is_timeline_id

IDENTITY_CAP = 64 * 1024  # an identity record is a few lines


@dataclass(frozen=True)
class ArchiveIdentity:
    """Whose WAL an archive holds."""

    system_identifier: str
    segment_size: int
    timeline: int
    recipient_sets: tuple[AdoptedSet, ...] = ()  # in the order adopted; the last is current


def sealed_fingerprints(identity: ArchiveIdentity | None) -> tuple[str, ...]:
    """The fingerprints a sealed file of the archive whose record is ``identity`` may carry in
    its name, in the order a reader looks for them: its sets' from the newest on, then ""
    (the older form, its set in a recipients file beside it)."""
    sets = () if identity is None else identity.recipient_sets
    found = dict.fromkeys(adopted.recipients.fingerprint for adopted in reversed(sets))
    return (*found, "")


def identity_from_json(data: object) -> ArchiveIdentity:
    """Validate the identity file's values; ValueError or TypeError saying which is wrong."""
    if not isinstance(data, dict):
        raise TypeError("not a JSON object")
    sysid, size, timeline = (data.get(key) for key in
                             ("system_identifier", "wal_segment_size", "timeline"))
    if not isinstance(sysid, str | int) or isinstance(sysid, bool) or not str(sysid).isdigit() \
            or not 0 < int(sysid) <= MAX_SYSTEM_IDENTIFIER:
        raise ValueError(f"system_identifier {sysid!r} is not a database system identifier")
    if not isinstance(size, int) or isinstance(size, bool):
        raise TypeError(f"wal_segment_size {size!r} is not an integer")
    try:
        check_segment_size(size)
    except ReceivewalError as exc:
        raise ValueError(f"wal_segment_size: {exc}") from exc
    if not isinstance(timeline, int) or isinstance(timeline, bool) \
            or not is_timeline_id(timeline):
        raise ValueError(f"timeline {timeline!r} is not a timeline")
    return ArchiveIdentity(str(sysid), size, timeline, sets_from_json(data.get("recipient_sets")))


def parse_identity_record(body: bytes, where: str, kind: str = "file") -> ArchiveIdentity:
    """The identity record read from ``where`` (its file's path, or with ``kind`` "object" an
    object's URL; the caller reads it, wherever the archive lives): ArchiveError naming it
    when it is not a valid one. Every reader of the record parses it here."""
    import json  # noqa: PLC0415 - only an archive with an identity record needs it

    try:
        return identity_from_json(json.loads(body))
    except RecursionError:
        raise ArchiveError(f'invalid archive identity {kind} "{where}": nested too deeply'
                           ) from None
    except (ValueError, TypeError, OverflowError) as exc:
        raise ArchiveError(f'invalid archive identity {kind} "{where}": {str(exc)[:200]}'
                           ) from exc


def read_identity(location: Location) -> ArchiveIdentity | None:
    """The identity record where the archive lives (a directory or a bucket prefix, through
    the location door), None when it has none yet; ArchiveError naming the file or object
    when it cannot be read or is not a valid one."""
    where = location.where(IDENTITY_FILE)
    try:
        body = location.read_small(IDENTITY_FILE, IDENTITY_CAP)
    except (FileNotFoundError, ObjectNotFound):
        return None
    except OSError as exc:
        raise ArchiveError(f'invalid archive identity file "{where}": {str(exc)[:200]}'
                           ) from exc
    return parse_identity_record(body, where, "file" if location.is_local else "object")


def claim_identity(location: Location, identity: ArchiveIdentity) -> bool:
    """Record ``identity`` where the archive lives, create-only, unless that location is
    another cluster's already (ForeignArchive naming both). True when this call wrote the
    record, False when it was there already."""
    # create-only first, read only when something is there: without s3:ListBucket, AWS
    # answers a GET of a missing key with 403, which would read as access denied
    try:
        return location.put_new(IDENTITY_FILE, identity_to_json(identity))
    except ObjectConflict:  # a record is there already, and not byte-identical
        recorded = read_identity(location)
    if recorded is None:
        raise ArchiveError(f"{location.where(IDENTITY_FILE)}: the identity record vanished "
                           "while it was claimed")
    check_same_cluster(location.where(), recorded, identity)
    return False


def read_identity_file(directory: str | os.PathLike[str]) -> ArchiveIdentity | None:
    """The identity recorded in the archive directory ``directory`` (:func:`read_identity`
    through the directory driver), None when it has none yet: what a restore call reads, here
    so that it reads it without the archive writer's modules."""
    return read_identity(DirectoryLocation(directory))


def identity_to_json(identity: ArchiveIdentity) -> bytes:
    """The identity record's bytes (the file in a directory, the object at a prefix)."""
    import json  # noqa: PLC0415 - a writer's need: readers (verify) parse without this module

    record: dict[str, object] = {
        "system_identifier": identity.system_identifier,
        "wal_segment_size": identity.segment_size,
        "timeline": identity.timeline,
    }
    if identity.recipient_sets:
        record["recipient_sets"] = sets_to_json(identity.recipient_sets)
    return json.dumps(record, indent=2).encode() + b"\n"


def check_same_cluster(where: str, recorded: ArchiveIdentity, server: ArchiveIdentity) -> None:
    """ForeignArchive naming both values when the archive at ``where`` (e.g. ``directory "D"``
    or ``s3://B/P``) holds another cluster's WAL or segments of another size."""
    if recorded.system_identifier != server.system_identifier:
        raise ForeignArchive(f"{where} belongs to database system {recorded.system_identifier}, "
                           f"but the server is database system {server.system_identifier}")
    if recorded.segment_size != server.segment_size:
        raise ForeignArchive(f"{where} holds segments of {recorded.segment_size} bytes, but the "
                           f"server's wal_segment_size is {server.segment_size}")
