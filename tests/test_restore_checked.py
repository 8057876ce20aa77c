"""Restore checks what it serves (issue 25, items 1, 2 and 5): every page header against the
segment's name and the archive's system identifier and segment size, and the CRC of every
record that lies in the segment, on every path that hands WAL out (a directory, ``--partial``,
the prefetch filler and its spool). Anything wrong is exit 126 with one line naming the file
and the LSN, and nothing at ``%p``: PostgreSQL stops recovery instead of promoting early.

Real segment files: synthetic WAL the reader accepts (support/walgen.py), and the committed
1 MiB segment pair of a real server (tests/data/wal); the end-to-end claim, with PostgreSQL
replaying a base backup, is in test_restore_pitr.py. The bucket's cases are in
test_restore_bucket.py (they need the real S3 server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard
from support.scanner import scanner_path  # noqa: F401 - the fixture, used below
from support.walgen import SEGMENT, SYSID, name_of, record_offsets, wal_segment

from receivewal.archive.identity import ArchiveIdentity
from receivewal.archive.segmentcheck import DamagedSegment, checked_segment
from receivewal.restore.filler import Spool
from receivewal.wal.lsn import format_lsn, parse_lsn
from receivewal.wal.pageheader import archive_segment_size

IDENTITY = ".receivewal-archive.json"


def identity(sysid: int = SYSID, size: int = SEGMENT) -> str:
    return json.dumps({"system_identifier": str(sysid), "wal_segment_size": size,
                       "timeline": 1})


def flipped(data: bytes, offset: int) -> bytes:
    """``data`` with one bit flipped at ``offset``."""
    out = bytearray(data)
    out[offset] ^= 0x10
    return bytes(out)


def restore(archive: Path, *args: str, prefetch: int = 0, cwd: Path | None = None,
            ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RECEIVEWAL_PREFETCH": str(prefetch), "RECEIVEWAL_PREFETCH_IDLE": "5"}
    return subprocess.run([sys.executable, "-m", "receivewal", "restore", "-D", str(archive),
                           *args], capture_output=True, text=True, check=False, timeout=120,
                          env=env, cwd=cwd)


def one_line(stderr: str, *words: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    for word in words:
        assert word in lines[0], stderr
    return lines[0]


def nothing_at(target: Path) -> None:
    assert not target.exists()
    assert [n for n in os.listdir(target.parent) if target.name in n] == []


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    """An archive of segments 3 to 5 (plain), with its identity file."""
    path = tmp_path / "archive"
    path.mkdir()
    (path / IDENTITY).write_text(identity())
    for segno in (3, 4, 5):
        (path / name_of(segno)).write_bytes(wal_segment(segno))
    return path


@pytest.fixture
def pg_wal(tmp_path: Path) -> Path:
    path = tmp_path / "pg_wal"
    path.mkdir()
    return path


# -- item 1: one flipped bit ----------------------------------------------------------------------
@pytest.mark.parametrize("form", ["plain", "zstd"])
def test_a_flipped_bit_in_a_record_is_exit_126_naming_the_file_and_the_lsn(
        archive: Path, pg_wal: Path, form: str) -> None:
    """One bit flipped inside a record (the file's size and page headers as they were):
    exit 126, one line naming the file and the record's LSN, nothing at %p. A .zst holding
    the flipped segment decodes fine (its frame checksum is over the flipped bytes)."""
    data = wal_segment(4)
    at = record_offsets(data)[100] + 30
    name = name_of(4)
    (archive / name).unlink()
    if form == "zstd":
        name += ".zst"
        (archive / name).write_bytes(
            zstandard.ZstdCompressor(write_checksum=True).compress(flipped(data, at)))
    else:
        (archive / name).write_bytes(flipped(data, at))
    target = pg_wal / "RECOVERYXLOG"
    done = restore(archive, name_of(4), str(target))
    assert done.returncode == 126, done.stderr
    record = 4 * SEGMENT + record_offsets(data)[100]
    one_line(done.stderr, str(archive / name), format_lsn(record))
    nothing_at(target)


def test_a_flipped_bit_in_a_page_header_is_exit_126(archive: Path, pg_wal: Path) -> None:
    """A page header's address changed by one bit: exit 126 naming the first LSN it spoils
    (the page's, or that of the record that runs into it)."""
    data = wal_segment(4)
    page = 77 * 8192
    (archive / name_of(4)).write_bytes(flipped(data, page + 9))
    done = restore(archive, name_of(4), str(pg_wal / "RECOVERYXLOG"))
    assert done.returncode == 126, done.stderr
    line = one_line(done.stderr, name_of(4))
    lsn = parse_lsn(line.split('" at ')[-1].split(":")[0])
    assert 4 * SEGMENT + page - 3 * 8192 < lsn <= 4 * SEGMENT + page, line


def test_the_good_segments_still_restore_byte_for_byte(archive: Path, pg_wal: Path) -> None:
    """The checks refuse only what is wrong: the archive's segments arrive as they are."""
    for segno in (3, 4, 5):
        done = restore(archive, name_of(segno), str(pg_wal / "RECOVERYXLOG"))
        assert done.returncode == 0, done.stderr
        assert (pg_wal / "RECOVERYXLOG").read_bytes() == wal_segment(segno)


def test_the_real_servers_segments_restore(tmp_path: Path, pg_wal: Path) -> None:
    """The committed pair of a real server's 1 MiB segments (a record crosses from the first
    into the second) restores as it is, with no identity file (the size from the header)."""
    data = Path(__file__).parent / "data" / "wal"
    for path in sorted(data.glob("*.zst")):
        done = restore(data, path.name[:24], str(pg_wal / "RECOVERYXLOG"))
        assert done.returncode == 0, done.stderr
        assert (pg_wal / "RECOVERYXLOG").read_bytes() == \
            zstandard.ZstdDecompressor().decompress(path.read_bytes())


# -- item 2: another cluster's segment under the right name -------------------------------------
def test_another_clusters_segment_is_exit_126(archive: Path, pg_wal: Path) -> None:
    """A segment of another database system (valid WAL, the right name, size and addresses)
    in an archive whose identity names this one: exit 126 naming both system identifiers."""
    other = SYSID + 1
    (archive / name_of(4)).write_bytes(wal_segment(4, system_identifier=other))
    done = restore(archive, name_of(4), str(pg_wal / "RECOVERYXLOG"))
    assert done.returncode == 126, done.stderr
    one_line(done.stderr, name_of(4), str(other), str(SYSID), format_lsn(4 * SEGMENT))
    nothing_at(pg_wal / "RECOVERYXLOG")


def test_a_segment_of_another_segment_size_is_exit_126(archive: Path, pg_wal: Path) -> None:
    """The identity says 16 MiB segments; a 1 MiB segment's file under a 16 MiB name (its own
    header says 1 MiB): exit 126."""
    (archive / name_of(4)).write_bytes(wal_segment(64, segment_size=1 << 20))
    done = restore(archive, name_of(4), str(pg_wal / "RECOVERYXLOG"))
    assert done.returncode == 126, done.stderr
    one_line(done.stderr, name_of(4))


def test_another_segments_wal_under_this_name_is_exit_126(archive: Path, pg_wal: Path) -> None:
    """Segment 5's bytes under segment 4's name: its page addresses are not this segment's."""
    (archive / name_of(4)).write_bytes(wal_segment(5))
    done = restore(archive, name_of(4), str(pg_wal / "RECOVERYXLOG"))
    assert done.returncode == 126, done.stderr
    one_line(done.stderr, name_of(4), format_lsn(4 * SEGMENT))


# -- item 5: --partial ---------------------------------------------------------------------------
def test_a_partial_of_random_bytes_is_exit_126(archive: Path, pg_wal: Path) -> None:
    """``--partial`` with only a .partial of random bytes: exit 126, not served."""
    (archive / (name_of(6) + ".partial")).write_bytes(os.urandom(SEGMENT))
    done = restore(archive, "--partial", name_of(6), str(pg_wal / "RECOVERYXLOG"))
    assert done.returncode == 126, done.stderr
    one_line(done.stderr, name_of(6) + ".partial", format_lsn(6 * SEGMENT))
    nothing_at(pg_wal / "RECOVERYXLOG")


def test_two_partials_holding_another_segments_wal_are_exit_126(archive: Path,
                                                                pg_wal: Path) -> None:
    """Two .partial forms that both hold segment 5's WAL under segment 6's name (they agree
    with each other, so neither is a conflict): exit 126, not served."""
    wal = wal_segment(5)[:300000]
    (archive / (name_of(6) + ".partial")).write_bytes(wal + bytes(SEGMENT - len(wal)))
    (archive / (name_of(6) + ".zst.partial")).write_bytes(
        zstandard.ZstdCompressor().compress(wal))
    done = restore(archive, "--partial", name_of(6), str(pg_wal / "RECOVERYXLOG"))
    assert done.returncode == 126, done.stderr
    one_line(done.stderr, name_of(6), format_lsn(6 * SEGMENT))
    nothing_at(pg_wal / "RECOVERYXLOG")


def test_a_partial_with_a_flipped_bit_is_exit_126(archive: Path, pg_wal: Path) -> None:
    """A .partial holding this segment's WAL with one bit flipped in a record: exit 126."""
    data = wal_segment(6)
    at = record_offsets(data)[10]
    wal = flipped(data[:at + 100000], at + 40)
    (archive / (name_of(6) + ".partial")).write_bytes(wal + bytes(SEGMENT - len(wal)))
    done = restore(archive, "--partial", name_of(6), str(pg_wal / "RECOVERYXLOG"))
    assert done.returncode == 126, done.stderr
    one_line(done.stderr, name_of(6), format_lsn(6 * SEGMENT + at))


def test_a_good_partial_is_served_padded(archive: Path, pg_wal: Path) -> None:
    """A .partial holding valid WAL, cut inside a record, then zeros: served, padded."""
    wal = wal_segment(6)[:600001]
    (archive / (name_of(6) + ".zst.partial")).write_bytes(
        zstandard.ZstdCompressor().compress(wal))
    done = restore(archive, "--partial", name_of(6), str(pg_wal / "RECOVERYXLOG"))
    assert done.returncode == 0, done.stderr
    assert (pg_wal / "RECOVERYXLOG").read_bytes() == wal + bytes(SEGMENT - len(wal))


# -- the filler: nothing unchecked goes into the spool -------------------------------------------
def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within 60 s"
        time.sleep(0.05)


def test_the_filler_does_not_spool_a_damaged_segment(archive: Path, pg_wal: Path) -> None:
    """With prefetch on, the filler fetches the segments after the one asked for: a damaged
    one is never spooled, and its call (which waits for the filler first) is exit 126 naming
    the file, not a rename of unchecked bytes from the spool."""
    data = wal_segment(4)
    (archive / name_of(4)).write_bytes(flipped(data, record_offsets(data)[5] + 50))
    target = pg_wal / "RECOVERYXLOG"
    assert restore(archive, name_of(3), str(target), prefetch=2).returncode == 0
    spool = Spool.beside(target, os.path.realpath(archive))
    wait_until(spool.busy, "the filler to start")
    done = restore(archive, name_of(4), str(target), prefetch=2)
    assert done.returncode == 126, done.stderr
    one_line(done.stderr, name_of(4), format_lsn(4 * SEGMENT + record_offsets(data)[5]))
    assert name_of(4) not in os.listdir(spool.dir)


# -- the one function, as every path (the uploader too) calls it ---------------------------------
@pytest.mark.usefixtures("scanner_path")
def test_checked_segment_passes_good_wal_and_names_the_file_and_lsn_of_bad() -> None:
    """checked_segment(bytes, name, identity) on both scanner paths: a good segment comes back
    checked; a flipped bit, another system's segment, another segment's bytes, random bytes
    as a .partial are DamagedSegment with the file and the LSN."""
    ours = ArchiveIdentity(str(SYSID), SEGMENT, 1)
    data = wal_segment(4)
    checked = checked_segment(data, name_of(4), ours)
    assert (checked.data, checked.system_identifier, checked.partial) == (data, SYSID, False)
    at = record_offsets(data)[7]
    cases = [
        (flipped(data, at + 24), False, 4 * SEGMENT + at),
        (wal_segment(4, system_identifier=SYSID + 1), False, 4 * SEGMENT),
        (wal_segment(5), False, 4 * SEGMENT),
        (os.urandom(SEGMENT // 2), True, 4 * SEGMENT),
    ]
    for bad, partial, lsn in cases:
        with pytest.raises(DamagedSegment) as caught:
            checked_segment(bad, name_of(4), ours, partial=partial, file="s3://b/p/x")
        assert (caught.value.file, caught.value.lsn) == ("s3://b/p/x", lsn), caught.value


@pytest.mark.usefixtures("scanner_path")
def test_without_an_identity_the_segment_size_is_the_rules() -> None:
    """An archive without an identity record: its segment size is what the one rule makes of
    its headers (1 MiB, a real server's), a segment checked at that size passes (the record
    crossing into the second is finished from its first pages when given), and a system
    identifier the caller has seen before is held to."""
    data = {path.name[:24]: zstandard.ZstdDecompressor().decompress(path.read_bytes())
            for path in sorted((Path(__file__).parent / "data" / "wal").glob("*.zst"))}
    (first, second) = data
    size = archive_segment_size(None, [(name, wal[:64]) for name, wal in data.items()])
    assert size == 1 << 20
    checked = checked_segment(data[first], first, None, segment_size=size,
                              following=lambda count: data[second][:count])
    assert checked.segment_size == size
    checked_segment(data[second], second, None, segment_size=size,
                    system_identifier=checked.system_identifier)
    with pytest.raises(DamagedSegment, match="database system"):
        checked_segment(data[second], second, None, segment_size=size, system_identifier=1)
    spoiled = bytearray(data[second])
    spoiled[60] ^= 1  # inside the piece of the record that began in the first segment
    with pytest.raises(DamagedSegment, match="crc"):
        checked_segment(data[first], first, None, segment_size=size,
                        following=lambda count: bytes(spoiled[:count]))


# -- a record that runs into the next segment -----------------------------------------------------
@pytest.mark.parametrize("where", ["its own tail", "the next segment's head"])
def test_a_record_running_into_the_next_segment_is_checked_when_that_segment_is_there(
        tmp_path: Path, pg_wal: Path, where: str) -> None:
    """The real pair's first segment ends inside a record (its last 40 bytes) that the second
    finishes (its first 120 after the long header): a bit flipped in that record, in either
    file, fails its CRC, and the first segment's call is exit 126 naming the first file (the
    record starts there). Without the second segment in the archive (the end of the archive,
    or a segment still being streamed) the first is served: its last record cannot be checked
    then, and PostgreSQL, which reads on, stops at the archive's end anyway."""
    data = {path.name[:24]: zstandard.ZstdDecompressor().decompress(path.read_bytes())
            for path in sorted((Path(__file__).parent / "data" / "wal").glob("*.zst"))}
    first, second = data
    archive = tmp_path / "archive"
    archive.mkdir()
    (archive / first).write_bytes(flipped(data[first], (1 << 20) - 10)
                                  if where == "its own tail" else data[first])
    (archive / (second + ".zst")).write_bytes(zstandard.ZstdCompressor().compress(
        flipped(data[second], 40 + 10) if where != "its own tail" else data[second]))
    done = restore(archive, first, str(pg_wal / "RECOVERYXLOG"))
    assert done.returncode == 126, done.stderr
    one_line(done.stderr, first, "crc")
    nothing_at(pg_wal / "RECOVERYXLOG")
    (archive / (second + ".zst")).unlink()
    done = restore(archive, first, str(pg_wal / "RECOVERYXLOG"))
    assert done.returncode == 0, done.stderr
