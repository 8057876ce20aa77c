"""A backup uploaded to object storage as it arrives: ``s3://BUCKET/PREFIX/backups/<id>/``.

The same names as a backup directory (:mod:`receivewal.backup.backupdir`): each tar
(compressed on the way when asked) is streamed into a create-only multipart upload
(:class:`~receivewal.archive.multipart.StreamUpload`: memory is one part and a compressor's
window, whatever the database's size), then the manifest, and the record last. Nothing is
overwritten. A backup given up (an error, SIGTERM) aborts its upload in flight and removes
what it uploaded, record first (best effort: :meth:`BucketBackup.abort` names what stays;
never an object another writer had put at one of its names, which create-only refused). A
backup whose process dies leaves at most objects without a record, which recovery never takes
for a backup and ``cleanup`` removes once the backup is abandoned
(:func:`~receivewal.backup.catalog.abandoned`), and unfinished multipart uploads, which are no
objects. Before its record, a backup checks by one listing of its prefix that every object it
wrote and every object its record names is there, each tar of its size: a backup that ran
longer than that bound and whose objects cleanup took fails instead of recording a backup
without its files.

A backup's ID is claimed before anything is written: a create-only claim object
(``backups/<id>/claim.json``, unique to this writer, as the archive's identity object is
create-only), so that two backups started in the same second never share a prefix; the one
that finds another's claim takes the next ID (``-1``, ``-2`` ...). A writer removes only what
it stored itself: an object it found already stored with the very bytes it meant to put is
not counted as its own (create-only put calls that a success, as it must after a lost reply,
but the bytes may be another writer's).

For the tests only: ``RECEIVEWAL_TEST_BACKUP_ID`` is the ID every backup takes, as if its
listing of ``backups/`` had found it free (two backups that listed in the same second); with
it, a claim already made is an error instead of a move to the next ID.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime

from receivewal.archive.bucket import Bucket
from receivewal.archive.compression import CompressSpec
from receivewal.archive.multipart import StreamUpload
from receivewal.archive.recipients import RecipientSet, recipients_file_text
from receivewal.archive.storedform import FormWriter
from receivewal.backup.backupdir import BACKUPS, backup_id_for
from receivewal.backup.manifest import MANIFEST_NAME
from receivewal.backup.receipt import ArchiveInfo
from receivewal.backup.record import (
    RECORD_NAME,
    BackupRecord,
    StoredArchive,
    absent_files,
    record_to_json,
    recorded_files,
    utc_text,
)
from receivewal.backup.sealing import seal_small, sealed_name, stored_tar
from receivewal.errors import ArchiveError, ObjectConflict, ReceivewalError, StoreAccessDenied
from receivewal.wal.names import RECIPIENTS_SUFFIX

_ATTEMPTS = 100
CLAIM_NAME = "claim.json"  # the create-only object that makes a backup's ID its writer's
ID_ENV = "RECEIVEWAL_TEST_BACKUP_ID"


def backup_key(backup_id: str, name: str) -> str:
    """The name, under the archive's prefix, of a file of backup ``backup_id``."""
    return f"{BACKUPS}/{backup_id}/{name}"


class _Open:
    """The tar being uploaded."""

    def __init__(self, info: ArchiveInfo, name: str, compression: str, upload: StreamUpload,
                 form: FormWriter) -> None:
        self.info, self.name, self.compression = info, name, compression
        self.upload, self.form = upload, form
        self.received = 0


