"""Reading archive files (IO edge): whole segments or their first pages, decompressed.

The archive holds segments plain, as ``.gz`` (gzip, as pg_receivewal writes them), ``.lz4``
(an LZ4 frame) or ``.zst`` (a zstd frame). Decompression errors become :class:`ArchiveError`.
``open_binary`` may be replaced (e.g. by a pyarrow file system's ``open_input_stream``) so that
Spark executors read Hadoop paths themselves.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import BinaryIO

import lz4.frame
import zstandard

from receivewal.errors import ArchiveError

Opener = Callable[[str], BinaryIO]
_CHUNK = 1 << 20


def _open_local(path: str) -> BinaryIO:
    return open(path, "rb")


def read_wal_file(path: str, compression: str, limit: int | None = None,
                  open_binary: Opener | None = None) -> bytes:
    """The decompressed bytes of an archive file, or its first ``limit`` bytes."""
    if open_binary is None:
        open_binary = _open_local
    try:
        with open_binary(path) as raw:
            if compression == "":
                return raw.read() if limit is None else raw.read(limit)
            if compression == "zstd":
                reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
                return _read_all(reader.read, limit)
            if compression == "gzip":
                return _inflate(raw, limit)
            if compression == "lz4":
                return _unlz4(raw, limit)
    except (OSError, zlib.error, zstandard.ZstdError, RuntimeError) as exc:
        raise ArchiveError(f"cannot read {path}: {exc}") from exc
    raise ArchiveError(f"unknown compression {compression!r} for {path}")


def _read_all(read: Callable[[int], bytes], limit: int | None) -> bytes:
    out = bytearray()
    while limit is None or len(out) < limit:
        chunk = read(_CHUNK if limit is None else min(_CHUNK, limit - len(out)))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def _inflate(raw: BinaryIO, limit: int | None) -> bytes:
    if limit is None:
        return zlib.decompress(raw.read(), wbits=47)
    dec = zlib.decompressobj(wbits=47)  # gzip or zlib header, detected
    out = bytearray()
    while limit is None or len(out) < limit:
        chunk = dec.unconsumed_tail or raw.read(_CHUNK)
        if not chunk:
            break
        out += dec.decompress(chunk, 0 if limit is None else limit - len(out))
        if dec.eof:
            break
    return bytes(out)


def _unlz4(raw: BinaryIO, limit: int | None) -> bytes:
    if limit is None:
        return bytes(lz4.frame.decompress(raw.read()))
    dec = lz4.frame.LZ4FrameDecompressor()
    out = bytearray()
    while len(out) < limit and not dec.eof:
        chunk = b""
        if dec.needs_input:
            chunk = raw.read(_CHUNK)
            if not chunk:
                break
        out += dec.decompress(chunk, limit - len(out))
    return bytes(out)
