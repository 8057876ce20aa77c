"""The record of a complete backup, ``backups/<id>/backup.json`` (pure).

The record is written last, once every tar and the manifest are durable: a backup directory
without it is no backup (an interrupted or running one), whatever else it holds. It says what
recovery and retention need without opening the tars: the start and end positions and
timelines, when the backup started and ended, its label, the system it comes from, and each
stored tar (file name, tablespace, how it is compressed, its sizes).

Times are UTC in ISO 8601. The end time is the client's clock when the server reported the end
position, which is after the server reached it: choosing a backup that "ends before" a target
time by it errs on the safe side (by the clocks' difference, if the server's runs ahead).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from receivewal.errors import ArchiveError, ReceivewalError
from receivewal.wal.lsn import check_segment_size, format_lsn, parse_lsn, segment_of
from receivewal.wal.names import RECIPIENTS_SUFFIX, wal_file_name
from receivewal.wal.timeline import is_timeline_id

RECORD_NAME = "backup.json"
RECORD_FORMAT = 1
RECORD_CAP = 1 << 20


class RecordError(ArchiveError):
    """A backup record that cannot be read or does not hold what a record must."""


@dataclass(frozen=True)
class StoredArchive:
    """One tar file of a backup directory."""

    name: str  # the file in the backup directory: base.tar.zst, 16385.tar.gz, ...
    tablespace_oid: int | None  # None: the main data directory
    location: str  # the tablespace's directory on the server ("" for the main one)
    compression: str  # how the file is stored: "", "gzip", "lz4" or "zstd"
    stored_bytes: int
    tar_bytes: int


@dataclass(frozen=True)
class WalSpan:
    """The WAL a backup needs on one timeline (the manifest's ``WAL-Ranges``)."""

    timeline: int
    start: int
    end: int


@dataclass(frozen=True)
class BackupRecord:
    """What ``backup.json`` says of a complete backup."""

    backup_id: str
    label: str
    system_identifier: str
    server_version: int
    wal_segment_size: int
    timeline: int  # the start position's
    start_lsn: int
    end_timeline: int
    end_lsn: int
    start_time: datetime
    end_time: datetime
    archives: tuple[StoredArchive, ...]
    wal_spans: tuple[WalSpan, ...]
    manifest_name: str
    manifest_sha256: str  # of the manifest (its plaintext when sealed)
    database_bytes: int  # the size of the files the manifest lists
    #: the age recipients every tar and the manifest are sealed to (``--encrypt-to``),
    #: sorted; empty: stored plain
    encrypted_to: tuple[str, ...] = ()

    @property
    def stored_bytes(self) -> int:
        """The bytes of the backup's tars as stored."""
        return sum(archive.stored_bytes for archive in self.archives)

    def wal_segments(self) -> list[str]:
        """The WAL files a recovery of this backup reads before it is consistent: on each
        timeline of its WAL spans, from the segment of the span's start to its end's."""
        size = self.wal_segment_size
        names: list[str] = []
        for span in self.wal_spans:
            first = segment_of(span.start, size)
            last = segment_of(max(span.end - 1, span.start), size)
            names.extend(wal_file_name(span.timeline, segno, size)
                         for segno in range(first, last + 1))
        return names


def recorded_files(record: BackupRecord) -> dict[str, int | None]:
    """Every file the backup's record says it has, with its size when the record gives one
    (its tars'; None: the manifest's, and the recipients files of a sealed backup)."""
    files: dict[str, int | None] = {a.name: a.stored_bytes for a in record.archives}
    files[record.manifest_name] = None
    if record.encrypted_to:  # each sealed file's recipients file beside it, as written
        files.update({name + RECIPIENTS_SUFFIX: None for name in list(files)})
    return files


def absent_files(record: BackupRecord, listing: Mapping[str, int]) -> str | None:
    """Why the backup is not all there, by a listing of its files (name: size); None when
    every file its record names is listed, each tar with its recorded size. The proof
    retention and recovery ask of a backup before they count it (a listing, no data read)."""
    problems = []
    for name, size in recorded_files(record).items():
        found = listing.get(name)
        if found is None:
            problems.append(f"{name} is missing")
        elif size is not None and found != size:
            problems.append(f"{name} holds {found} bytes, its record says {size}")
    if not problems:
        return None
    return "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)"
                                      if len(problems) > 3 else "")


def utc_text(moment: datetime) -> str:
    """A time as the record writes it."""
    return moment.astimezone(UTC).isoformat()


