"""pg_streampack: the compressed XLogData frame codec (pure, no IO).

The pg_streampack module compresses the XLogData frames a walsender sends when the client asks
for it (:mod:`receivewal.replication.negotiation`). A compressed
frame is the plain one with the top bit of the sendTime field (byte 17) set, a big-endian
uint32 inserted after the 25-byte header (top 2 bits: algorithm, 0 = zstd, 1 = lz4; low 30
bits: length of the uncompressed WAL payload), and the compressed payload after that::

    0 'w' | 1 walStart | 9 walEnd | 17 sendTime|0x80.. | 25 algo:2 len:30 | 29 compressed

Compression state lives for the whole connection, across timeline switches, and the decoder
must mirror it exactly:

- zstd: one endless zstd stream per connection, flushed after every message; every compressed
  body is fed, in order, to one streaming decompressor.
- lz4: every message is one raw LZ4 block whose dictionary is the last ``min(len, 64 KiB)``
  bytes of the plaintext of the previous *compressed* message. Plain frames (smaller than the
  sender's ``min_size``) leave the dictionary alone.

:class:`StreampackDecoder` restores frames on the receiving side; :class:`StreampackEncoder`
produces them exactly as the module's sender does (used by ``receivewal relay`` and tests).
"""

from __future__ import annotations

import functools
import struct
import sys
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any

from receivewal.errors import ConfigurationError, StreampackError
from receivewal.replication.messages import (
    XLOGDATA_HEADER,
    XLOGDATA_TAG,
    XLogData,
    build_xlogdata,
    parse_xlogdata,
)
from receivewal.wal.lsn import format_lsn

ALGORITHMS = ("zstd", "lz4")
"""The names pg_streampack knows, in the module's default order of preference."""
DEFAULT_MIN_SIZE = 32  # the module's pg_streampack.min_size: shorter WAL payloads go plain


@functools.cache
def _lz4_block() -> ModuleType:
    """lz4's block codec, imported with the first lz4 frame: a plain stream loads no codec."""
    import lz4.block  # noqa: PLC0415 - lazily, see the docstring

    module: ModuleType = lz4.block
    return module


@functools.cache
def _zstd_codecs() -> tuple[ModuleType, ModuleType]:
    """(zstandard, for the encoder; the bounded zstd decoder: the standard library's from 3.14
    on, the same module backported before), imported with the first zstd frame."""
    import zstandard  # noqa: PLC0415 - lazily, see the docstring

    if sys.version_info >= (3, 14):
        from compression import zstd  # noqa: PLC0415
    else:
        from backports import zstd  # noqa: PLC0415
    return zstandard, zstd

XLOGDATA_HEADER_SIZE = XLOGDATA_HEADER.size  # 25
COMPRESSED_HEADER_SIZE = 29
FLAG_OFFSET = 17
FLAG_BIT = 0x80
LENGTH_WORD = struct.Struct(">I")
LENGTH_MASK = (1 << 30) - 1
LZ4_DICT_SIZE = 64 * 1024

MAX_RESTORED_PAYLOAD = 16 * 1024 * 1024
"""Largest WAL payload the decoder accepts in one frame.

A physical walsender sends at most 16 WAL blocks per message (128 KiB with the default 8 KiB
block, 1 MiB with the largest block size), so anything above 16 MiB is a corrupted length word,
refused before memory is allocated for it.
"""

_ALGORITHM_IDS = {"zstd": 0, "lz4": 1}
_ALGORITHM_NAMES = {0: "zstd", 1: "lz4"}
_LZ4_MAX_RATIO = 255  # an LZ4 block cannot expand more than ~255x; a larger claim is corrupt


