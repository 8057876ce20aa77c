"""Where an archive lives: the one door to a directory or a bucket prefix.

A :class:`Location` is what every command asks of the place an archive is kept, as
pgBackRest's storage drivers and WAL-G's folders are: its files listed by folder with their
sizes, a file opened for reading, a small file read up to a cap (one error text, whichever
driver), whether a file is there, a file put create-only, files deleted, and how messages name
it. Two drivers: :class:`DirectoryLocation` here (the standard library only), and the S3
driver, :class:`receivewal.archive.bucket.Bucket` (boto3, imported only when a bucket is
used).

:func:`receivewal.archive.view.locate` turns the user's text (``-D``, an archive argument)
into a location by :func:`is_bucket_url`, the one test of that text: no module but this one
spells the scheme or tests for it (tests/test_layout.py holds it). This module is on restore's lean
path
(:mod:`receivewal.restore`): it imports only ``os`` and the project's errors at its top, and
what a driver needs inside the function that needs it.
"""

from __future__ import annotations

import os

from receivewal.errors import ArchiveError, ObjectConflict

TYPE_CHECKING = False  # typing stays off restore's lean path
if TYPE_CHECKING:
    from typing import BinaryIO

#: The name of the archive's identity record (:mod:`receivewal.archive.identity`) at its
#: location, a directory's file or a prefix's object; spelled here, on restore's lean path.
IDENTITY_FILE = ".receivewal-archive.json"
#: The scheme of an archive in object storage: ``s3://BUCKET/PREFIX``.
SCHEME = "s3://"
#: Spark's name for the same store (Hadoop's S3A file system), which pyarrow calls s3.
_SPARK_SCHEME = "s3a://"


def is_bucket_url(text: str) -> bool:
    """Whether an archive argument names object storage rather than a local directory."""
    return text.startswith(SCHEME)


def is_uri(text: str) -> bool:
    """Whether an archive argument is a URI (``s3://``, ``hdfs://``, ``s3a://``, ``file://``...)
    rather than a local path: analyze reads the ones other than a bucket's with pyarrow."""
    return "://" in text


def pyarrow_uri(uri: str) -> str:
    """``uri`` as pyarrow's file systems name it (Spark's ``s3a://`` is pyarrow's s3)."""
    if uri.startswith(_SPARK_SCHEME):
        return SCHEME + uri[len(_SPARK_SCHEME):]
    return uri


def list_directory(directory: str | os.PathLike[str]) -> tuple[tuple[str, int], ...]:
    """(name, size from lstat) of each entry of an archive directory that a reader must look
    at, sorted: everything but a directory, and a directory too when it bears a WAL file's
    name. Whatever stands under a segment's or history file's name (a directory, a FIFO, a
    device, a dangling symlink) is that file, unreadable, never a file that is not there: the
    reader reports it. ArchiveError when there is no such directory."""
    if not os.path.isdir(directory):
        raise ArchiveError(f"{os.fspath(directory)} is not a directory")
    from receivewal.wal.names import (  # noqa: PLC0415 - lean path: only when listing
        looks_like_segment,
        parse_history_file_name,
    )

    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) and not looks_like_segment(entry.name) \
                    and parse_history_file_name(entry.name) is None:
                continue
            try:
                size = entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:  # removed since the listing
                continue
            found.append((entry.name, size))
    return tuple(sorted(found))


class Location:
    """Where an archive's files are kept (the interface both drivers give).

    ``is_local``: whether the files are in a local directory (``--partial``'s ``.partial``
    files, locks and the daemon's state exist only there).
    """

    is_local = False

    def where(self, name: str = "") -> str:
        """How messages name the file ``name`` ("": the location itself)."""
        raise NotImplementedError

    def listing(self, folder: str = "") -> list[tuple[str, int]]:
        """(name, size) of the files, sorted: those directly at the top ("") or every one
        under ``folder`` at any depth, named from the top (``folder/...``)."""
        raise NotImplementedError

    def open(self, name: str) -> BinaryIO:
        """The file ``name`` opened for reading, streamed (bounded memory)."""
        raise NotImplementedError

    def read_small(self, name: str, cap: int) -> bytes:
        """The file ``name`` whole, at most ``cap`` bytes (else ArchiveError naming it)."""
        raise NotImplementedError

    def exists(self, name: str) -> bool:
        """Whether the file ``name`` is there now."""
        raise NotImplementedError

    def put_new(self, name: str, data: bytes) -> bool:
        """Store ``data`` as ``name``, never overwriting: True when this call stored it, False
        when these very bytes were there already; ObjectConflict when other bytes are."""
        raise NotImplementedError

    def delete(self, name: str) -> None:
        """Remove the file ``name`` durably (gone already: done)."""
        raise NotImplementedError


class DirectoryLocation(Location):
    """An archive in a local directory."""

    is_local = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    def __repr__(self) -> str:
        return f"DirectoryLocation({self.path!r})"

    def where(self, name: str = "") -> str:
        return self.path.rstrip("/") + "/" + name if name else self.path

    def listing(self, folder: str = "") -> list[tuple[str, int]]:
        if not folder:
            return list(list_directory(self.path))
        found = []
        top = os.path.join(self.path, folder)
        for root, _, files in os.walk(top):
            for name in files:
                path = os.path.join(root, name)
                try:
                    size = os.lstat(path).st_size
                except FileNotFoundError:
                    continue
                found.append((os.path.relpath(path, self.path), size))
        return sorted(found)

    def open(self, name: str) -> BinaryIO:
        from receivewal.archive.reading import open_regular  # noqa: PLC0415

        return open_regular(os.path.join(self.path, name))

    def read_small(self, name: str, cap: int) -> bytes:
        from receivewal.archive.reading import read_small_file  # noqa: PLC0415

        return read_small_file(os.path.join(self.path, name), cap)

    def exists(self, name: str) -> bool:
        return os.path.isfile(os.path.join(self.path, name))

    def put_new(self, name: str, data: bytes) -> bool:
        from receivewal.archive.durable import write_file_durably  # noqa: PLC0415
        try:
            there = self.read_small(name, len(data))
        except FileNotFoundError:
            write_file_durably(self.path, name, data)
            return True
        except ArchiveError:
            there = None
        if there == data:
            return False
        raise ObjectConflict(f'{self.where(name)}: a different file is already there; it is '
                             "left as it is and nothing is overwritten")

    def delete(self, name: str) -> None:
        from receivewal.archive.durable import sync_path  # noqa: PLC0415

        if not name or name.startswith("/") or ".." in name.split("/"):
            raise ArchiveError(f"{name!r} is not a file name of the archive")
        path = os.path.join(self.path, name)
        try:
            os.unlink(path)
            sync_path(os.path.dirname(path))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ArchiveError(f'could not remove "{path}": {exc.strerror or exc}') from exc
