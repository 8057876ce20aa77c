"""Decompressing a stream fed in pieces (pure): a server-compressed archive on its way through.

BASE_BACKUP with ``COMPRESSION`` sends ``base.tar.gz``, ``.lz4`` or ``.zst``; the receipt
decompresses it to read and check the tar inside while the compressed bytes are stored as
they came. :class:`Inflater` uses the decoders of the table,
:mod:`receivewal.archive.compression` (gzip members, LZ4 frames and zstd frames, one after
another, as the command line tools read them) with an output limit per call: what it yields
comes in pieces of at most :data:`PIECE` bytes, however well the input compresses.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

from receivewal.archive.compression import Decoder, codec_of
from receivewal.errors import ArchiveError
from receivewal.wal.names import AtRest

PIECE = 1 << 20
_BY_SUFFIX = {fmt.suffix: fmt.value for fmt in AtRest if fmt}


class InflateError(ArchiveError):
    """A compressed stream that cannot be decoded, or that ends before its end."""


def compression_of(name: str) -> str:
    """The compression method a file name's suffix says ("" for none)."""
    dot = name.rfind(".")
    return _BY_SUFFIX.get(name[dot:], "") if dot >= 0 else ""


class Inflater:
    """Decode one compressed stream fed in pieces; ``where`` names it in errors."""

    def __init__(self, method: str, where: str) -> None:
        self._codec = codec_of(method)
        if self._codec.decoder is None:
            raise ArchiveError(f"{where}: no decoder for {method!r}")
        self._make = self._codec.decoder
        self._decoder: Decoder = self._make()
        self._errors: tuple[type[Exception], ...] = (zlib.error, RuntimeError, EOFError,
                                                     *self._codec.errors())
        self._between = True  # no frame or member begun: a clean place to end
        self.where = where

    def feed(self, data: bytes | memoryview) -> Iterator[bytes]:
        """The decoded bytes of ``data``, the stream's next compressed bytes."""
        pending = bytes(data)
        try:
            while pending or not self._decoder.needs_input:
                if pending:
                    self._between = False
                out = self._decoder.decompress(pending, PIECE)
                pending = b""
                if out:
                    yield out
                if self._decoder.eof:
                    pending = self._decoder.unused_data
                    self._decoder, self._between = self._make(), True
        except self._errors as exc:
            raise InflateError(f"{self.where}: {self._codec.fmt.value} data is damaged: "
                               f"{exc}") from None

    def close(self) -> None:
        """The stream has no more bytes: its last frame or member must be complete."""
        if not self._between:
            raise InflateError(f"{self.where}: {self._codec.fmt.value} data ends before the "
                               "end of its stream")