# -- statistics -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreampackStats:
    """What pg_streampack did to one connection's XLogData frames so far.

    The module's own shutdown summary maps as: ``total`` = :attr:`plain_bytes`,
    ``uncompressed`` = :attr:`uncompressed_bytes`, ``compressed`` = :attr:`compressed_bytes`,
    ``increased`` = :attr:`increased`.
    """

    algorithm: str | None = None
    frames: int = 0
    """XLogData frames seen, plain and compressed."""
    compressed_frames: int = 0
    wal_bytes: int = 0
    """WAL payload bytes carried (after decompression)."""
    wire_bytes: int = 0
    """XLogData bytes on the wire (whole CopyData payloads, headers included)."""
    plain_bytes: int = 0
    """What the same frames take on the wire without compression."""
    uncompressed_bytes: int = 0
    """Wire bytes of the frames that went plain."""
    compressed_bytes: int = 0
    """Wire bytes of the frames that went compressed."""
    increased: int = 0
    """Compressed frames no smaller than their plain form."""

    @property
    def saved_bytes(self) -> int:
        """Bytes compression kept off the wire (negative if it cost bytes)."""
        return self.plain_bytes - self.wire_bytes

    @property
    def ratio(self) -> float:
        """Plain size / wire size (1.0 before any frame)."""
        return self.plain_bytes / self.wire_bytes if self.wire_bytes else 1.0

    def as_dict(self) -> dict[str, Any]:
        """Key/values for a log event or a status document."""
        return {**asdict(self), "saved_bytes": self.saved_bytes, "ratio": round(self.ratio, 3)}


class _Counter:
    """Mutable counters behind :class:`StreampackStats`."""

    __slots__ = ("compressed_bytes", "compressed_frames", "frames", "increased",
                 "uncompressed_bytes", "wal_bytes")

    def __init__(self) -> None:
        self.frames = self.compressed_frames = self.wal_bytes = 0
        self.uncompressed_bytes = self.compressed_bytes = self.increased = 0

    def plain(self, wire: int) -> None:
        self.frames += 1
        self.wal_bytes += max(wire - XLOGDATA_HEADER_SIZE, 0)
        self.uncompressed_bytes += wire

    def compressed(self, wire: int, wal: int) -> None:
        self.frames += 1
        self.compressed_frames += 1
        self.wal_bytes += wal
        self.compressed_bytes += wire
        if wire >= XLOGDATA_HEADER_SIZE + wal:
            self.increased += 1

    def snapshot(self, algorithm: str | None) -> StreampackStats:
        return StreampackStats(
            algorithm=algorithm,
            frames=self.frames,
            compressed_frames=self.compressed_frames,
            wal_bytes=self.wal_bytes,
            wire_bytes=self.uncompressed_bytes + self.compressed_bytes,
            plain_bytes=self.wal_bytes + XLOGDATA_HEADER_SIZE * self.frames,
            uncompressed_bytes=self.uncompressed_bytes,
            compressed_bytes=self.compressed_bytes,
            increased=self.increased,
        )


# -- frame helpers ----------------------------------------------------------------------------


def is_compressed(frame: bytes | memoryview) -> bool:
    """True for an XLogData CopyData payload with the pg_streampack flag bit set."""
    return (len(frame) > FLAG_OFFSET and frame[0] == XLOGDATA_TAG
            and bool(frame[FLAG_OFFSET] & FLAG_BIT))


def _wal_start(frame: bytes | memoryview) -> str:
    if len(frame) < 9:
        return "unknown LSN"
    return format_lsn(int.from_bytes(frame[1:9], "big"))


def _lz4_tail(plaintext: bytes) -> bytes:
    return plaintext[-LZ4_DICT_SIZE:]


# -- decoder ----------------------------------------------------------------------------------


