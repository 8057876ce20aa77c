"""At-rest formats: the ``-Z/--compress`` grammar, the table of codecs, reading archive files.

The option reads as pg_receivewal 15 reads it: ``METHOD[:DETAIL]`` where METHOD is ``none``,
``gzip``, ``lz4`` or ``zstd`` and DETAIL is a bare level or ``level=N[,workers=N]``; a bare
integer alone means gzip at that level (``0`` means none). Error messages are PostgreSQL's.

Files are framed as pg_receivewal writes them: ``.gz`` is one gzip member (zlib's own header,
as ``gzdopen`` writes it), ``.lz4`` one LZ4 frame, and ``.zst`` (receivewal's addition) one
zstd frame with a content checksum. A compressor never touches a file: it turns WAL into
bytes, and :mod:`receivewal.archive` writes and fsyncs them.

:data:`FORMATS` is the one table of formats (plain, gzip, lz4, zstd; the members of
:class:`~receivewal.wal.names.AtRest`, which also give the suffixes): each row says how to
write and how to read. Reading is streamed with an output cap: no file ever makes a reader hold
more than the cap (the segment size) plus one byte, so a decompression bomb or an oversize file
is a :class:`CorruptFile` naming it, never a memory blow-up. ``open_binary`` may be replaced
(e.g. by a pyarrow file system's ``open_input_stream``) so that Spark executors read Hadoop
paths themselves.
"""

from __future__ import annotations

import contextlib
import re
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from receivewal.archive.codecs import (
    GZIP_WBITS,
    Compressor,
    GzipCompressor,
    Lz4Compressor,
    ZstdCompressor,
    bounded_zstd,
    lz4_frame,
    zstandard_module,
)
from receivewal.archive.reading import open_regular
from receivewal.errors import ArchiveError, ConfigurationError, StoreError
from receivewal.wal.lsn import MAX_SEGMENT_SIZE
from receivewal.wal.names import PARTIAL_SUFFIX, AtRest

_C_INTEGER = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+")  # what strtol() consumes entirely
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


