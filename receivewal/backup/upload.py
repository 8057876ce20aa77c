"""A backup uploaded to object storage as it arrives: ``s3://BUCKET/PREFIX/backups/<id>/``.

The same names as a backup directory (:mod:`receivewal.backup.directory`): each archive
(compressed on the way when asked) is streamed into a create-only multipart upload
(:class:`~receivewal.archive.bucket.StreamUpload`: memory is one part and a compressor's
window, whatever the database's size), then the manifest, and the record last. Nothing is
overwritten. A backup whose process dies leaves at most objects without a record, which
recovery never takes for a backup, and unfinished multipart uploads, which are no objects.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from receivewal.archive.bucket import Bucket, StreamUpload
from receivewal.archive.compression import CompressSpec, new_compressor
from receivewal.archive.recipients import RecipientSet, recipients_file_text
from receivewal.backup.directory import BACKUPS, backup_id_for
from receivewal.backup.manifest import MANIFEST_NAME
from receivewal.backup.receipt import ArchiveInfo
from receivewal.backup.record import RECORD_NAME, BackupRecord, StoredArchive, record_to_json
from receivewal.backup.sealing import StoredForm, seal_small, sealed_name
from receivewal.errors import ArchiveError
from receivewal.wal.names import RECIPIENTS_SUFFIX, AtRest

_ATTEMPTS = 100


def backup_key(backup_id: str, name: str) -> str:
    """The name, under the archive's prefix, of a file of backup ``backup_id``."""
    return f"{BACKUPS}/{backup_id}/{name}"


class _Open:
    """The archive being uploaded."""

    def __init__(self, info: ArchiveInfo, name: str, compression: str, upload: StreamUpload,
                 form: StoredForm) -> None:
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

    @classmethod
    def create(cls, bucket: Bucket, started: datetime, compress: CompressSpec,
               recipients: RecipientSet | None = None) -> BucketBackup:
        """A new backup at a name no object of the prefix's ``backups/`` has yet."""
        taken = {name.removeprefix(f"{BACKUPS}/").split("/", 1)[0]
                 for name, _ in bucket.list_under(BACKUPS)}
        base = backup_id_for(started)
        for attempt in range(_ATTEMPTS):
            backup_id = f"{base}-{attempt}" if attempt else base
            if backup_id not in taken:
                return cls(bucket, backup_id, compress, recipients)
        raise ArchiveError(f"could not find a free backup name like {base} in "
                           f"{bucket.url.url(BACKUPS)}")

    def where(self, name: str) -> str:
        """The URL of a file of this backup."""
        return self.bucket.url.url(backup_key(self.backup_id, name))

    # -- the sink ----------------------------------------------------------------------------
    def begin_archive(self, archive: ArchiveInfo) -> None:
        """Start the upload of ``archive``."""
        if archive.compression or not self.compress.method:
            name, method, compressor = archive.name, archive.compression, None
        else:
            method = self.compress.method
            name, compressor = archive.name + AtRest(method).suffix, new_compressor(self.compress)
        name = sealed_name(name, self.recipients)
        self._put_recipients(name)
        upload = self.bucket.upload_stream(backup_key(self.backup_id, name))
        self._open = _Open(archive, name, method, upload,
                           StoredForm(compressor, self.recipients))
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
        stored = current.upload.finish()
        self._open = None
        self.stored.append(StoredArchive(current.name, current.info.tablespace_oid,
                                         current.info.location, current.compression,
                                         stored, current.received))

    # -- the end -----------------------------------------------------------------------------
    def write_manifest(self, data: bytes) -> str:
        """Upload the manifest, create-only (sealed with the archives); its plaintext's
        SHA-256."""
        self._put_recipients(self.manifest_name)
        self.bucket.put_new(backup_key(self.backup_id, self.manifest_name),
                            seal_small(data, self.recipients))
        self.manifest_sha256 = hashlib.sha256(data).hexdigest()
        return self.manifest_sha256

    def commit(self, record: BackupRecord) -> None:
        """Upload the record, last: from now on the prefix holds a complete backup."""
        assert self._open is None
        assert record.backup_id == self.backup_id
        self.bucket.put_new(backup_key(self.backup_id, RECORD_NAME), record_to_json(record))

    def abort(self) -> None:
        """Give the backup up: the upload under way is dropped; what was uploaded stays,
        without a record (no backup: cleanup removes it)."""
        current, self._open = self._open, None
        if current is not None:
            current.form.close()
            current.upload.abort()

    def _put_recipients(self, name: str) -> None:
        """The recipients object of the sealed object ``name``, before it (none when plain)."""
        if self.recipients is not None:
            self.bucket.put_new(backup_key(self.backup_id, name + RECIPIENTS_SUFFIX),
                                recipients_file_text(self.recipients))