class StreampackDecoder:
    """Restores pg_streampack frames of one connection to plain XLogData payloads.

    Create one per connection (its state must survive timeline switches on that connection and
    must not survive a reconnect). ``requested`` is what the connection asked for; a compressed
    frame in an algorithm not asked for is refused. After any failure the decoder refuses
    everything: its streaming state is unusable and the connection must be dropped.
    """

    def __init__(self, requested: tuple[str, ...]) -> None:
        unknown = [name for name in requested if name not in ALGORITHMS]
        if unknown:
            raise ConfigurationError(f"unknown pg_streampack algorithm(s): {', '.join(unknown)}")
        self.requested = requested
        self._algorithm: str | None = None
        self._zstd: Any = None  # the connection's zstd stream, from the first zstd frame
        self._lz4_dict = b""
        self._failed: str | None = None
        self._counter = _Counter()

    @property
    def algorithm(self) -> str | None:
        """The algorithm of the compressed frames (None until the first one arrives)."""
        return self._algorithm

    def stats(self) -> StreampackStats:
        """A snapshot of this connection's statistics."""
        return self._counter.snapshot(self._algorithm)

    def decode(self, message: bytes | memoryview) -> XLogData:
        """Decode one XLogData CopyData payload, compressed or plain, in one pass.

        The caller has seen the ``'w'`` byte (:func:`~receivewal.replication.messages.
        parse_copy_data` calls this); it is not checked again. The payload is a memoryview:
        of ``message`` for a plain frame, of the decompressed bytes for a compressed one
        (whose sendTime comes back with the flag bit cleared). Raises
        :class:`StreampackError`, naming the frame's walStart, when a compressed frame cannot
        be restored, and ProtocolError for a plain frame shorter than its header.
        """
        if self._failed is not None:
            raise self._unusable(message)
        if len(message) > FLAG_OFFSET and message[FLAG_OFFSET] & FLAG_BIT:
            return self._decode_compressed(message)
        xlog = parse_xlogdata(message)
        self._counter.plain(len(message))
        return xlog

    def count_plain(self, frames: int, wire: int) -> None:
        """Count plain frames read without :meth:`decode` (the compiled receive loop's)."""
        self._counter.frames += frames
        self._counter.wal_bytes += wire - XLOGDATA_HEADER_SIZE * frames
        self._counter.uncompressed_bytes += wire

    def restore(self, frame: bytes | memoryview) -> bytes | memoryview:
        """Return ``frame`` as a plain CopyData payload (for the relay and tests).

        Anything but a flagged XLogData frame is returned as is (a short or malformed plain
        frame is for the message parser to refuse). A flagged frame is decompressed, checked
        and returned with the flag bit cleared. Raises :class:`StreampackError`, naming the
        frame's walStart, when the frame cannot be restored; nothing partial is returned.
        """
        if self._failed is not None:
            raise self._unusable(frame)
        if not is_compressed(frame):
            if frame and frame[0] == XLOGDATA_TAG:
                self._counter.plain(len(frame))
            return frame
        xlog = self._decode_compressed(frame)
        return build_xlogdata(xlog.wal_start, xlog.wal_end, xlog.send_time, xlog.payload)

    def _unusable(self, frame: bytes | memoryview) -> StreampackError:
        return StreampackError(
            f"pg_streampack decoder unusable after an earlier failure ({self._failed}); "
            f"frame at {_wal_start(frame)} refused"
        )

    def _decode_compressed(self, frame: bytes | memoryview) -> XLogData:
        try:
            plaintext = self._decompress(frame)
        except StreampackError as exc:
            self._failed = str(exc)
            raise
        self._counter.compressed(len(frame), len(plaintext))
        return parse_xlogdata(frame, memoryview(plaintext))

    def _fail(self, frame: bytes | memoryview, what: str) -> StreampackError:
        return StreampackError(f"bad pg_streampack frame at {_wal_start(frame)}: {what}")

    def _decompress(self, frame: bytes | memoryview) -> bytes:
        if len(frame) < COMPRESSED_HEADER_SIZE:
            raise self._fail(frame, f"truncated compressed frame of {len(frame)} bytes "
                                    f"(the header alone is {COMPRESSED_HEADER_SIZE})")
        if not self.requested:
            raise self._fail(frame, "compressed frame on a connection that requested none")
        (word,) = LENGTH_WORD.unpack_from(frame, XLOGDATA_HEADER_SIZE)
        algorithm_id, length = word >> 30, word & LENGTH_MASK
        algorithm = _ALGORITHM_NAMES.get(algorithm_id)
        if algorithm is None:
            raise self._fail(frame, f"unknown compression algorithm id {algorithm_id}")
        if algorithm not in self.requested:
            raise self._fail(frame, f"compressed with {algorithm}, which was not requested "
                                    f"(requested: {','.join(self.requested)})")
        if self._algorithm is not None and algorithm != self._algorithm:
            raise self._fail(frame, f"algorithm switched from {self._algorithm} to {algorithm} "
                                    "within one connection")
        if length > MAX_RESTORED_PAYLOAD:
            raise self._fail(frame, f"announced length {length} exceeds the largest WAL "
                                    f"message ({MAX_RESTORED_PAYLOAD} bytes)")
        body = memoryview(frame)[COMPRESSED_HEADER_SIZE:]
        if algorithm == "zstd":
            plaintext = self._zstd_decompress(frame, body, length)
        else:
            plaintext = self._lz4_decompress(frame, body, length)
        self._algorithm = algorithm
        return plaintext

    def _zstd_decompress(self, frame: bytes | memoryview, body: memoryview, length: int) -> bytes:
        """Feed ``body`` to the connection's zstd stream, taking out at most ``length + 1``
        bytes: a body that expands past its announced length is refused having cost no more
        memory than the announcement (a bomb is never expanded)."""
        zstd = _zstd_codecs()[1]
        if self._zstd is None:
            self._zstd = zstd.ZstdDecompressor()
        try:
            plaintext: bytes = self._zstd.decompress(body, max_length=length + 1)
        except (zstd.ZstdError, EOFError) as exc:
            raise self._fail(frame, f"zstd body does not decompress: {exc}") from exc
        if len(plaintext) != length:
            more = "more than " if len(plaintext) > length else ""
            raise self._fail(frame, f"zstd body yields {more}{len(plaintext)} bytes, header "
                                    f"announces {length}")
        return plaintext

    def _lz4_decompress(self, frame: bytes | memoryview, body: memoryview, length: int) -> bytes:
        if length > len(body) * _LZ4_MAX_RATIO + 16:
            raise self._fail(frame, f"announced length {length} is impossible for an lz4 block "
                                    f"of {len(body)} bytes")
        block = _lz4_block()
        try:
            plaintext = block.decompress(body, uncompressed_size=length, dict=self._lz4_dict)
        except block.LZ4BlockError as exc:
            raise self._fail(frame, f"lz4 body does not decompress: {exc}") from exc
        if len(plaintext) != length:
            raise self._fail(frame, f"lz4 body yields {len(plaintext)} bytes, "
                                    f"header announces {length}")
        self._lz4_dict = _lz4_tail(plaintext)
        return bytes(plaintext)


