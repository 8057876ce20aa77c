"""A stored change file read back as lines: the change log's files and the snapshot's table
files alike (compressed, sealed when their name ends in ``.age``), through the stored form's
one reader (:func:`~receivewal.archive.storedform.plain_chunks`), split at newlines as the
plaintext comes, in bounded memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from receivewal.archive.storedform import Unsealing, plain_chunks
from receivewal.errors import ArchiveError
from receivewal.wal.names import ENCRYPTED_SUFFIX

if TYPE_CHECKING:
    from receivewal.archive.encryption import Keys


def unsealing_for(path: Path, keys: Keys | None, doing: str) -> Unsealing | None:
    """How to open the file at ``path``: None when it is not sealed; with ``keys`` when it is
    (without: ArchiveError, ``doing`` it needs an identity file)."""
    if not path.name.endswith(ENCRYPTED_SUFFIX):
        return None
    if keys is None:
        raise ArchiveError(f"{path} is sealed: {doing} it needs an identity file "
                           "(--identity)")
    return Unsealing(keys, str(path))


class PlainLines:
    """The whole lines of a stored file read from ``source`` (compressed with ``method``,
    unsealed with ``unsealing``), without their newlines; iterated once. What follows the
    last newline is no line: :attr:`tail` holds it once the lines are read (a partial file's
    line being written, or a file cut short)."""

    def __init__(self, source: BinaryIO, method: str, unsealing: Unsealing | None) -> None:
        self.source, self.method, self.unsealing = source, method, unsealing
        self.tail = b""

    def __iter__(self) -> Iterator[bytes]:
        for lines in self.batches():
            yield from lines

    def batches(self) -> Iterator[list[bytes]]:
        """The same lines, a list for each chunk of plaintext (a reader that decodes many
        lines in one call takes them so)."""
        rest = b""
        for chunk in plain_chunks(self.source, self.method, self.unsealing):
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            if lines:
                yield lines
        self.tail = rest
