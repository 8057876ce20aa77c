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
from support.postgres_user import install_for_postgres, readable_by_postgres
from support.recovery import backup_then_rows, complete_segments
from support.servers import PgServer
from support.walgen import wal_segment

from receivewal.archive.compression import CompressSpec, new_compressor
from receivewal.restore.filler import Spool

FORMS = {"": None, ".gz": "gzip", ".lz4": "lz4", ".zst": "zstd"}


def name_of(segno: int) -> str:
    return f"0000000100000000{segno:08X}"


def segment(segno: int) -> bytes:
    """Segment ``segno`` of timeline 1: valid WAL of its own."""
    return wal_segment(segno)


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
    for i, path in enumerate(complete_segments(pg)):
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


def test_at_the_archives_end_the_last_segment_is_spooled_again(tmp_path: Path) -> None:
    """When the archive lacks the segment after the last one asked for (recovery is at its
    end), the filler fetches that last segment again once its call has taken it: PostgreSQL
    reads it once more when redo is done, and that call is a rename from the spool too, with
    the archive's bytes; the segment after it is still exit 1."""
    archive = tmp_path / "archive"
    archive.mkdir()
    segments = {segno: segment(segno) for segno in range(3, 6)}
    for segno, data in segments.items():
        (archive / (name_of(segno) + ".zst")).write_bytes(stored(data, "zstd"))
    target = tmp_path / "pg_wal" / "RECOVERYXLOG"
    target.parent.mkdir()
    env = {**os.environ, "RECEIVEWAL_PREFETCH_IDLE": "5"}
    spool = Spool.beside(target, os.path.realpath(archive))

    def call(segno: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "receivewal", "restore", "-D",
                               str(archive), name_of(segno), str(target)],
                              capture_output=True, text=True, check=False, timeout=60, env=env)

    for segno in (3, 4, 5):
        if segno > 3:
            wait_until((spool.dir / name_of(segno)).exists, "the filler to spool the segment")
        assert call(segno).returncode == 0
    wait_until((spool.dir / name_of(5)).exists, "the last segment spooled again")
    assert call(6).returncode == 1
    done = call(5)
    assert (done.returncode, "from the prefetch spool" in done.stderr) == (0, True), done.stderr
    assert target.read_bytes() == segments[5]


def test_a_recoverys_first_call_has_the_filler_fetch_the_backups_first_segment(
        tmp_path: Path) -> None:
    """The first call of a recovery from a base backup (the next timeline's history file,
    which the archive lacks) starts the filler, which fetches the segment the backup label
    starts at and the window after it: the first segment's call is a rename from the spool,
    with the archive's bytes, and so is the next."""
    archive = tmp_path / "archive"
    archive.mkdir()
    segments = {segno: segment(segno) for segno in range(3, 6)}
    for segno, data in segments.items():
        (archive / (name_of(segno) + ".zst")).write_bytes(stored(data, "zstd"))
    data_dir = tmp_path / "data"
    (data_dir / "pg_wal").mkdir(parents=True)
    (data_dir / "recovery.signal").touch()
    (data_dir / "backup_label").write_text(
        f"START WAL LOCATION: 0/3000028 (file {name_of(3)})\nCHECKPOINT LOCATION: 0/3000060\n")
    spool = Spool.beside(data_dir / "pg_wal" / "RECOVERYXLOG", os.path.realpath(archive))

    def call(name: str, target: str) -> subprocess.CompletedProcess[str]:
        return call_from(data_dir, archive, name, target)

    assert call("00000002.history", "RECOVERYHISTORY").returncode == 1
    assert spool.busy()
    for segno in (3, 4):
        wait_until((spool.dir / name_of(segno)).exists, "the filler to spool the segment")
        done = call(name_of(segno), "RECOVERYXLOG")
        assert (done.returncode, "from the prefetch spool" in done.stderr) == (0, True), \
            done.stderr
        assert (data_dir / "pg_wal" / "RECOVERYXLOG").read_bytes() == segments[segno]
    (data_dir / "recovery.signal").unlink()
    wait_until(lambda: not spool.busy(), "the filler to exit after recovery")


def call_from(data_dir: Path, archive: Path, name: str,
              target: str) -> subprocess.CompletedProcess[str]:
    """A restore call as PostgreSQL makes it: from the data directory, to ``pg_wal/TARGET``."""
    return subprocess.run([sys.executable, "-m", "receivewal", "restore", "-D", str(archive),
                           name, f"pg_wal/{target}"], capture_output=True, text=True,
                          check=False, timeout=60, cwd=data_dir)


def test_a_filler_started_without_a_backup_label_still_prefetches(tmp_path: Path) -> None:
    """A recovery without a backup label (a standby restarted, say) starts its filler at the
    first call too; the first segment's call restores it itself, and the filler, which did
    not know the segment size, learns it from that segment and spools the ones after it."""
    archive = tmp_path / "archive"
    archive.mkdir()
    segments = {segno: segment(segno) for segno in range(3, 6)}
    for segno, data in segments.items():
        (archive / name_of(segno)).write_bytes(data)
    data_dir = tmp_path / "data"
    (data_dir / "pg_wal").mkdir(parents=True)
    (data_dir / "standby.signal").touch()
    spool = Spool.beside(data_dir / "pg_wal" / "RECOVERYXLOG", os.path.realpath(archive))

    def call(name: str, target: str) -> subprocess.CompletedProcess[str]:
        return call_from(data_dir, archive, name, target)

    assert call("00000002.history", "RECOVERYHISTORY").returncode == 1
    assert spool.busy()
    assert call(name_of(3), "RECOVERYXLOG").returncode == 0
    wait_until((spool.dir / name_of(4)).exists, "the filler to spool the next segment")
    done = call(name_of(4), "RECOVERYXLOG")
    assert (done.returncode, "from the prefetch spool" in done.stderr) == (0, True), done.stderr
    assert (data_dir / "pg_wal" / "RECOVERYXLOG").read_bytes() == segments[4]
    (data_dir / "standby.signal").unlink()
    wait_until(lambda: not spool.busy(), "the filler to exit after recovery")