# -- encoder ----------------------------------------------------------------------------------


class StreampackEncoder:
    """Compresses one connection's XLogData frames exactly as the module's sender does.

    Frames that are not XLogData, or whose WAL payload is shorter than ``min_size``, are
    returned unchanged and (lz4) leave the dictionary alone. Every other frame is sent
    compressed and flagged, even when the result is larger than the plain frame (counted in
    :attr:`StreampackStats.increased`). The original sendTime is kept, with the flag bit set.
    One encoder per client connection; its state survives timeline switches.
    """

    def __init__(self, algorithm: str, min_size: int = DEFAULT_MIN_SIZE, zstd_level: int = 1,
                 ) -> None:
        if algorithm not in ALGORITHMS:
            raise ConfigurationError(f"unknown pg_streampack algorithm {algorithm!r}")
        if min_size < 0:
            raise ConfigurationError(f"invalid min size {min_size}: must be 0 or more")
        zstandard = self._zstandard = _zstd_codecs()[0]
        if not -7 <= zstd_level <= zstandard.MAX_COMPRESSION_LEVEL:
            raise ConfigurationError(f"invalid zstd level {zstd_level}: must be between -7 "
                                     f"and {zstandard.MAX_COMPRESSION_LEVEL}")
        self.algorithm = algorithm
        self.min_size = min_size
        self._zstd: Any = (
            zstandard.ZstdCompressor(level=zstd_level).compressobj()
            if algorithm == "zstd" else None
        )
        self._lz4_dict = b""
        self._counter = _Counter()

    def stats(self) -> StreampackStats:
        """A snapshot of what this encoder sent."""
        return self._counter.snapshot(self.algorithm)

    def encode(self, frame: bytes | memoryview) -> bytes | memoryview:
        """The CopyData payload to send in place of ``frame``."""
        if not frame or frame[0] != XLOGDATA_TAG or len(frame) < XLOGDATA_HEADER_SIZE:
            return frame
        payload = memoryview(frame)[XLOGDATA_HEADER_SIZE:]
        if len(payload) < self.min_size or len(payload) > LENGTH_MASK:
            self._counter.plain(len(frame))
            return frame
        if self._zstd is not None:
            body = self._zstd.compress(payload)
            body += self._zstd.flush(self._zstandard.COMPRESSOBJ_FLUSH_BLOCK)
            algorithm_id = 0
        else:
            body = _lz4_block().compress(payload, store_size=False, dict=self._lz4_dict)
            self._lz4_dict = _lz4_tail(bytes(payload[-LZ4_DICT_SIZE:]))
            algorithm_id = 1
        header = bytearray(frame[:XLOGDATA_HEADER_SIZE])
        header[FLAG_OFFSET] |= FLAG_BIT
        out = b"".join((header, LENGTH_WORD.pack((algorithm_id << 30) | len(payload)), body))
        self._counter.compressed(len(out), len(payload))
        return out
