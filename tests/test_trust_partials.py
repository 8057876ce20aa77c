"""A segment's ``.partial`` files in several forms (issue 18 item 1): the daemon leaves one, the
one holding the most WAL, and restore and verify choose by the valid WAL each holds, never by
mtime; two forms that hold different WAL are damage naming both files.

The real-server case is the issue's: a plain archive streamed until a segment's ``.partial``
holds 8 MiB, then the same directory streamed with ``-Z zstd`` and stopped after 1 MiB of the
same segment. The file-level cases use the committed 1 MiB segment pair in ``tests/data/wal``.
"""

from __future__ import annotations

import gzip
import itertools
import os
import shutil
import struct
from pathlib import Path

import crc32c
import pytest
import zstandard
from support.archives import SEGMENT, decoded, partial_files
from support.scanner import scan_segment
from support.servers import PgServer, read_segment
from support.streams import lsn_to_int, receivewal, start_receivewal, stop, wait_for
from test_restore import restore
from test_verify_truth import NAMES, SEG, fixture_bytes

from receivewal.archive.compression import CompressSpec
from receivewal.archive.directory import Archive
from receivewal.archive.partials import settle_partials
from receivewal.check.verify import verify_archive
from receivewal.errors import ArchiveError
from receivewal.wal.lsn import format_lsn
from receivewal.wal.names import wal_file_name
from receivewal.wal.pageheader import XLOG_BLCKSZ

MIB = 1 << 20
NAME = NAMES[0]


def zst_partial(data: bytes) -> bytes:
    """``data`` as a -Z zstd .partial leaves it: a flushed frame that is not finished."""
    compressor = zstandard.ZstdCompressor().compressobj()
    return compressor.compress(data) + compressor.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)


def padded(data: bytes, size: int) -> bytes:
    """``data`` as a preallocated plain .partial holds it: zeros to the segment size."""
    return data + bytes(size - len(data))


def upto_record(data: bytes, near: int) -> bytes:
    """``data`` cut where the last record starting at or before ``near`` starts: what the
    server has flushed when the record before it was committed."""
    scan = scan_segment(data, NAME, SEG, collect=True)
    return data[:max(lsn % SEG for lsn in scan.record_lsns if lsn % SEG <= near)]


def rewritten_record(data: bytes, before: int) -> tuple[bytes, range]:
    """``data`` with one record before offset ``before`` changed and its CRC made right again:
    other WAL that is just as valid. Returns it and the offsets the record spans."""
    scan = scan_segment(data, NAME, SEG, collect=True)
    starts = [lsn % SEG for lsn in scan.record_lsns]
    for pos, nxt in itertools.pairwise(starts[1:]):
        tot_len = struct.unpack_from("<I", data, pos)[0]
        if pos + tot_len <= min(before, (pos | (XLOG_BLCKSZ - 1)) + 1, nxt):
            break
    else:
        raise AssertionError("no record to rewrite")
    buf = bytearray(data)
    buf[pos + tot_len - 1] ^= 0x01
    crc = crc32c.crc32c(bytes(buf[pos:pos + 20]), crc32c.crc32c(bytes(buf[pos + 24:pos + tot_len])))
    struct.pack_into("<I", buf, pos + 20, crc)
    return bytes(buf), range(pos, pos + tot_len)


# -- restore and verify choose the longest valid WAL ---------------------------------------------
def test_restore_and_verify_choose_the_longest_valid_wal_not_the_newest(tmp_path: Path) -> None:
    """A plain .partial with 600 kB of WAL and a newer .zst.partial with 100 kB of the same
    WAL: restore --partial serves the plain one, verify checks it, and both are trusted."""
    wal = fixture_bytes(NAME)
    archive = tmp_path / "archive"
    archive.mkdir()
    plain = archive / f"{NAME}.partial"
    plain.write_bytes(padded(upto_record(wal, 600_000), SEG))
    os.utime(plain, (1, 1))
    (archive / f"{NAME}.zst.partial").write_bytes(zst_partial(upto_record(wal, 100_000)))
    target = tmp_path / "RECOVERYXLOG"
    done = restore(archive, "--partial", NAME, str(target))
    assert done.returncode == 0, done.stderr
    assert target.read_bytes() == padded(upto_record(wal, 600_000), SEG)
    assert f'from "{NAME}.partial"' in done.stderr
    report, _ = verify_archive(archive, jobs=1)
    assert [s.file for s in report.scans] == [f"{NAME}.partial"]
    assert report.recovery is not None
    assert report.recovery.end_lsn - report.scans[0].start_lsn > 500_000
    assert report.recoverable, [p.describe() for p in report.problems]


def test_partials_holding_different_wal_stop_restore_and_fail_verify(tmp_path: Path) -> None:
    """Two .partial forms whose WAL differs where both hold some (one record rewritten with a
    right CRC): restore exits 126 naming both files and leaves nothing at %p; verify reports
    partial_conflict at the differing byte, NOT recoverable."""
    wal = fixture_bytes(NAME)
    other, changed = rewritten_record(wal, 300_000)
    archive = tmp_path / "archive"
    archive.mkdir()
    shorter = upto_record(other, 300_000)
    (archive / f"{NAME}.partial").write_bytes(padded(upto_record(wal, 600_000), SEG))
    (archive / f"{NAME}.zst.partial").write_bytes(zst_partial(shorter))
    assert scan_segment(padded(shorter, SEG), NAME, SEG, partial=True).problems == ()
    target = tmp_path / "RECOVERYXLOG"
    done = restore(archive, "--partial", NAME, str(target))
    assert done.returncode == 126
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"{NAME}.partial" in done.stderr
    assert f"{NAME}.zst.partial" in done.stderr
    assert not target.exists()
    report, _ = verify_archive(archive, jobs=1)
    (conflict,) = [p for p in report.problems if p.kind == "partial_conflict"]
    assert {conflict.file, *conflict.detail.split()} >= {f"{NAME}.partial", f"{NAME}.zst.partial"}
    assert conflict.lsn - report.scans[0].start_lsn in changed  # its CRC differs first
    assert conflict.severity == "error"
    assert not report.recoverable


