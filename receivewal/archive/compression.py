"""Compression at rest (``-Z/--compress``): the option's grammar and the stream codecs.

The option reads as pg_receivewal 15 reads it: ``METHOD[:DETAIL]`` where METHOD is ``none``,
``gzip``, ``lz4`` or ``zstd`` and DETAIL is a bare level or ``level=N[,workers=N]``; a bare
integer alone means gzip at that level (``0`` means none). Error messages are PostgreSQL's.

Files are framed as pg_receivewal writes them: ``.gz`` is one gzip member (zlib's own header,
as ``gzdopen`` writes it), ``.lz4`` one LZ4 frame, and ``.zst`` (receivewal's addition) one
zstd frame with a content checksum. A compressor never touches a file: it turns WAL into
bytes, and :mod:`receivewal.archive` writes and fsyncs them.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, Protocol

import lz4.frame
import zstandard

from receivewal.errors import ConfigurationError

METHODS = {"none": "", "gzip": "gzip", "lz4": "lz4", "zstd": "zstd"}
# (min, max, default) levels, as PostgreSQL 15 validates them
_LEVELS = {"gzip": (1, 9, -1), "lz4": (1, 12, 0), "zstd": (-131072, 22, 3)}
_C_INTEGER = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+")  # what strtol() consumes entirely
_GZIP_WBITS = 31  # a gzip header and trailer around the deflate stream
_CHUNK = 1 << 20


@dataclass(frozen=True)
class CompressSpec:
    """How segments are compressed at rest: ``method`` is "", "gzip", "lz4" or "zstd"."""

    method: str = ""
    level: int | None = None  # None: the method's default
    workers: int = 0

    @property
    def name(self) -> str:
        """The method as the option spells it."""
        return self.method or "none"


NO_COMPRESSION = CompressSpec()


def _strtol_whole(text: str) -> int | None:
    """The integer when C's strtol() would consume all of ``text``, else None."""
    return int(text) if _C_INTEGER.fullmatch(text) else None


def parse_compress_option(option: str) -> CompressSpec:
    """Parse ``-Z`` as pg_receivewal 15 does; ConfigurationError carries its message."""
    detail: str | None
    if option == "" or _C_INTEGER.fullmatch(option):
        if int(option or "0") == 0:
            return NO_COMPRESSION
        algorithm, detail = "gzip", option
    else:
        algorithm, sep, rest = option.partition(":")
        detail = rest if sep else None
    if algorithm not in METHODS:
        raise ConfigurationError(f'unrecognized compression algorithm: "{algorithm}"')
    level, workers = _parse_detail(detail)
    problem = _validate(algorithm, level, workers)
    if problem:
        raise ConfigurationError(f"invalid compression specification: {problem}")
    method = METHODS[algorithm]
    if not method:
        return NO_COMPRESSION
    default = _LEVELS[method][2]
    return CompressSpec(method, None if level in (None, default) else level, workers or 0)


def _parse_detail(detail: str | None) -> tuple[int | None, int | None]:
    """(level, workers) from a compression detail; ConfigurationError on bad syntax."""
    if detail is None:
        return None, None
    bare = _strtol_whole(detail)
    if bare is not None:
        return bare, None
    level = workers = None
    for item in detail.split(","):
        keyword, has_value, value = item.partition("=")
        if not keyword:
            raise ConfigurationError("invalid compression specification: found empty string "
                                     "where a compression option was expected")
        if keyword not in ("level", "workers"):
            raise ConfigurationError("invalid compression specification: unrecognized "
                                     f'compression option: "{keyword}"')
        if not has_value:
            raise ConfigurationError(f'invalid compression specification: compression option '
                                     f'"{keyword}" requires a value')
        number = _strtol_whole(value)
        if number is None:
            raise ConfigurationError(f'invalid compression specification: value for '
                                     f'compression option "{keyword}" must be an integer')
        if keyword == "level":
            level = number
        else:
            workers = number
    return level, workers


