"""How a backup's files are stored (issue 28 §4): compressed when asked, then sealed to the
``--encrypt-to`` recipients when given, as they arrive; and a sealed backup read back.

:func:`stored_tar` gives the writer of the stored form
(:class:`~receivewal.archive.storedform.FormWriter`) that a backup directory and a bucket's
backup push a tar's bytes through (a compressor's window and the encryptor's: memory is
bounded whatever the database's size). A sealed file is ``NAME.age`` with its recipients
file ``NAME.age.recipients`` beside it, written first, as ``stream``'s sealed segments; the
manifest is sealed too (``backup_manifest.age``). ``backup.json`` stays plain (recovery
chooses a backup without a key) and says to whom the files are sealed (``encrypted_to``).

:class:`SealedFiles` reads a sealed backup's files back through an identity file (``verify
--identity``, ``recover --identity``): every ``*.age`` file decrypted as it streams, after its
recipients file says the key is one of its recipients; :func:`require_key` is that check made
before ``recover`` writes anything.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import BinaryIO

from receivewal.archive.compression import NO_COMPRESSION, CompressSpec
from receivewal.archive.recipients import RecipientSet, parse_recipients_file, recipient_set
from receivewal.archive.sealed import NoIdentity, Unsealer
from receivewal.archive.storedform import (
    FormWriter,
    StoredForm,
    Unsealing,
    unsealed_bytes,
    unsealed_reader,
)
from receivewal.backup.receipt import ArchiveInfo
from receivewal.backup.record import BackupRecord
from receivewal.backup.stored import BackupFiles
from receivewal.errors import ArchiveError
from receivewal.wal.names import ENCRYPTED_SUFFIX, RECIPIENTS_SUFFIX, AtRest

RECIPIENTS_CAP = 1 << 20
#: zstd's own worker threads for a tar compressed here, unless ``--compress zstd:workers=N``
#: says: one compresses while the receiving thread reads, checks and writes the stream
#: (zstandard's ``threads=``; the same zstd frame, decoded as any other)
ZSTD_WORKERS = 1


def sealed_name(name: str, recipients: RecipientSet | None) -> str:
    """The stored name of ``name``: ``name.age`` when it is sealed."""
    return StoredForm(recipients=recipients).name(name)


def stored_tar(archive: ArchiveInfo, compress: CompressSpec,
                   recipients: RecipientSet | None) -> tuple[str, str, FormWriter]:
    """How a received tar is stored, in a directory or a bucket alike: its stored name,
    its compression ("" for none) and the writer of its form. Compressed here unless the
    server compressed it or none was asked; sealed when there are recipients."""
    if archive.compression:
        compress = NO_COMPRESSION
    elif compress.method == AtRest.ZSTD and not compress.workers:
        compress = replace(compress, workers=ZSTD_WORKERS)
    form = StoredForm(compress, recipients)
    return form.name(archive.name), archive.compression or form.method, form.writer()


def seal_small(data: bytes, recipients: RecipientSet | None) -> bytes:
    """A small file's stored bytes (the manifest): sealed, never compressed."""
    return StoredForm(recipients=recipients).stored_bytes(data)


@dataclass
class SealedFiles:
    """A backup's files with its ``*.age`` ones decrypted as read (a
    :class:`~receivewal.backup.stored.BackupFiles`)."""

    files: BackupFiles
    unsealer: Unsealer

    def where(self, name: str) -> str:
        return self.files.where(name)

    def recipients(self, name: str) -> RecipientSet:
        """The set the recipients file of the sealed file ``name`` lists."""
        where = self.files.where(name + RECIPIENTS_SUFFIX)
        try:
            data = self.files.read_small(name + RECIPIENTS_SUFFIX, RECIPIENTS_CAP)
        except (OSError, ArchiveError) as exc:
            raise ArchiveError(f'"{self.files.where(name)}" is sealed and its recipients file '
                               f'"{where}" cannot be read: {exc}') from exc
        return parse_recipients_file(data, where)

    def require_key(self, name: str) -> RecipientSet:
        """The recipients of the sealed file ``name``, once the identity holds one of their
        keys (NoIdentity, NotARecipient, KeyFileError)."""
        recipients = self.recipients(name)
        if self.unsealer.key_file is None:
            raise NoIdentity(self.files.where(name), recipients)
        self.unsealer.keys().require(recipients, file=self.files.where(name))
        return recipients

    def open(self, name: str) -> BinaryIO:
        if not name.endswith(ENCRYPTED_SUFFIX):
            return self.files.open(name)
        recipients = self.require_key(name)
        return unsealed_reader(self.files.open(name), Unsealing(
            self.unsealer.keys(), self.files.where(name), recipients))

    def read_small(self, name: str, cap: int) -> bytes:
        if not name.endswith(ENCRYPTED_SUFFIX):
            return self.files.read_small(name, cap)
        recipients = self.require_key(name)
        raw = self.files.read_small(name, cap + (cap >> 10) + 4096)
        return unsealed_bytes(raw, Unsealing(self.unsealer.keys(), self.files.where(name),
                                             recipients))


def sealed_to(record: BackupRecord) -> RecipientSet | None:
    """The set the backup's files are sealed to, None when they are plain."""
    return recipient_set(record.encrypted_to) if record.encrypted_to else None


def readable_files(files: BackupFiles, record: BackupRecord, identity: str | None,
                   ) -> BackupFiles:
    """The backup's ``files`` as read through ``--identity`` ``identity`` (as they are when
    the backup is plain). Before anything else is read, the key is checked against the
    manifest's recipients: NoIdentity, NotARecipient or KeyFileError, one line naming the
    file."""
    if sealed_to(record) is None:
        return files
    sealed = SealedFiles(files, Unsealer(identity))
    sealed.require_key(record.manifest_name)
    return sealed