def record_to_json(record: BackupRecord) -> bytes:
    """The record's file content."""
    document = {
        "format": RECORD_FORMAT,
        "backup_id": record.backup_id,
        "label": record.label,
        "system_identifier": record.system_identifier,
        "server_version": record.server_version,
        "wal_segment_size": record.wal_segment_size,
        "timeline": record.timeline,
        "start_lsn": format_lsn(record.start_lsn),
        "end_timeline": record.end_timeline,
        "end_lsn": format_lsn(record.end_lsn),
        "start_time": utc_text(record.start_time),
        "end_time": utc_text(record.end_time),
        "archives": [{"name": a.name, "tablespace_oid": a.tablespace_oid,
                      "location": a.location, "compression": a.compression,
                      "stored_bytes": a.stored_bytes, "tar_bytes": a.tar_bytes}
                     for a in record.archives],
        "wal_ranges": [{"timeline": span.timeline, "start_lsn": format_lsn(span.start),
                        "end_lsn": format_lsn(span.end)} for span in record.wal_spans],
        "manifest": {"name": record.manifest_name, "sha256": record.manifest_sha256},
        "database_bytes": record.database_bytes,
    }
    if record.encrypted_to:
        document["encryption"] = {"format": "age", "recipients": list(record.encrypted_to)}
    return (json.dumps(document, indent=1) + "\n").encode()


def record_from_json(data: bytes, where: str) -> BackupRecord:
    """Parse a record; RecordError naming ``where`` when it is not one."""
    try:
        record = _record_of(json.loads(data))
    except (ValueError, KeyError, TypeError, ReceivewalError) as exc:
        problem = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise RecordError(f"{where}: {problem}") from None
    return record


def _str(document: dict[str, Any], key: str) -> str:
    value = document[key]
    if not isinstance(value, str):
        raise TypeError(f"{key!r} is not a string")
    return value


def _int(document: dict[str, Any], key: str, *, optional: bool = False) -> Any:
    value = document[key]
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError(f"{key!r} is not a count")
    return value


def _time(document: dict[str, Any], key: str) -> datetime:
    moment = datetime.fromisoformat(_str(document, key))
    if moment.tzinfo is None:
        raise ValueError(f"{key!r} has no time zone")
    return moment


def _tar_of(item: Any) -> StoredArchive:
    if not isinstance(item, dict):
        raise TypeError("an archive entry is not an object")
    name = _str(item, "name")
    if "/" in name or name.startswith(".") or not name:
        raise ValueError(f"archive file name {name!r} is not a plain name")
    compression = _str(item, "compression")
    if compression not in ("", "gzip", "lz4", "zstd"):
        raise ValueError(f"unknown compression {compression!r}")
    return StoredArchive(name, _int(item, "tablespace_oid", optional=True),
                         _str(item, "location"), compression, _int(item, "stored_bytes"),
                         _int(item, "tar_bytes"))


def _span_of(item: Any) -> WalSpan:
    if not isinstance(item, dict):
        raise TypeError("a WAL range is not an object")
    span = WalSpan(_int(item, "timeline"), parse_lsn(_str(item, "start_lsn")),
                   parse_lsn(_str(item, "end_lsn")))
    if not is_timeline_id(span.timeline) or span.end < span.start:
        raise ValueError("a WAL range is not one")
    return span


def _encrypted_to(value: Any) -> tuple[str, ...]:
    """The recipients of ``"encryption"`` (absent: a plain backup)."""
    if value is None:
        return ()
    if not isinstance(value, dict) or value.get("format") != "age":
        raise ValueError("'encryption' is not an age recipient list")
    recipients = value["recipients"]
    if not isinstance(recipients, list) or not recipients \
            or not all(isinstance(r, str) for r in recipients):
        raise TypeError("'encryption' lists no recipients")
    return tuple(recipients)


def _record_of(document: Any) -> BackupRecord:
    if not isinstance(document, dict) or document.get("format") != RECORD_FORMAT:
        raise ValueError(f"not a backup record of format {RECORD_FORMAT}")
    archives = tuple(_tar_of(item) for item in document["archives"])
    if sum(1 for a in archives if a.tablespace_oid is None) != 1:
        raise ValueError("not exactly one archive of the main data directory")
    manifest = document["manifest"]
    if not isinstance(manifest, dict):
        raise TypeError("'manifest' is not an object")
    record = BackupRecord(
        backup_id=_str(document, "backup_id"), label=_str(document, "label"),
        system_identifier=_str(document, "system_identifier"),
        server_version=_int(document, "server_version"),
        wal_segment_size=_int(document, "wal_segment_size"),
        timeline=_int(document, "timeline"), start_lsn=parse_lsn(_str(document, "start_lsn")),
        end_timeline=_int(document, "end_timeline"),
        end_lsn=parse_lsn(_str(document, "end_lsn")),
        start_time=_time(document, "start_time"), end_time=_time(document, "end_time"),
        archives=archives, wal_spans=tuple(_span_of(item) for item in document["wal_ranges"]),
        manifest_name=_str(manifest, "name"),
        manifest_sha256=_str(manifest, "sha256"),
        database_bytes=_int(document, "database_bytes"),
        encrypted_to=_encrypted_to(document.get("encryption")),
    )
    if not (is_timeline_id(record.timeline) and is_timeline_id(record.end_timeline)):
        raise ValueError("a timeline is not a timeline ID")
    if record.end_lsn < record.start_lsn or record.end_time < record.start_time:
        raise ValueError("the backup ends before it starts")
    if not record.wal_spans:
        raise ValueError("no WAL ranges")
    check_segment_size(record.wal_segment_size)
    return record
