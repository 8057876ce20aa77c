"""Prefetch from a local archive: the filler decodes compressed segments ahead of recovery, so
a call is a rename; the segments it serves are the archive's bytes, and it leaves nothing
behind after promotion."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.archives import SEGMENT, proven_segment
from support.postgres_user import install_for_postgres, readable_by_postgres
from support.recovery import backup_then_rows
from support.servers import PgServer

from receivewal.archive.compression import CompressSpec, new_compressor
from receivewal.archive.spool import Spool

FORMS = {"": None, ".gz": "gzip", ".lz4": "lz4", ".zst": "zstd"}


def name_of(segno: int) -> str:
    return f"0000000100000000{segno:08X}"


def segment(segno: int) -> bytes:
    """Segment ``segno`` of timeline 1: a proving first page, then bytes of its own."""
    head = proven_segment(segno)[:8192]
    return (head + os.urandom(1 << 16) * (SEGMENT >> 16))[:SEGMENT]


def stored(data: bytes, method: str | None) -> bytes:
    if method is None:
        return data
    compressor = new_compressor(CompressSpec(method))
    return compressor.begin() + compressor.compress(data) + compressor.flush() + \
        compressor.finish()


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within 60 s"
        time.sleep(0.05)


@pytest.mark.parametrize("suffix", list(FORMS))
def test_prefetch_from_a_local_archive_serves_the_archives_bytes(tmp_path: Path,
                                                                 suffix: str) -> None:
    """With the default prefetch, calls for the segments after the first are served from the
    spool (decoded ahead by the filler), byte for byte what the archive holds."""
    archive = tmp_path / "archive"
    archive.mkdir()
    segments = {segno: segment(segno) for segno in range(3, 8)}
    for segno, data in segments.items():
        (archive / (name_of(segno) + suffix)).write_bytes(stored(data, FORMS[suffix]))
    target = tmp_path / "pg_wal" / "RECOVERYXLOG"
    target.parent.mkdir()
    env = {**os.environ, "RECEIVEWAL_PREFETCH_IDLE": "5"}
    spool = Spool.beside(target, os.path.realpath(archive))
    for segno, data in segments.items():
        if segno > 3:
            wait_until((spool.dir / name_of(segno)).exists, "the filler to spool the segment")
        done = subprocess.run([sys.executable, "-m", "receivewal", "restore", "-D",
                               str(archive), name_of(segno), str(target)],
                              capture_output=True, text=True, check=False, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        assert ("from the prefetch spool" in done.stderr) == (segno > 3), done.stderr
        assert target.read_bytes() == data


@pytest.mark.server
def test_point_in_time_recovery_from_a_compressed_local_archive_with_prefetch(
        pg: PgServer, archive_dir: Path, server_base: Path) -> None:
    """A base backup recovers from a local archive of zstd and lz4 files with the default
    prefetch: the recovered server has the primary's rows, later segments come from the
    spool, and at promotion the filler empties its spool and exits (long before its idle
    limit)."""
    backup, expected = backup_then_rows(pg, "prefetched", segments=4)
    wal = pg.datadir / "pg_wal"
    for i, path in enumerate(sorted(p for p in wal.iterdir() if len(p.name) == 24)):
        method = ("zstd", "lz4")[i % 2]
        suffix = {"zstd": ".zst", "lz4": ".lz4"}[method]
        (archive_dir / (path.name + suffix)).write_bytes(stored(path.read_bytes(), method))
    readable_by_postgres(archive_dir)
    command = install_for_postgres(server_base)
    try:
        backup.recover_from_archive(
            f"RECEIVEWAL_PREFETCH_IDLE=600 {command} -D {archive_dir} %f %p")
        assert backup.sql("SELECT count(*), sum(id) FROM t") == expected
        assert "from the prefetch spool" in backup.logfile.read_text()
        spool = Spool.beside(backup.datadir / "pg_wal" / "RECOVERYXLOG",
                             os.path.realpath(archive_dir))
        wait_until(lambda: not spool.busy(), "the filler to exit after promotion")
        assert [n for n in os.listdir(spool.dir) if not n.startswith(".")] == []
    finally:
        backup.stop("immediate")
