"""receivewal restore %f %p: the restore_command helper, alone and driving a real recovery."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.archives import SEGMENT, complete_files, decoded, partial_files
from support.postgres_user import install_for_postgres, readable_by_postgres
from support.servers import PgServer
from support.streams import lsn_to_int, start_receivewal, wait_for
from support.walgen import wal_segment

from receivewal.archive.compression import CompressSpec, new_compressor

NAME = "000000010000000000000003"


def restore(archive: Path, *args: str, env_dir: bool = False,
            ) -> subprocess.CompletedProcess[str]:
    """Run ``receivewal restore`` with the archive as -D or as RECEIVEWAL_DIRECTORY, one call
    alone (without prefetch: see test_restore_prefetch.py)."""
    env = {**os.environ, "RECEIVEWAL_PREFETCH": "0"}
    if env_dir:
        env["RECEIVEWAL_DIRECTORY"] = str(archive)
    argv = [sys.executable, "-m", "receivewal", "restore", *args]
    if not env_dir:
        argv[4:4] = ["-D", str(archive)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, check=False,
                          timeout=60)


def compressed(method: str, data: bytes, *, finish: bool = True) -> bytes:
    compressor = new_compressor(CompressSpec(method))
    body = compressor.begin() + compressor.compress(data) + compressor.flush()
    return body + (compressor.finish() if finish else b"")


@pytest.fixture
def segment() -> bytes:
    """A segment of valid WAL (restore checks what it serves)."""
    return wal_segment(3)


@pytest.mark.parametrize("suffix", ["", ".gz", ".lz4", ".zst"])
def test_restores_each_form_atomically(tmp_path: Path, segment: bytes, suffix: str) -> None:
    """Plain and compressed segments arrive at %p as the segment's bytes; nothing else is left
    in %p's directory."""
    archive, pg_wal = tmp_path / "archive", tmp_path / "pg_wal"
    archive.mkdir()
    pg_wal.mkdir()
    method = {"": "", ".gz": "gzip", ".lz4": "lz4", ".zst": "zstd"}[suffix]
    (archive / (NAME + suffix)).write_bytes(compressed(method, segment) if method else segment)
    done = restore(archive, NAME, str(pg_wal / "RECOVERYXLOG"), env_dir=suffix == ".zst")
    assert done.returncode == 0, done.stderr
    assert (pg_wal / "RECOVERYXLOG").read_bytes() == segment
    assert os.listdir(pg_wal) == ["RECOVERYXLOG"]


def test_history_file_and_absent_files(tmp_path: Path) -> None:
    """History files are served as they are; a file the archive lacks exits 1 and writes
    nothing (so recovery ends cleanly at the end of the archive)."""
    (tmp_path / "00000002.history").write_text("1\t0/3000000\tno recovery target specified\n")
    target = tmp_path / "RECOVERYHISTORY"
    assert restore(tmp_path, "00000002.history", str(target)).returncode == 0
    assert target.read_text().startswith("1\t0/3000000")
    for name in ("00000003.history", NAME):
        absent = restore(tmp_path, name, str(tmp_path / "X"))
        assert absent.returncode == 1
        assert "is not in the archive" in absent.stderr
        assert not (tmp_path / "X").exists()