def _validate(algorithm: str, level: int | None, workers: int | None) -> str | None:
    """PostgreSQL's validate_compress_specification(): the problem, or None."""
    if level is not None:
        if algorithm == "none":
            if level != 0:
                return f'compression algorithm "{algorithm}" does not accept a compression level'
        else:
            low, high, default = _LEVELS[algorithm]
            if not low <= level <= high and level != default:
                return (f'compression algorithm "{algorithm}" expects a compression level '
                        f"between {low} and {high} (default at {default})")
    if workers is not None and algorithm != "zstd":
        return f'compression algorithm "{algorithm}" does not accept a worker count'
    return None


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
        self._z = zlib.compressobj(-1 if level is None else level, zlib.DEFLATED, _GZIP_WBITS)

    def begin(self) -> bytes:
        return b""  # zlib writes the header with the first output

    def compress(self, data: bytes | memoryview) -> bytes:
        return self._z.compress(data)

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
        self._ctx = lz4.frame.create_compression_context()

    def begin(self) -> bytes:
        return bytes(lz4.frame.compress_begin(
            self._ctx, compression_level=self._level, block_linked=True, content_checksum=True,
            auto_flush=False,
        ))

    def compress(self, data: bytes | memoryview) -> bytes:
        return bytes(lz4.frame.compress_chunk(self._ctx, data))

    def flush(self) -> bytes:
        return bytes(lz4.frame.compress_flush(self._ctx, end_frame=False))

    def finish(self) -> bytes:
        return bytes(lz4.frame.compress_flush(self._ctx, end_frame=True))


class ZstdCompressor:
    """One zstd frame with a content checksum; a flush ends the current block."""

    def __init__(self, level: int | None, workers: int = 0) -> None:
        compressor = zstandard.ZstdCompressor(level=3 if level is None else level,
                                              write_checksum=True, threads=workers)
        self._z = compressor.compressobj()

    def begin(self) -> bytes:
        return b""

    def compress(self, data: bytes | memoryview) -> bytes:
        return self._z.compress(data)

    def flush(self) -> bytes:
        return self._z.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)

    def finish(self) -> bytes:
        return self._z.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)


def new_compressor(spec: CompressSpec) -> Compressor:
    """A fresh compressor for one file."""
    if spec.method == "gzip":
        return GzipCompressor(spec.level)
    if spec.method == "lz4":
        return Lz4Compressor(spec.level)
    if spec.method == "zstd":
        return ZstdCompressor(spec.level, spec.workers)
    raise ConfigurationError(f"no compressor for method {spec.name!r}")


# -- decompression -----------------------------------------------------------------------------
class CorruptFile(ValueError):  # noqa: N818 - reads as what the caller is told
    """A compressed file cannot be decoded."""


def decompress_chunks(fh: BinaryIO, method: str, *, truncated_ok: bool = False,
                      ) -> Iterator[bytes]:
    """Decompressed content of a compressed file, chunk by chunk.

    Concatenated gzip members, LZ4 frames and zstd frames are all read, as the command line
    tools read them. A stream that stops before its end raises CorruptFile unless
    ``truncated_ok`` (a ``.partial`` that a crash left unfinished is readable up to its last
    flushed block).
    """
    if method == "":
        while chunk := fh.read(_CHUNK):
            yield chunk
        return
    decoder = _new_decoder(method)
    complete = True  # nothing read yet: an empty file holds no data
    try:
        while chunk := fh.read(_CHUNK):
            while chunk:
                complete = False
                out = decoder.decompress(chunk)
                if out:
                    yield out
                if not decoder.eof:
                    break
                complete = True
                chunk = decoder.unused_data
                decoder = _new_decoder(method)
    except (zlib.error, zstandard.ZstdError, RuntimeError) as exc:
        raise CorruptFile(f"{method} data is damaged: {exc}") from exc
    if not complete and not truncated_ok:
        raise CorruptFile(f"{method} data ends before the end of its stream")


class _Decoder(Protocol):
    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...

    def decompress(self, data: bytes, /) -> bytes: ...


def _new_decoder(method: str) -> _Decoder:
    if method == "gzip":
        return zlib.decompressobj(_GZIP_WBITS)
    if method == "lz4":
        decoder: _Decoder = lz4.frame.LZ4FrameDecompressor()
        return decoder
    if method == "zstd":
        return zstandard.ZstdDecompressor().decompressobj()
    raise ValueError(f"unknown compression method {method!r}")


def decompressed_size(fh: BinaryIO, method: str) -> int:
    """How many bytes a complete compressed file decodes to (CorruptFile when it cannot)."""
    return sum(len(chunk) for chunk in decompress_chunks(fh, method))
