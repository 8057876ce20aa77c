"""Whole segments are read into one reused buffer per process (verify's read path).

Pure file reading: the bytes need not be WAL, so each test writes its own files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import zstandard

from receivewal.archive.compression import CorruptFile
from receivewal.archive.segmentbuffer import read_segment

SIZE = 1 << 20


def test_complete_segments_are_read_into_the_same_buffer(tmp_path: Path) -> None:
    """Two complete segments, one plain and one zstd, come back byte-exact in one and the same
    buffer: no new segment-sized allocation per file."""
    first, second = os.urandom(SIZE), os.urandom(SIZE)
    (tmp_path / "a").write_bytes(first)
    (tmp_path / "b.zst").write_bytes(zstandard.ZstdCompressor().compress(second))
    one = read_segment(str(tmp_path / "a"), "", SIZE)
    assert one == first
    two = read_segment(str(tmp_path / "b.zst"), "zstd", SIZE)
    assert two == second
    assert two is one


def test_a_short_file_is_a_copy_of_its_own(tmp_path: Path) -> None:
    """A file shorter than a segment (a .partial) is returned as its own bytes, so that the
    next read cannot change it."""
    short = os.urandom(SIZE // 2)
    (tmp_path / "a.partial").write_bytes(short)
    (tmp_path / "b").write_bytes(os.urandom(SIZE))
    got = read_segment(str(tmp_path / "a.partial"), "", SIZE)
    read_segment(str(tmp_path / "b"), "", SIZE)
    assert got == short


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "zstd"])
def test_a_file_larger_than_a_segment_is_corrupt_and_named(tmp_path: Path,
                                                           compressed: bool) -> None:
    """More than a segment's bytes is a CorruptFile naming the file, plain or compressed."""
    data = bytes(SIZE + 1)
    path = tmp_path / ("big.zst" if compressed else "big")
    path.write_bytes(zstandard.ZstdCompressor().compress(data) if compressed else data)
    with pytest.raises(CorruptFile, match=f"{path}.*more than {SIZE} bytes"):
        read_segment(str(path), "zstd" if compressed else "", SIZE)
