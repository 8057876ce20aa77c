"""A transaction's lines until it commits: in memory while small, in a spool file beyond.

An entry is one rendered line and the relation version it was made with (-1: none). A buffer
holds its entries in memory up to ``memory_limit`` bytes, then moves them to a file of its own
in the spool directory and appends there, so that a transaction of any size costs a bounded
amount of memory. A :meth:`~TransactionBuffer.mark` taken before a subtransaction's first
change lets :meth:`~TransactionBuffer.truncate` drop it and everything after it when the
subtransaction aborts (changes are spooled in the order of their LSNs, so what follows a
subtransaction's first change belongs to it or to subtransactions nested in it, as PostgreSQL's
apply worker relies on too). Spool files are scratch: never fsynced, removed when the
transaction ends and, after a crash, by the next run (:func:`clear_spool`).
"""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

SUFFIX = ".spool"
_ENTRY = struct.Struct(">iI")  # relation version, line length
_FILE_BUFFER = 1 << 16
_names = itertools.count(1)

Entry = tuple[int, bytes]


def clear_spool(directory: Path) -> None:
    """Create the spool directory, or empty it of what an earlier run left."""
    directory.mkdir(exist_ok=True)
    for leftover in directory.iterdir():
        if leftover.name.endswith(SUFFIX):
            leftover.unlink()


class TransactionBuffer:
    """The entries of one transaction, in order."""

    def __init__(self, directory: Path, memory_limit: int) -> None:
        self.directory = directory
        self.memory_limit = memory_limit
        self.size = 0  # bytes of entries, as the spool file holds them
        self.count = 0
        self._entries: list[Entry] = []
        self._file: BinaryIO | None = None
        self._path: Path | None = None

    @property
    def spilled(self) -> bool:
        """Whether the entries are in a file."""
        return self._file is not None

    def add(self, version: int, line: bytes) -> None:
        """Append one line made with relation ``version``."""
        self.size += _ENTRY.size + len(line)
        self.count += 1
        if self._file is not None:
            self._file.write(_ENTRY.pack(version, len(line)))
            self._file.write(line)
            return
        self._entries.append((version, line))
        if self.size > self.memory_limit:
            self._spill()

    def mark(self) -> tuple[int, int]:
        """Where the next entry goes (for :meth:`truncate`)."""
        return self.count, self.size

    def truncate(self, mark: tuple[int, int]) -> None:
        """Drop every entry added since ``mark`` was taken."""
        count, size = mark
        if self._file is not None:
            self._file.flush()
            self._file.truncate(size)
            self._file.seek(size)
        else:
            del self._entries[count:]
        self.count, self.size = count, size

    def entries(self) -> Iterator[Entry]:
        """The entries, in order (read back from the file when spilled)."""
        if self._file is None:
            yield from self._entries
            return
        self._file.flush()
        assert self._path is not None
        with self._path.open("rb", buffering=_FILE_BUFFER) as spool:
            for _ in range(self.count):
                version, length = _ENTRY.unpack(spool.read(_ENTRY.size))
                yield version, spool.read(length)

    def discard(self) -> None:
        """Forget the entries and remove the spool file (idempotent)."""
        self._entries = []
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._path is not None:
            self._path.unlink(missing_ok=True)
            self._path = None

    def _spill(self) -> None:
        self._path = self.directory / f"{os.getpid()}-{next(_names)}{SUFFIX}"
        self._file = self._path.open("xb+", buffering=_FILE_BUFFER)
        for version, line in self._entries:
            self._file.write(_ENTRY.pack(version, len(line)))
            self._file.write(line)
        self._entries = []