# -- the daemon: a method change keeps the WAL that was durable ---------------------------------
def test_start_up_converts_the_longest_partial_to_the_form_it_writes(tmp_path: Path) -> None:
    """Start-up with -Z zstd over a plain .partial (600 kB of WAL) and a .gz.partial (100 kB):
    one .zst.partial is left and it decodes to the 600 kB; the others are gone."""
    wal = fixture_bytes(NAME)
    longer = upto_record(wal, 600_000)
    (tmp_path / f"{NAME}.partial").write_bytes(padded(longer, SEG))
    (tmp_path / f"{NAME}.gz.partial").write_bytes(gzip.compress(upto_record(wal, 100_000)))
    archive = Archive(tmp_path)
    files = archive.segment_names(SEG)
    done = settle_partials(archive, SEG, files, CompressSpec("zstd"), max(files))
    assert len(done) == 3, done
    assert sorted(os.listdir(tmp_path)) == [f"{NAME}.zst.partial"]
    assert decoded(tmp_path / f"{NAME}.zst.partial", truncated_ok=True) == longer


def test_start_up_refuses_partials_holding_different_wal(tmp_path: Path) -> None:
    """Two forms that disagree where both hold WAL: start-up stops with one line naming both,
    and removes nothing."""
    wal = fixture_bytes(NAME)
    other, _ = rewritten_record(wal, 300_000)
    (tmp_path / f"{NAME}.partial").write_bytes(padded(upto_record(wal, 600_000), SEG))
    (tmp_path / f"{NAME}.zst.partial").write_bytes(zst_partial(upto_record(other, 300_000)))
    archive = Archive(tmp_path)
    files = archive.segment_names(SEG)
    with pytest.raises(ArchiveError) as failed:
        settle_partials(archive, SEG, files, CompressSpec("zstd"), max(files))
    assert f"{NAME}.partial" in str(failed.value)
    assert f"{NAME}.zst.partial" in str(failed.value)
    assert len(os.listdir(tmp_path)) == 2


def flushed_by_receiver(pg: PgServer) -> int:
    """The flush position receivewal reported to the server (0 when not connected)."""
    text = pg.sql("SELECT flush_lsn FROM pg_stat_replication")
    return lsn_to_int(text) if text else 0


@pytest.mark.shared_server
@pytest.mark.server
def test_method_change_keeps_the_longer_partial_and_restore_serves_it(
        pg: PgServer, archive_dir: Path, tmp_path: Path) -> None:
    """Plain streaming until a segment's .partial holds 8 MiB, stop; -Z zstd on the same
    directory stopped 1 MiB into that segment: one .partial is left and it holds all 8 MiB;
    restore --partial serves them and verify reaches them. With the plain .partial and a newer
    1 MiB .zst.partial of that WAL side by side, restore and verify still take the 8 MiB."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    pg.switch_wal()
    log = tmp_path / "receivewal.log"
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                            "-s", "0.2", stderr_path=log)
    try:
        for _ in range(9):
            pg.sql("SELECT pg_logical_emit_message(true, 'trust', repeat('x', 1000000))")
        end = lsn_to_int(pg.current_lsn())
        wait_for(lambda: flushed_by_receiver(pg) >= end, what="receivewal to flush 8 MiB")
    finally:
        assert stop(proc) == 0, log.read_text()
    segno = end // SEGMENT
    name = wal_file_name(1, segno, SEGMENT)
    assert end % SEGMENT >= 8 * MIB
    assert partial_files(archive_dir) == [f"{name}.partial"]
    two = tmp_path / "two"  # the state the issue found, for restore and verify
    two.mkdir()
    shutil.copy(archive_dir / f"{name}.partial", two / f"{name}.partial")
    os.utime(two / f"{name}.partial", (1, 1))
    server_wal = read_segment(pg, name)
    (two / f"{name}.zst.partial").write_bytes(zst_partial(server_wal[:MIB]))

    stop_at = segno * SEGMENT + MIB
    again = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                       "-Z", "zstd", "-E", format_lsn(stop_at), "-n")
    assert again.returncode == 0, again.stderr
    assert partial_files(archive_dir) == [f"{name}.zst.partial"]
    held = decoded(archive_dir / f"{name}.zst.partial", truncated_ok=True)
    assert len(held) >= end % SEGMENT
    assert held == server_wal[:len(held)]

    for directory in (archive_dir, two):
        target = tmp_path / f"RESTORED-{directory.name}"
        done = restore(directory, "--partial", name, str(target))
        assert done.returncode == 0, done.stderr
        assert target.read_bytes()[:end % SEGMENT] == server_wal[:end % SEGMENT]
        report, _ = verify_archive(directory, jobs=1)
        assert report.recovery is not None
        assert report.recovery.end_lsn >= end, (directory, report.recovery)