# -- the table of at-rest formats ---------------------------------------------------------------
class Decoder(Protocol):
    """A decoder of one compressed stream, as bz2, lzma, lz4 and zstd decompressors are:
    ``decompress`` returns at most ``max_length`` bytes and keeps the input it has not used."""

    @property
    def eof(self) -> bool: ...

    @property
    def needs_input(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...

    def decompress(self, data: bytes, max_length: int, /) -> bytes: ...


class GzipDecoder:
    """zlib's decompressor (gzip or zlib header) in the :class:`Decoder` interface."""

    def __init__(self) -> None:
        self._z = zlib.decompressobj(GZIP_WBITS + 16)  # 47: gzip or zlib header, detected
        self.needs_input = True

    @property
    def eof(self) -> bool:
        return self._z.eof

    @property
    def unused_data(self) -> bytes:
        return self._z.unused_data

    def decompress(self, data: bytes, max_length: int, /) -> bytes:
        tail = self._z.unconsumed_tail
        out = self._z.decompress(tail + data if tail else data, max_length)
        self.needs_input = not self._z.unconsumed_tail and len(out) < max_length
        return out


def _lz4_decoder() -> Decoder:
    decoder: Decoder = lz4_frame().LZ4FrameDecompressor()
    return decoder


def _zstd_decoder() -> Decoder:
    decoder: Decoder = bounded_zstd().ZstdDecompressor()
    return decoder


def _no_errors() -> tuple[type[Exception], ...]:
    return ()


@dataclass(frozen=True)
class Codec:
    """One compression method: how the option names it, the levels PostgreSQL 15 accepts
    (``levels``: min, max, default; None for none), how its at-rest format is written and read
    (None: plain bytes, no codec), and whether the change log's files take it. ``errors`` are
    the decoder's own exceptions for damaged data besides zlib's, RuntimeError, EOFError."""

    fmt: AtRest
    name: str
    levels: tuple[int, int, int] | None
    compressor: Callable[[CompressSpec], Compressor] | None
    decoder: Callable[[], Decoder] | None
    errors: Callable[[], tuple[type[Exception], ...]] = _no_errors
    change_files: bool = False


#: The one table of compression methods (every ``--compress``/``-Z`` parses against it, every
#: at-rest file is written and read by it), from none to the strongest.
FORMATS: dict[AtRest, Codec] = {
    AtRest.PLAIN: Codec(AtRest.PLAIN, "none", None, None, None, change_files=True),
    AtRest.GZIP: Codec(AtRest.GZIP, "gzip", (1, 9, -1),
                       lambda spec: GzipCompressor(spec.level), GzipDecoder),
    AtRest.LZ4: Codec(AtRest.LZ4, "lz4", (1, 12, 0),
                      lambda spec: Lz4Compressor(spec.level), _lz4_decoder),
    AtRest.ZSTD: Codec(AtRest.ZSTD, "zstd", (-131072, 22, 3),
                       lambda spec: ZstdCompressor(spec.level, spec.workers),
                       _zstd_decoder, lambda: (bounded_zstd().ZstdError,), change_files=True),
}
assert set(FORMATS) == set(AtRest), "every at-rest format has a codec"
#: The methods by the name the options give them.
METHODS = {codec.name: codec for codec in FORMATS.values()}


def _strtol_whole(text: str) -> int | None:
    """The integer when C's strtol() would consume all of ``text``, else None."""
    return int(text) if _C_INTEGER.fullmatch(text) else None


def parse_compress_option(option: str, *, named: bool = False,
                          change_files: bool = False) -> CompressSpec:
    """Parse ``-Z`` as pg_receivewal 15 does; ConfigurationError carries its message. With
    ``named`` (``backup --compress``) the method must be named (no bare gzip level); with
    ``change_files`` (``logical -Z``) it must be one the change log's files take."""
    if named and option.partition(":")[0] not in METHODS:
        offered = ", ".join(reversed(METHODS))  # the strongest first, none last
        raise ConfigurationError(f"{option!r}: one of {offered}, with :LEVEL")
    spec = _parse_pg_compression(option)
    if change_files and not codec_of(spec.method).change_files:
        raise ConfigurationError(f"change files can be compressed with {_change_file_methods()} "
                                 f'only, not "{option}"')
    return spec


def _change_file_methods() -> str:
    """The methods the change log's files take, as a message says them (none aside)."""
    return " or ".join(codec.name for codec in FORMATS.values()
                       if codec.change_files and codec.compressor is not None)


def check_change_file_method(method: str) -> None:
    """ConfigurationError unless the change log's files take ``method`` ("" for none)."""
    if method not in (codec.fmt.value for codec in FORMATS.values() if codec.change_files):
        raise ConfigurationError(f"the change log can be compressed with "
                                 f"{_change_file_methods()} only, not {method!r}")


def _parse_pg_compression(option: str) -> CompressSpec:
    """``-Z``'s grammar, as pg_receivewal 15 reads it."""
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
    problem = _validate(METHODS[algorithm], level, workers)
    if problem:
        raise ConfigurationError(f"invalid compression specification: {problem}")
    levels = METHODS[algorithm].levels
    if levels is None:
        return NO_COMPRESSION
    return CompressSpec(METHODS[algorithm].fmt.value, None if level in (None, levels[2]) else level,
                        workers or 0)


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


def _validate(codec: Codec, level: int | None, workers: int | None) -> str | None:
    """PostgreSQL's validate_compress_specification(): the problem, or None."""
    algorithm = codec.name
    if level is not None:
        if codec.levels is None:
            if level != 0:
                return f'compression algorithm "{algorithm}" does not accept a compression level'
        else:
            low, high, default = codec.levels
            if not low <= level <= high and level != default:
                return (f'compression algorithm "{algorithm}" expects a compression level '
                        f"between {low} and {high} (default at {default})")
    if workers is not None and codec.fmt is not AtRest.ZSTD:
        return f'compression algorithm "{algorithm}" does not accept a worker count'
    return None


def codec_of(method: str) -> Codec:
    """The row of :data:`FORMATS` for a method name ("" for plain)."""
    try:
        return FORMATS[AtRest(method)]
    except ValueError:
        raise ArchiveError(f"unknown compression method {method!r}") from None


def new_compressor(spec: CompressSpec) -> Compressor:
    """A fresh compressor for one file."""
    make = codec_of(spec.method).compressor
    if make is None:
        raise ConfigurationError(f"no compressor for method {spec.name!r}")
    return make(spec)


# -- reading -----------------------------------------------------------------------------------
class CorruptFile(ArchiveError):  # noqa: N818 - reads as what the caller is told
    """An archive file cannot be decoded, or holds more than it may (a segment's size)."""


Opener = Callable[[str], BinaryIO]


def open_local(path: str) -> BinaryIO:
    """Open a local file for reading, only a regular file (never a FIFO, socket, device or
    symbolic link): the default ``open_binary``."""
    return open_regular(path)


def decompress_chunks(fh: BinaryIO, method: str, *, truncated_ok: bool = False,
                      cap: int | None = None) -> Iterator[bytes]:
    """Decompressed content of an archive file, chunk by chunk (at most 1 MiB each).

    Concatenated gzip members, LZ4 frames and zstd frames are all read, as the command line
    tools read them. A stream that stops before its end raises CorruptFile unless
    ``truncated_ok`` (a ``.partial`` that a crash left unfinished is readable up to its last
    flushed block). With ``cap``, content beyond ``cap`` bytes raises CorruptFile after at
    most ``cap + 1`` bytes were decoded.
    """
    total = 0
    limit = None if cap is None else cap + 1
    for chunk in _decode(fh, codec_of(method), limit, truncated_ok=truncated_ok):
        total += len(chunk)
        if cap is not None and total > cap:
            raise CorruptFile(f"holds more than {cap} bytes")
        yield chunk


def _decode(fh: BinaryIO, codec: Codec, limit: int | None, *, truncated_ok: bool,
            ) -> Iterator[bytes]:
    """At most ``limit`` decoded bytes of ``fh`` (all of them when None)."""
    room = sys.maxsize if limit is None else limit
    if codec.decoder is None:
        while room > 0 and (chunk := fh.read(min(_CHUNK, room))):
            room -= len(chunk)
            yield chunk
        return
    damaged: tuple[type[Exception], ...] = (zlib.error, RuntimeError, EOFError,
                                            *codec.errors())
    decoder, pending, complete = codec.decoder(), b"", True  # an empty file holds no data
    try:
        while room > 0:
            if not pending and decoder.needs_input:
                pending = fh.read(_CHUNK)
                if not pending:
                    break
            complete = complete and not pending
            out = decoder.decompress(pending, min(room, _CHUNK))
            pending = b""
            if out:
                room -= len(out)
                yield out
            if decoder.eof:  # the next member or frame, if any, starts in the unused input
                complete, pending, decoder = True, decoder.unused_data, codec.decoder()
    except damaged as exc:
        raise CorruptFile(f"{codec.fmt.value} data is damaged: {exc}") from exc
    if room > 0 and not complete and not truncated_ok:
        raise CorruptFile(f"{codec.fmt.value} data ends before the end of its stream")


def decompressed_size(fh: BinaryIO, method: str, cap: int = MAX_SEGMENT_SIZE) -> int:
    """How many bytes a complete archive file decodes to (CorruptFile when it cannot, or when
    it holds more than ``cap``)."""
    return sum(len(chunk) for chunk in decompress_chunks(fh, method, cap=cap))


def read_wal_file(path: str, compression: str, limit: int | None = None,
                  open_binary: Opener | None = None, *, cap: int = MAX_SEGMENT_SIZE) -> bytes:
    """The decompressed bytes of an archive file, or only its first ``limit`` bytes.

    A file holding more than ``cap`` bytes (pass the segment size) is a CorruptFile naming
    it; so is a damaged stream, or one that ends early unless the file is a ``.partial``.
    An unreadable file is an ArchiveError naming it.
    """
    with reading(path, open_binary) as raw:
        if limit is not None:
            return b"".join(_decode(raw, codec_of(compression), limit, truncated_ok=True))
        return b"".join(decompress_chunks(
            raw, compression, truncated_ok=path.endswith(PARTIAL_SUFFIX), cap=cap))


@contextlib.contextmanager
def reading(path: str, open_binary: Opener | None = None) -> Iterator[BinaryIO]:
    """An archive file opened for reading; any failure to open, read or decode it is an
    ArchiveError naming it (CorruptFile when its content is at fault)."""
    try:
        with (open_binary or open_local)(path) as raw:
            yield raw
    except CorruptFile as exc:
        raise CorruptFile(f"cannot read {path}: {exc}") from exc
    except OSError as exc:
        raise ArchiveError(f"cannot read {path}: {exc}") from exc
    except StoreError as exc:  # an object of an archive in a bucket: the store's own words
        raise ArchiveError(str(exc)) from exc


# -- what streampack would save (verify --compressibility) ------------------------------------
def compressed_sizes(data: bytes | bytearray) -> tuple[int, int]:
    """Bytes after zstd level 1 and after LZ4 (frame, default level): what streampack saves.
    The codecs are imported here, for --compressibility only (a plain archive's verify loads
    neither)."""
    return (len(zstandard_module().ZstdCompressor(level=1).compress(data)),
            len(lz4_frame().compress(data)))
