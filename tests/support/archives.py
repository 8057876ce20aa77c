"""Helpers for archives compressed at rest (``-Z``): decoding files and comparing with pg_wal."""

from __future__ import annotations

import os
from pathlib import Path

import zstandard

from receivewal.archive.compression import decompress_chunks
from receivewal.wal.majors import PAGE_MAGICS
from receivewal.wal.names import AtRest, parse_segment_file_name
from receivewal.wal.pageheader import (
    LONG_FIELDS,
    SHORT_HEADER,
    SIZE_OF_LONG_PHD,
    SIZE_OF_SHORT_PHD,
    XLOG_BLCKSZ,
    XLP_LONG_HEADER,
)
from support.servers import PgServer

SEGMENT = 16 << 20
SUFFIX = {fmt.value: fmt.suffix for fmt in AtRest if fmt}  # compressed formats only


def decoded(path: Path, *, truncated_ok: bool = False) -> bytes:
    """The WAL a (possibly compressed) archive file holds."""
    parsed = parse_segment_file_name(path.name, SEGMENT)
    assert parsed is not None, path
    with path.open("rb") as fh:
        return b"".join(decompress_chunks(fh, parsed.compression, truncated_ok=truncated_ok))


def segment_files(directory: Path) -> list[str]:
    """Names of segment files of every form in an archive, sorted."""
    return sorted(n for n in os.listdir(directory)
                  if parse_segment_file_name(n, SEGMENT) is not None)


def complete_files(directory: Path) -> list[str]:
    """Complete segment files (any compression), sorted."""
    return [n for n in segment_files(directory) if not n.endswith(".partial")]


def partial_files(directory: Path) -> list[str]:
    """``.partial`` files (any compression), sorted."""
    return [n for n in segment_files(directory) if n.endswith(".partial")]


def wal_name(file_name: str) -> str:
    """The bare WAL file name of an archive file."""
    return file_name[:24]


def segno(file_name: str) -> int:
    """The segment number in a file name (16 MB segments)."""
    return int(file_name[8:16], 16) * 256 + int(file_name[16:24], 16)


def assert_decompresses_to_server(directory: Path, server: PgServer, suffix: str) -> list[str]:
    """Every complete archive file has ``suffix`` and decodes to the server's own segment."""
    names = complete_files(directory)
    assert names, "no complete segment in the archive"
    for name in names:
        assert name.endswith(suffix), name
        assert len(name) == 24 + len(suffix), name
        theirs = (server.pg_wal / wal_name(name)).read_bytes()
        assert decoded(directory / name) == theirs, f"{name} does not decode to the server's"
    return names


def assert_consecutive(names: list[str]) -> None:
    """Segment numbers follow each other without a hole."""
    numbers = [segno(n) for n in names]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), names


def assert_partial_is_prefix(directory: Path, server: PgServer, name: str,
                             at_least: int = 0) -> int:
    """A ``.partial`` decodes (up to its last flush) to a prefix of the server's segment."""
    ours = decoded(directory / name, truncated_ok=True)
    theirs = (server.pg_wal / wal_name(name)).read_bytes()
    assert len(ours) >= at_least, f"{name} holds {len(ours)} bytes, expected {at_least}+"
    assert ours == theirs[: len(ours)], f"{name} is not a prefix of the server's segment"
    return len(ours)


def proven_segment(segno: int, system_identifier: int = 7) -> bytes:
    """A 16 MiB segment of zeros behind a long page header that proves it is segment ``segno``
    of timeline 1 (for the resume scan, which trusts only files whose header matches)."""
    header = bytearray(SIZE_OF_LONG_PHD)
    SHORT_HEADER.pack_into(header, 0, PAGE_MAGICS[15], XLP_LONG_HEADER, 1, segno * SEGMENT, 0)
    LONG_FIELDS.pack_into(header, SIZE_OF_SHORT_PHD, system_identifier, SEGMENT, XLOG_BLCKSZ)
    return bytes(header) + bytes(SEGMENT - SIZE_OF_LONG_PHD)


def zstd_bomb(path: Path, zeros: int) -> None:
    """A small .zst file that decodes to ``zeros`` zero bytes (a decompression bomb)."""
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    block = bytes(1 << 20)
    with path.open("wb") as out:
        for _ in range(zeros >> 20):
            out.write(compressor.compress(block))
        out.write(compressor.flush())
