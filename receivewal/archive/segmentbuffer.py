"""Whole segments read into one reused buffer per process (verify's and analyze's scans,
and restore's check of what it serves).

A plain segment is read with ``readinto`` straight into the buffer (no per-chunk ``bytes``,
no join, no fresh 16 MiB allocation whose pages the kernel must fault in for every file); a
compressed one is decompressed chunk by chunk into the same buffer. The same caps and errors
as :func:`~receivewal.archive.compression.read_wal_file`: never more than the segment size
plus one byte is read, and a file that holds more is a CorruptFile naming it.
"""

from __future__ import annotations

from typing import BinaryIO

from receivewal.archive.compression import (
    CorruptFile,
    Opener,
    decompress_chunks,
    reading,
)
from receivewal.wal.names import PARTIAL_SUFFIX

_buffer = bytearray()  # this process's; overwritten by the next read_segment


def read_segment(path: str, compression: str, segment_size: int,
                 open_binary: Opener | None = None) -> bytes | bytearray:
    """The decompressed content of a segment file, at most ``segment_size`` bytes.

    When it fills a whole segment (every complete segment) the result *is* this process's
    reused buffer, valid until the next call; anything shorter (a ``.partial``, a truncated
    file) is returned as a copy of its own.
    """
    with reading(path, open_binary) as raw:
        return decode_segment(raw, compression, segment_size,
                              partial=path.endswith(PARTIAL_SUFFIX))


def decode_segment(raw: BinaryIO, compression: str, segment_size: int, *,
                   partial: bool = False) -> bytes | bytearray:
    """The decompressed content of the open segment file ``raw`` (``partial``: a ``.partial``,
    whose compressed stream may end short), as :func:`read_segment` returns it."""
    global _buffer  # noqa: PLW0603 - one buffer per process is the point
    if len(_buffer) != segment_size:
        _buffer = bytearray(segment_size)
    with memoryview(_buffer) as view:
        if not compression:
            size = _fill(raw, view)
            if size == segment_size and raw.read(1):
                raise CorruptFile(f"holds more than {segment_size} bytes")
        else:
            size = 0
            for chunk in decompress_chunks(raw, compression, cap=segment_size,
                                           truncated_ok=partial):
                view[size:size + len(chunk)] = chunk
                size += len(chunk)
        return _buffer if size == segment_size else bytes(view[:size])


def _fill(raw: BinaryIO, view: memoryview) -> int:
    """Read into ``view`` until it is full or the file ends; the bytes read."""
    size = 0
    while size < len(view):
        got = raw.readinto(view[size:])  # type: ignore[attr-defined] # every file has it
        if not got:
            break
        size += got
    return size
