"""The codec libraries (imported when a file needs them) and the compressors of the at-rest
formats.

lz4, zstandard and the bounded zstd decoder are imported on first use, not with this module: a
restore of a plain segment (PostgreSQL's restore_command, once per file) loads none of them. A
compressor never touches a file: it turns WAL into bytes, and :mod:`receivewal.archive` writes
and fsyncs them.
"""

from __future__ import annotations

import sys
import zlib
from types import ModuleType
from typing import Protocol

GZIP_WBITS = 31  # a gzip header and trailer around the deflate stream
#: what each zstd worker thread compresses at a time: zstd's default (four windows, 8 MiB at
#: level 3) held about 37 MB more in memory for the same ratio on a base backup's tar, 2 MiB
#: about 10 MB
ZSTD_JOB = 2 << 20


def lz4_frame() -> ModuleType:
    import lz4.frame  # noqa: PLC0415 - lazily, see the module's docstring

    module: ModuleType = lz4.frame
    return module


def zstandard_module() -> ModuleType:
    import zstandard  # noqa: PLC0415 - lazily, see the module's docstring

    return zstandard


def bounded_zstd() -> ModuleType:
    """zstd with an output limit (``max_length``): the standard library's from 3.14 on, the
    same module backported before."""
    if sys.version_info >= (3, 14):
        from compression import zstd  # noqa: PLC0415 - lazily, see the module's docstring
    else:
        from backports import zstd  # noqa: PLC0415 - lazily, see the module's docstring
    return zstd


# -- compressors -------------------------------------------------------------------------------
class Compressor(Protocol):
    """Turns WAL into the bytes of one compressed file, in order."""

    def begin(self) -> bytes:
        """Bytes that start the file (a frame header), possibly empty."""

    def compress(self, data: bytes | memoryview) -> bytes:
        """Feed WAL; return whatever compressed output is ready."""

    def flush(self) -> bytes:
        """Everything fed so far, decodable by a reader, without ending the file."""

    def finish(self) -> bytes:
        """End the file (trailer, end mark, checksum)."""


class GzipCompressor:
    """One gzip member through zlib, as pg_receivewal's gzdopen/gzwrite write it."""

    def __init__(self, level: int | None) -> None:
        self._z = zlib.compressobj(-1 if level is None else level, zlib.DEFLATED, GZIP_WBITS)

    def begin(self) -> bytes:
        return b""  # zlib writes the header with the first output

    def compress(self, data: bytes | memoryview) -> bytes:
        return bytes(self._z.compress(data))

    def flush(self) -> bytes:
        return self._z.flush(zlib.Z_SYNC_FLUSH)

    def finish(self) -> bytes:
        return self._z.flush(zlib.Z_FINISH)


class Lz4Compressor:
    """One LZ4 frame (linked 64 kB blocks), flushed with LZ4F_flush as pg_receivewal does.

    Unlike pg_receivewal we set the frame's content checksum flag, so that a damaged file is
    caught when it is read (LZ4 readers, pg_receivewal's included, check it when present).
    """

    def __init__(self, level: int | None) -> None:
        self._level = level or 0
        self._lz4 = lz4_frame()
        self._ctx = self._lz4.create_compression_context()

    def begin(self) -> bytes:
        return bytes(self._lz4.compress_begin(
            self._ctx, compression_level=self._level, block_linked=True, content_checksum=True,
            auto_flush=False,
        ))

    def compress(self, data: bytes | memoryview) -> bytes:
        return bytes(self._lz4.compress_chunk(self._ctx, data))

    def flush(self) -> bytes:
        return bytes(self._lz4.compress_flush(self._ctx, end_frame=False))

    def finish(self) -> bytes:
        return bytes(self._lz4.compress_flush(self._ctx, end_frame=True))


class ZstdCompressor:
    """One zstd frame with a content checksum; a flush ends the current block."""

    def __init__(self, level: int | None, workers: int = 0) -> None:
        self._zstd = zstandard_module()
        level = 3 if level is None else level
        if workers:  # zstd's own threads, each compressing ZSTD_JOB bytes at a time
            params = self._zstd.ZstdCompressionParameters.from_level(
                level, threads=workers, job_size=ZSTD_JOB, write_checksum=True)
            compressor = self._zstd.ZstdCompressor(compression_params=params)
        else:
            compressor = self._zstd.ZstdCompressor(level=level, write_checksum=True)
        self._z = compressor.compressobj()

    def begin(self) -> bytes:
        return b""

    def compress(self, data: bytes | memoryview) -> bytes:
        return bytes(self._z.compress(data))

    def flush(self) -> bytes:
        return bytes(self._z.flush(self._zstd.COMPRESSOBJ_FLUSH_BLOCK))

    def finish(self) -> bytes:
        return bytes(self._z.flush(self._zstd.COMPRESSOBJ_FLUSH_FINISH))