class BucketBackup:
    """One backup being uploaded (a :class:`~receivewal.backup.transfer.BackupTarget`)."""

    def __init__(self, bucket: Bucket, backup_id: str, compress: CompressSpec,
                 recipients: RecipientSet | None = None) -> None:
        self.bucket = bucket
        self.backup_id = backup_id
        self.compress = compress
        self.recipients = recipients  # --encrypt-to: every object sealed to them
        self.manifest_name = sealed_name(MANIFEST_NAME, recipients)
        self.stored: list[StoredArchive] = []
        self.manifest_sha256 = ""
        self._open: _Open | None = None
        self._written: list[str] = []  # names stored, the record (if any) first
        self._claimed = False  # whether the claim object is this writer's (removed last)

    @classmethod
    def create(cls, bucket: Bucket, started: datetime, compress: CompressSpec,
               recipients: RecipientSet | None = None) -> BucketBackup:
        """A new backup at a name no object of the prefix's ``backups/`` has yet, claimed
        (:meth:`claim`) before anything else is written."""
        forced = os.environ.get(ID_ENV)
        if forced:
            backup = cls(bucket, forced, compress, recipients)
            if not backup.claim(started):
                raise ArchiveError(f"backup ID {forced} is taken: another backup claimed it "
                                   f"({backup.where(CLAIM_NAME)}); nothing was written")
            return backup
        taken = {name.removeprefix(f"{BACKUPS}/").split("/", 1)[0]
                 for name, _ in bucket.list_under(BACKUPS)}
        base = backup_id_for(started)
        for attempt in range(_ATTEMPTS):
            backup_id = f"{base}-{attempt}" if attempt else base
            if backup_id not in taken:
                backup = cls(bucket, backup_id, compress, recipients)
                if backup.claim(started):
                    return backup
        raise ArchiveError(f"could not find a free backup name like {base} in "
                           f"{bucket.url.url(BACKUPS)}")

    def claim(self, started: datetime) -> bool:
        """Put this writer's claim object at the backup's ID, create-only; False when another
        writer's claim is there (the ID is theirs). The claim is unique to this writer: the
        very bytes found stored can only be its own put, retried after a lost reply."""
        claim = json.dumps({"backup_id": self.backup_id, "started": utc_text(started),
                            "writer": uuid.uuid4().hex}).encode() + b"\n"
        try:
            self.bucket.put_new(backup_key(self.backup_id, CLAIM_NAME), claim)
        except ObjectConflict:
            return False
        except BaseException:
            self._claimed = True  # a lost reply may have stored it: removed on abort
            raise
        self._claimed = True
        return True

    def where(self, name: str) -> str:
        """The URL of a file of this backup."""
        return self.bucket.url.url(backup_key(self.backup_id, name))

    # -- the sink ----------------------------------------------------------------------------
    def begin_archive(self, archive: ArchiveInfo) -> None:
        """Start the upload of ``archive``."""
        name, method, form = stored_tar(archive, self.compress, self.recipients)
        self._put_recipients(name)
        upload = StreamUpload(self.bucket, backup_key(self.backup_id, name))
        self._open = _Open(archive, name, method, upload, form)
        upload.write(self._open.form.begin())

    def archive_bytes(self, data: memoryview) -> None:
        """The archive's next bytes (compressed when asked)."""
        current = self._open
        assert current is not None
        current.received += len(data)
        current.upload.write(current.form.update(data))

    def end_archive(self) -> None:
        """Complete the archive's upload."""
        current = self._open
        assert current is not None
        current.upload.write(current.form.finish())
        with self._storing(current.name):
            stored = current.upload.finish()
        self._open = None
        self.stored.append(StoredArchive(current.name, current.info.tablespace_oid,
                                         current.info.location, current.compression,
                                         stored, current.received))

    # -- the end -----------------------------------------------------------------------------
    def write_manifest(self, data: bytes) -> str:
        """Upload the manifest, create-only (sealed with the tars); its plaintext's
        SHA-256."""
        self._put_recipients(self.manifest_name)
        self._put_new(self.manifest_name, seal_small(data, self.recipients))
        self.manifest_sha256 = hashlib.sha256(data).hexdigest()
        return self.manifest_sha256

    def commit(self, record: BackupRecord) -> None:
        """Upload the record, last: from now on the prefix holds a complete backup. First one
        listing of the backup's prefix must show its claim, every object it wrote and every
        object the record names, each tar of its size: one removed meanwhile (cleanup
        took the backup for an abandoned one) is an error, never a record."""
        assert self._open is None
        assert record.backup_id == self.backup_id
        self.prove(record)
        with self._storing(RECORD_NAME, first=True):
            self.bucket.put_new(backup_key(self.backup_id, RECORD_NAME), record_to_json(record))

    def prove(self, record: BackupRecord) -> None:
        """ArchiveError unless the backup's prefix holds what :meth:`commit` checks."""
        folder = f"{BACKUPS}/{self.backup_id}"
        listing = {name.removeprefix(folder + "/"): size
                   for name, size in self.bucket.list_under(folder)}
        for name in [CLAIM_NAME, *self._written, *recorded_files(record)]:
            if name not in listing:
                raise ArchiveError(f"backup {self.backup_id} is not complete: "
                                   f"{self.where(name)} was removed while the backup ran "
                                   "(receivewal cleanup removes a backup without its record "
                                   "once it is abandoned)")
        problem = absent_files(record, listing)
        if problem is not None:
            raise ArchiveError(f"backup {self.backup_id} is not complete: {problem} "
                               f"({self.where('')})")

    @contextlib.contextmanager
    def _storing(self, name: str, *, first: bool = False,
                 mine: Callable[[], bool] = lambda: True) -> Iterator[None]:
        """Remember ``name`` as this backup's, for :meth:`abort`: once stored (and ``mine()``
        says this writer stored it), and when the store failed otherwise than by refusing
        another writer's object (a lost reply may have stored it); ``first``: removed before
        the others."""
        try:
            yield
        except ObjectConflict:
            raise  # another writer's object at that name: never this backup's to remove
        except BaseException:
            self._written.insert(0 if first else len(self._written), name)
            raise
        if mine():
            self._written.insert(0 if first else len(self._written), name)

    def abort(self) -> list[str]:
        """Give the backup up: the upload under way is aborted, then what was uploaded is
        removed, the record first (best effort); what could not be removed, one line each
        (it has no record, so it is no backup: ``cleanup`` removes it once abandoned)."""
        current, self._open = self._open, None
        left: list[str] = []
        if current is not None:
            current.form.close()
            current.upload.abort()
            left.extend(self._upload_left(current.name))
        for name in self._written:
            try:
                self.bucket.delete(backup_key(self.backup_id, name))
            except ReceivewalError as exc:
                left.append(f"could not remove {self.where(name)} of the backup given up: "
                            f"{exc}")
                if name == RECORD_NAME:  # its files stay with it: never a record without them
                    break
        if self._claimed and not left:  # the ID last: nobody takes it while objects stay
            try:
                self.bucket.delete(backup_key(self.backup_id, CLAIM_NAME))
            except ReceivewalError as exc:
                left.append(f"could not remove {self.where(CLAIM_NAME)} of the backup given "
                            f"up: {exc}")
        self._written, self._claimed = [], False
        return left

    def _upload_left(self, name: str) -> list[str]:
        """The abort of ``name``'s multipart upload is best effort: when the store cannot say
        that it is gone, one line naming it (cleanup aborts it with the abandoned backup)."""
        try:
            unfinished = self.bucket.unfinished_uploads(f"{BACKUPS}/{self.backup_id}")
        except StoreAccessDenied:
            return []  # may not be listed: the store's lifecycle rule ends what stays
        except ReceivewalError as exc:
            return [f"could not make sure the multipart upload of {self.where(name)} of the "
                    f"backup given up was aborted: {exc}"]
        key = backup_key(self.backup_id, name)
        return [f"could not abort the multipart upload {upload_id} of {self.where(name)} of "
                "the backup given up" for found, upload_id in unfinished if found == key]

    def _put_recipients(self, name: str) -> None:
        """The recipients object of the sealed object ``name``, before it (none when plain)."""
        if self.recipients is not None:
            self._put_new(name + RECIPIENTS_SUFFIX, recipients_file_text(self.recipients))

    def _put_new(self, name: str, data: bytes, *, first: bool = False) -> None:
        """Put ``data`` at ``name``, create-only; counted as this backup's (for :meth:`abort`)
        only when this call stored it (or may have: an error after the request), never when
        these very bytes were found stored already: another writer's."""
        created = True
        with self._storing(name, first=first, mine=lambda: created):
            created = self.bucket.put_new(backup_key(self.backup_id, name), data)
