"""A backup directory, ``ARCHIVE/backups/<id>/``, written as the backup arrives.

Each tar is streamed into a temporary file next to its final name, compressed on the way
when asked (``--compress``; a tar the server compressed is stored as it came), then
fsynced, renamed and the directory fsynced, all through :mod:`receivewal.archive.durable`.
The manifest follows the same way, and the record (:mod:`receivewal.backup.record`) last:
a directory is a complete backup only once its record is there, so a crash or SIGKILL at any
moment leaves at most a directory without a record, which recovery ignores and retention
removes. While it writes, the process holds ``flock`` on the directory itself
(:func:`~receivewal.archive.lock.lock_directory`), which tells a running backup from an
interrupted one. The directory's exclusive ``mkdir`` is the claim of the backup's ID: two
backups started in the same second never share one (the second takes ``-1``), and a backup
given up removes only the files of its own directory. Before the record, a scan of the
directory must show every file the record names, each tar of its size.

Memory is a compressor's window and one message at a time, whatever the database's size.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from datetime import datetime
from pathlib import Path

from receivewal.archive.compression import CompressSpec
from receivewal.archive.durable import (
    create_temporary,
    finish_file,
    sync_path,
    write_all,
    write_file_durably,
)
from receivewal.archive.lock import lock_directory
from receivewal.archive.recipients import RecipientSet
from receivewal.archive.sealed import write_recipients_file
from receivewal.archive.storedform import FormWriter
from receivewal.backup.manifest import MANIFEST_NAME
from receivewal.backup.receipt import ArchiveInfo
from receivewal.backup.record import (
    RECORD_NAME,
    BackupRecord,
    StoredArchive,
    absent_files,
    record_to_json,
)
from receivewal.backup.sealing import seal_small, sealed_name, stored_tar
from receivewal.errors import ArchiveError
from receivewal.wal.names import RECIPIENTS_SUFFIX

BACKUPS = "backups"
FILE_MODE = 0o600  # 0o640 when the server's data directory is group-readable, as for WAL
_ATTEMPTS = 100


def backup_id_for(moment: datetime) -> str:
    """The name a backup started at ``moment`` (UTC) is given, before any ``-N`` that keeps it
    apart from another started in the same second."""
    return moment.strftime(_ID_FORMAT)


_ID_FORMAT = "%Y%m%dT%H%M%SZ"


def is_backup_id(name: str) -> bool:
    """Whether ``name`` is an ID this package gives a backup: :func:`backup_id_for`'s time,
    then at most a ``-N`` (1 to 99). Anything else under ``backups/`` (an operator's
    ``manual-copy/``, ``20200101T000000Z-copy/``) is no backup of ours: never counted, never
    removed."""
    stamp, dash, attempt = name.partition("-")
    if dash and not (attempt.isascii() and attempt.isdigit() and attempt[0] != "0"
                     and int(attempt) < _ATTEMPTS):
        return False
    if len(stamp) != 16 or not stamp.isascii():
        return False
    try:
        return datetime.strptime(stamp, _ID_FORMAT).strftime(_ID_FORMAT) == stamp
    except ValueError:
        return False


def _os_error(what: str, path: Path, exc: OSError) -> ArchiveError:
    return ArchiveError(f'could not {what} "{path}": {exc.strerror or exc}')


class _Open:
    """The tar file being written."""

    def __init__(self, info: ArchiveInfo, name: str, compression: str, *, fd: int, tmp: Path,
                 form: FormWriter) -> None:
        self.info, self.name, self.compression = info, name, compression
        self.fd, self.tmp, self.form = fd, tmp, form
        self.stored = self.received = 0


class BackupDirectory:
    """One backup being written (a :class:`~receivewal.backup.receipt.BackupSink`)."""

    def __init__(self, path: Path, lock_fd: int, compress: CompressSpec, *, sync: bool,
                 file_mode: int = FILE_MODE, recipients: RecipientSet | None = None) -> None:
        self.path = path
        self.backup_id = path.name
        self.compress = compress
        self.recipients = recipients  # --encrypt-to: every file sealed to them
        self.manifest_name = sealed_name(MANIFEST_NAME, recipients)
        self.sync = sync
        self.file_mode = file_mode
        self.stored: list[StoredArchive] = []
        self.manifest_sha256 = ""
        self._lock_fd: int | None = lock_fd
        self._open: _Open | None = None

    @classmethod
    def create(cls, archive: Path, started: datetime, compress: CompressSpec, *,
               sync: bool = True, file_mode: int = FILE_MODE,
               recipients: RecipientSet | None = None) -> BackupDirectory:
        """A new, empty, locked backup directory under ``archive/backups`` (made if missing);
        its files get ``file_mode`` (the archive's: the server's data directory mode's), its
        directories the same with the search bits."""
        backups = archive / BACKUPS
        directory_mode = 0o700 | (0o050 if file_mode & 0o040 else 0)
        try:
            backups.mkdir(mode=directory_mode)
            sync_path(archive, sync=sync)
        except FileExistsError:
            pass
        except OSError as exc:
            raise _os_error("create directory", backups, exc) from exc
        base = backup_id_for(started)
        for attempt in range(_ATTEMPTS):
            path = backups / (f"{base}-{attempt}" if attempt else base)
            try:
                path.mkdir(mode=directory_mode)
            except FileExistsError:
                continue
            except OSError as exc:
                raise _os_error("create directory", path, exc) from exc
            sync_path(backups, sync=sync)
            return cls(path, lock_directory(path), compress, sync=sync, file_mode=file_mode,
                       recipients=recipients)
        raise ArchiveError(f"could not find a free backup name like {base} in {backups}")

    # -- the sink ----------------------------------------------------------------------------
    def begin_archive(self, archive: ArchiveInfo) -> None:
        """Open the file for ``archive``."""
        name, method, form = stored_tar(archive, self.compress, self.recipients)
        target = self.path / name
        try:
            if self.recipients is not None:  # the recipients file first, as stream's
                write_recipients_file(target, self.recipients, mode=self.file_mode,
                                      sync=self.sync)
            fd, tmp = create_temporary(target, self.file_mode)
        except OSError as exc:
            raise _os_error("create file", target, exc) from exc
        self._open = _Open(archive, name, method, fd=fd, tmp=tmp,
                           form=form)
        self._write(self._open.form.begin())

    def archive_bytes(self, data: memoryview) -> None:
        """Write the archive's next bytes (compressed when asked)."""
        current = self._open
        assert current is not None
        current.received += len(data)
        self._write(current.form.update(data))

    def end_archive(self) -> None:
        """Finish, fsync and rename the tar file; fsync the directory."""
        current = self._open
        assert current is not None
        self._write(current.form.finish())
        final = self.path / current.name
        fd, current.fd = current.fd, -1
        try:
            finish_file(current.tmp, final, fd=fd, close=True, sync=self.sync)
        except OSError as exc:
            raise _os_error("write file", final, exc) from exc
        self._open = None
        self.stored.append(StoredArchive(current.name, current.info.tablespace_oid,
                                         current.info.location, current.compression,
                                         current.stored, current.received))

    def _write(self, data: bytes | memoryview) -> None:
        current = self._open
        assert current is not None
        if not data:
            return
        try:
            write_all(current.fd, data)
        except OSError as exc:
            raise _os_error("write file", current.tmp, exc) from exc
        current.stored += len(data)

    # -- the end -----------------------------------------------------------------------------
    def write_manifest(self, data: bytes) -> str:
        """Write the manifest durably (sealed with the tars); its plaintext's SHA-256."""
        target = self.path / self.manifest_name
        try:
            if self.recipients is not None:
                write_recipients_file(target, self.recipients, mode=self.file_mode,
                                      sync=self.sync)
            write_file_durably(self.path, self.manifest_name,
                               seal_small(data, self.recipients), mode=self.file_mode,
                               sync=self.sync)
        except OSError as exc:
            raise _os_error("write file", target, exc) from exc
        self.manifest_sha256 = hashlib.sha256(data).hexdigest()
        return self.manifest_sha256

    def commit(self, record: BackupRecord) -> None:
        """Write the record, last: from now on the directory is a complete backup. First a
        scan of the directory must show every file the record names, each tar of its
        size (nothing read)."""
        assert self._open is None
        assert record.backup_id == self.backup_id
        try:
            with os.scandir(self.path) as found:
                listing = {e.name: e.stat(follow_symlinks=False).st_size for e in found
                           if e.is_file(follow_symlinks=False)}
        except OSError as exc:
            raise _os_error("list directory", self.path, exc) from exc
        problem = absent_files(record, listing)
        if problem is not None:
            raise ArchiveError(f"backup {self.backup_id} is not complete: {problem} "
                               f'("{self.path}")')
        try:
            write_file_durably(self.path, RECORD_NAME, record_to_json(record),
                               mode=self.file_mode, sync=self.sync)
        except OSError as exc:
            raise _os_error("write file", self.path / RECORD_NAME, exc) from exc
        self._unlock()

    def abort(self) -> list[str]:
        """Give the backup up: remove what was written and the directory (best effort: what
        stays has no record, which retention removes; nothing is reported)."""
        current, self._open = self._open, None
        if current is not None:
            current.form.close()
            if current.fd >= 0:
                os.close(current.fd)
            current.tmp.unlink(missing_ok=True)
        names = [*(a.name for a in self.stored), self.manifest_name]
        if current is not None:
            names.append(current.name)
        for name in names:
            (self.path / name).unlink(missing_ok=True)
            (self.path / (name + RECIPIENTS_SUFFIX)).unlink(missing_ok=True)
        self._unlock()
        with contextlib.suppress(OSError):
            self.path.rmdir()
        return []

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
