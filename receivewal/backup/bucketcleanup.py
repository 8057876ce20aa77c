"""``cleanup`` of an archive in a bucket (``s3://BUCKET/PREFIX``): the same plan as a
directory's (:func:`~receivewal.backup.retention.plan_retention`), read and carried out
through :class:`~receivewal.archive.bucket.Bucket` (whose ``delete`` is used here and by a
bucket backup given up).

The prefix holds the WAL files and the identity object; ``backups/<id>/`` holds each backup,
``backup.json`` last. A backup without its record is kept while it may still be uploading:
in a bucket no lock tells it from an interrupted one; once it started more than
:data:`~receivewal.backup.catalog.ABANDONED_AFTER` ago it is abandoned and removed
(:func:`~receivewal.backup.catalog.abandoned`), with the multipart uploads it left unfinished
(a backup of which only those are left is listed too). A backup goes record first, so that a
cleanup cut short leaves files without a record, never a record without its files. Only a
folder named as this package names a backup (:func:`~receivewal.backup.directory.is_backup_id`)
is one: a foreign prefix under ``backups/`` is left alone. A record whose objects are not all
listed, each archive of its recorded size, is no complete backup
(:func:`~receivewal.backup.catalog.proven`): it is not counted, and not removed. No daemon
state is read: the daemon's slot and upload backlog are in its directory, not in the bucket.
"""

from __future__ import annotations

import json
from collections import defaultdict

from receivewal.archive.bucket import Bucket
from receivewal.archive.reading import HISTORY_FILE_CAP
from receivewal.backup.catalog import BackupEntry, EntryState, proven, unrecorded_in_bucket
from receivewal.backup.cleanup import CleanupReport
from receivewal.backup.directory import BACKUPS, is_backup_id
from receivewal.backup.record import RECORD_CAP, RECORD_NAME, record_from_json
from receivewal.backup.retention import ArchiveContents, Policy, plan_retention
from receivewal.errors import ArchiveError, StoreAccessDenied
from receivewal.wal.lsn import DEFAULT_SEGMENT_SIZE
from receivewal.wal.names import parse_archive_segment_name, parse_history_file_name
from receivewal.wal.timeline import TimelineSwitch, parse_history


def read_bucket(bucket: Bucket) -> tuple[ArchiveContents, dict[str, int],
                                         dict[str, list[tuple[str, int]]]]:
    """The archive at the bucket's prefix as the planner judges it, the sizes of its WAL
    files, and each backup's objects (name from the prefix, size)."""
    files = dict(bucket.list_files())
    backups: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for name, size in bucket.list_under(BACKUPS):
        backup_id = _backup_of(name)
        if backup_id:
            backups[backup_id].append((name, size))
    for name, _ in _unfinished(bucket):  # a killed backup's, maybe alone
        backup_id = _backup_of(name)
        if backup_id:
            backups.setdefault(backup_id, [])
    prefix = f"{BACKUPS}/"
    entries = [proven(_entry(bucket, backup_id, [n for n, _ in objects]),
                      {n.removeprefix(f"{prefix}{backup_id}/"): size for n, size in objects})
               for backup_id, objects in sorted(backups.items())]
    identity = bucket.read_identity()
    records = [e.record for e in entries if e.record is not None]
    size = identity.segment_size if identity is not None else \
        next((r.wal_segment_size for r in records), DEFAULT_SEGMENT_SIZE)
    histories: dict[int, list[TimelineSwitch]] = {}
    for name in files:
        timeline = parse_history_file_name(name)
        if timeline is not None:
            text = bucket.get_bytes(name, HISTORY_FILE_CAP)
            try:
                histories[timeline] = parse_history(text.decode(), timeline)
            except UnicodeDecodeError as exc:
                raise ArchiveError(f'could not read history file "{bucket.url.url(name)}": '
                                   f"{exc}") from exc
    timelines = [1, *histories, *(r.end_timeline for r in records)]
    timelines += [parsed.timeline for name in files
                  if (parsed := parse_archive_segment_name(name, size)) is not None]
    if identity is not None:
        timelines.append(identity.timeline)
    contents = ArchiveContents(entries, sorted(files), histories, max(timelines), size)
    return contents, files, dict(backups)


def _unfinished(bucket: Bucket) -> list[tuple[str, str]]:
    """The unfinished multipart uploads under ``backups/``; none when the credentials may not
    list them (s3:ListBucketMultipartUploads: the store's lifecycle rule is then their end)."""
    try:
        return bucket.unfinished_uploads(BACKUPS)
    except StoreAccessDenied:
        return []


def _backup_of(name: str) -> str:
    """The backup ID of an object named ``backups/<id>/...`` from the prefix; "" if none (a
    folder whose name is no ID of ours, ``backups/manual-copy/``, is no backup: it is neither
    counted nor removed)."""
    parts = name.split("/")
    if len(parts) >= 3 and is_backup_id(parts[1]):
        return parts[1]
    return ""


def _entry(bucket: Bucket, backup_id: str, names: list[str]) -> BackupEntry:
    record_name = f"{BACKUPS}/{backup_id}/{RECORD_NAME}"
    if record_name not in names:
        return unrecorded_in_bucket(backup_id)
    where = bucket.url.url(record_name)
    try:
        record = record_from_json(bucket.get_bytes(record_name, RECORD_CAP), where)
    except (ArchiveError, json.JSONDecodeError) as exc:
        return BackupEntry(backup_id, EntryState.DAMAGED, problem=str(exc))
    if record.backup_id != backup_id:
        return BackupEntry(backup_id, EntryState.DAMAGED,
                           problem=f"{where} names backup {record.backup_id}")
    return BackupEntry(backup_id, EntryState.COMPLETE, record)


def apply_policy_to_bucket(url: str, policy: Policy, *, dry_run: bool = False
                           ) -> CleanupReport:
    """Plan ``policy`` on the archive at ``url`` and carry it out (not with ``dry_run``):
    each removed backup's record, then its other objects, then the WAL files."""
    bucket = Bucket.connect(url)
    contents, sizes, backups = read_bucket(bucket)
    plan = plan_retention(contents, policy)
    freed = sum(size for b in plan.removed_backups for _, size in backups.get(b, []))
    freed += sum(sizes.get(name, 0) for name in plan.removed_files)
    if not dry_run:
        removed = set(plan.removed_backups)
        for backup_id in plan.removed_backups:
            objects = sorted(backups.get(backup_id, []),
                             key=lambda item: not item[0].endswith("/" + RECORD_NAME))
            for name, _ in objects:
                bucket.delete(name)
        for name, upload_id in _unfinished(bucket):
            if _backup_of(name) in removed:
                bucket.abort_upload(name, upload_id)
        for name in plan.removed_files:
            bucket.delete(name)
    return CleanupReport(plan, tuple(plan.removed_files), freed, dry_run)