def test_damaged_file_stops_recovery_instead_of_ending_it(tmp_path: Path,
                                                          segment: bytes) -> None:
    """A .zst that does not decode exits 126 (fatal to PostgreSQL), leaving %p alone."""
    body = compressed("zstd", segment)
    (tmp_path / (NAME + ".zst")).write_bytes(body[: len(body) // 2])
    done = restore(tmp_path, NAME, str(tmp_path / "RECOVERYXLOG"))
    assert done.returncode == 126
    assert "cannot restore" in done.stderr
    assert not (tmp_path / "RECOVERYXLOG").exists()
    assert [n for n in os.listdir(tmp_path) if "RECOVERYXLOG" in n] == []


def test_partial_only_when_asked_newest_first_padded(tmp_path: Path, segment: bytes) -> None:
    """--partial serves the newest .partial of the segment, zero-padded to a whole segment;
    without it, or when a complete file exists, the .partial is not used."""
    archive = tmp_path / "archive"
    archive.mkdir()
    older = archive / (NAME + ".partial")
    older.write_bytes(segment[:1000] + bytes(SEGMENT - 1000))  # preallocated plain .partial
    newer = archive / (NAME + ".lz4.partial")
    newer.write_bytes(compressed("lz4", segment[:300000], finish=False))
    os.utime(older, (1, 1))
    target = tmp_path / "RECOVERYXLOG"
    assert restore(archive, NAME, str(target)).returncode == 1
    done = restore(archive, "--partial", NAME, str(target))
    assert done.returncode == 0, done.stderr
    assert target.read_bytes() == segment[:300000] + bytes(SEGMENT - 300000)
    (archive / (NAME + ".gz")).write_bytes(compressed("gzip", segment))
    assert restore(archive, "--partial", NAME, str(target)).returncode == 0
    assert target.read_bytes() == segment


# -- a real recovery ---------------------------------------------------------------------------
@pytest.mark.server
def test_base_backup_recovers_to_the_last_received_byte_through_restore(
        pg: PgServer, archive_dir: Path, server_base: Path, tmp_path: Path) -> None:
    """A base backup with restore_command = receivewal restore --partial replays every
    segment of an archive written with -Z gzip, then lz4, then zstd, and the rows that only
    the last .partial holds: the restored server has exactly the primary's data."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    log = tmp_path / "receivewal.log"

    def stream(method: str) -> subprocess.Popen[bytes]:
        """Start streaming and wait until the server sees the receiver."""
        started = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                                   "-Z", method, "-s", "0.2", stderr_path=log)
        wait_for(lambda: pg.sql("SELECT count(*) FROM pg_stat_replication WHERE state = "
                                "'streaming'") == "1", what="streaming to start")
        return started

    def flushed() -> int:
        text = pg.sql("SELECT flush_lsn FROM pg_stat_replication")
        return lsn_to_int(text) if text else 0

    proc = stream("gzip")
    try:
        backup = pg.base_backup("restored")
        pg.sql("CREATE TABLE accounts (id int PRIMARY KEY, balance numeric)")
        for method, first in (("lz4", 1), ("zstd", 20001)):
            pg.sql(f"INSERT INTO accounts SELECT g, g * 1.5 FROM generate_series({first}, "
                   f"{first + 19999}) g")
            pg.generate_wal(1)
            switched = lsn_to_int(pg.current_lsn())
            # the segments so far are all this method's before the next one takes over (a
            # stop before then left them to the next one, and none to this method under load)
            wait_for(lambda: flushed() >= switched,  # noqa: B023 - called in this iteration
                     what="receivewal to flush through the switch")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, log.read_text()
            wait_for(lambda: pg.sql("SELECT count(*) FROM pg_stat_replication") == "0",
                     what="the walsender to go")
            proc = stream(method)
        pg.generate_wal(1)  # and complete segments from the last method too
        pg.sql("UPDATE accounts SET balance = balance + 1 WHERE id % 7 = 0")
        pg.sql("INSERT INTO accounts SELECT g, 0 FROM generate_series(40001, 41000) g")
        end = lsn_to_int(pg.current_lsn())
        wait_for(lambda: flushed() >= end, what="the last rows to be flushed by receivewal")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0, log.read_text()
    expected = pg.sql("SELECT count(*), sum(balance) FROM accounts")
    pg.stop("immediate")

    names = complete_files(archive_dir)
    assert {n[24:] for n in names} == {".gz", ".lz4", ".zst"}
    (partial,) = partial_files(archive_dir)
    assert partial.endswith(".zst.partial")
    assert len(decoded(archive_dir / partial, truncated_ok=True)) >= end % SEGMENT
    readable_by_postgres(archive_dir)
    command = install_for_postgres(server_base)
    try:
        backup.recover_from_archive(f"{command} -D {archive_dir} --partial %f %p")
        assert backup.sql("SELECT count(*), sum(balance) FROM accounts") == expected
        label = (backup.datadir / "backup_label.old").read_text()
        first_wal = label.split("(file ")[1][:24]  # START WAL LOCATION: X/X (file NAME)
        server_log = backup.logfile.read_text()
        needed = [n for n in [*names, partial] if n[:24] >= first_wal]
        assert len(needed) >= 3
        for name in needed:
            assert f'restored log file "{name[:24]}" from archive' in server_log, name
    finally:
        backup.stop("immediate")
