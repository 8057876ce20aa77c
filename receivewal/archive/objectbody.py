"""What an upload sends as an object's body: a file streamed from disk, or bytes, and its
SHA-256 (the create-only put's checksum, and the digest a stored object is compared with when
the store keeps none). Without the network: the S3 driver, :mod:`receivewal.archive.bucket`,
sends and reads them.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from receivewal.archive.directory import os_error

CHUNK = 1 << 20


def sha256_of(source: Path | bytes) -> tuple[str, int]:
    """(hex SHA-256, size) of a file read in chunks, or of bytes."""
    digest = hashlib.sha256()
    if isinstance(source, bytes):
        digest.update(source)
        return digest.hexdigest(), len(source)
    size = 0
    try:
        with source.open("rb") as fh:
            while chunk := fh.read(CHUNK):
                digest.update(chunk)
                size += len(chunk)
    except OSError as exc:
        raise os_error(exc, f'cannot read "{source}"') from exc
    return digest.hexdigest(), size


@contextlib.contextmanager
def opened_body(source: Path | bytes) -> Iterator[IO[bytes]]:
    """``source`` as a file to send (an unreadable file is the project's error)."""
    if isinstance(source, bytes):
        yield io.BytesIO(source)
        return
    try:
        fh = source.open("rb")
    except OSError as exc:
        raise os_error(exc, f'cannot read "{source}"') from exc
    with fh:
        yield fh


class HashingSink:
    """A write-only file that only hashes what it is given."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return len(data)
