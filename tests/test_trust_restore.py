"""``receivewal restore`` on hostile and damaged archives: it never ends recovery early by
mistake (exit 1 only when the archive lacks the file), never leaves a file at %p unless it
restored one, keeps memory bounded, and never writes through a symlink."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.archives import SEGMENT, zstd_bomb
from support.memory import PEAK_RSS_KB
from support.walgen import wal_segment

from receivewal.archive.durable import temporary_name
from receivewal.commands.cli import main

NAME = "000000010000000000000003"
IDENTITY = ".receivewal-archive.json"
NO_TRACEBACK = "Traceback"


def restore(archive: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "receivewal", "restore", "-D", str(archive), *args]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)


def peak_rss_kb(archive: Path, *args: str) -> tuple[int, str, int]:
    """Exit code, stderr and peak RSS (kB) of a restore run in a child that reports its own."""
    code = ("import sys\n"
            "from receivewal.commands.cli import main\n"
            "rc = main(sys.argv[1:])\n"
            f"print('RSS', {PEAK_RSS_KB}, file=sys.stderr)\n"
            "sys.exit(rc)\n")
    done = subprocess.run([sys.executable, "-c", code, "restore", "-D", str(archive), *args],
                          capture_output=True, text=True, check=False, timeout=300)
    lines = done.stderr.splitlines()
    rss = int(lines[-1].split()[1])
    return done.returncode, "\n".join(lines[:-1]), rss


def assert_one_line_error(stderr: str, *words: str) -> None:
    assert NO_TRACEBACK not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    for word in words:
        assert word in lines[0], stderr


def assert_nothing_at(target: Path) -> None:
    """Neither %p nor a temporary file next to it."""
    assert not target.exists()
    assert [n for n in os.listdir(target.parent) if target.name in n] == []






# -- memory and size: anything bigger than a segment is damaged ------------------------------
def test_oversize_plain_file_is_damaged(dirs: tuple[Path, Path]) -> None:
    """A plain file named like a segment but larger than a segment (here sparse, 1.5 GB)
    exits 126 naming the file, with nothing left at %p and memory bounded."""
    archive, pg_wal = dirs
    with (archive / NAME).open("wb") as fh:
        fh.truncate(1536 << 20)
    target = pg_wal / "RECOVERYXLOG"
    code, err, rss = peak_rss_kb(archive, NAME, str(target))
    assert code == 126, err
    assert_one_line_error(err, NAME)
    assert_nothing_at(target)
    assert rss < 200_000, f"peak RSS {rss} kB"


def test_zstd_bomb_is_damaged_with_bounded_memory(dirs: tuple[Path, Path]) -> None:
    """A small .zst that decodes to 4 GiB of zeros: exit 126 naming it, memory bounded."""
    archive, pg_wal = dirs
    bomb = archive / (NAME + ".zst")
    zstd_bomb(bomb, 4 << 30)
    assert bomb.stat().st_size < 1 << 20
    target = pg_wal / "RECOVERYXLOG"
    code, err, rss = peak_rss_kb(archive, NAME, str(target))
    assert code == 126, err
    assert_one_line_error(err, NAME + ".zst")
    assert_nothing_at(target)
    assert rss < 200_000, f"peak RSS {rss} kB"


def test_short_complete_segment_is_damaged(dirs: tuple[Path, Path]) -> None:
    """A complete segment file smaller than a segment is damaged, not served short."""
    archive, pg_wal = dirs
    (archive / NAME).write_bytes(bytes(8192))
    done = restore(archive, NAME, str(pg_wal / "RECOVERYXLOG"))
    assert done.returncode == 126
    assert_one_line_error(done.stderr, NAME)
    assert_nothing_at(pg_wal / "RECOVERYXLOG")


# -- the identity file when serving a .partial -------------------------------------------------
@pytest.mark.parametrize("identity", [
    "{not json",
    "[" * 100_000 + "]" * 100_000,
    json.dumps({"system_identifier": "1", "wal_segment_size": -5, "timeline": 1}),
    json.dumps({"system_identifier": "1", "wal_segment_size": 1 << 40, "timeline": 1}),
    json.dumps({"system_identifier": "1", "wal_segment_size": 3 << 20, "timeline": 1}),
    json.dumps({"system_identifier": "1", "wal_segment_size": 1e999, "timeline": 1}),
    json.dumps({"system_identifier": "1", "wal_segment_size": SEGMENT, "timeline": 0}),
    json.dumps({"wal_segment_size": SEGMENT}),
], ids=["syntax", "nested", "minus5", "1TiB", "not-power-of-two", "infinite", "timeline0",
        "missing-keys"])
def test_damaged_identity_file_stops_recovery(dirs: tuple[Path, Path], identity: str) -> None:
    """With --partial, an identity file that cannot be trusted exits 126 with one line naming
    it; nothing is written at %p."""
    archive, pg_wal = dirs
    (archive / IDENTITY).write_text(identity)
    (archive / (NAME + ".partial")).write_bytes(bytes(range(256)) * 64)
    target = pg_wal / "RECOVERYXLOG"
    done = restore(archive, "--partial", NAME, str(target))
    assert done.returncode == 126, done.stderr
    assert_one_line_error(done.stderr, IDENTITY)
    assert_nothing_at(target)


# -- arguments and the archive directory --------------------------------------------------------
@pytest.mark.parametrize(("name", "target"), [
    (NAME, ""), ("", "RECOVERYXLOG"), ("RECOVERYXLOG", "RECOVERYXLOG"), (NAME + "\n", "X"),
], ids=["empty-target", "empty-name", "bad-name", "newline-name"])
def test_bad_arguments_are_one_line_errors_not_absent_files(
        dirs: tuple[Path, Path], name: str, target: str) -> None:
    """A misconfigured restore_command must not read as "not in the archive" (exit 1), which
    would end recovery: one line, exit 126."""
    archive, pg_wal = dirs
    (archive / NAME).write_bytes(bytes(SEGMENT))
    done = subprocess.run([sys.executable, "-m", "receivewal", "restore", "-D", str(archive),
                           name, target], capture_output=True, text=True, check=False,
                          cwd=pg_wal, timeout=60)
    assert done.returncode == 126, done.stderr
    assert_one_line_error(done.stderr)
    assert os.listdir(pg_wal) == []


def test_missing_archive_directory_is_not_an_absent_file(tmp_path: Path) -> None:
    """An archive directory that is gone (unmounted, mistyped) stops recovery: exit 126."""
    done = restore(tmp_path / "nowhere", NAME, str(tmp_path / "RECOVERYXLOG"))
    assert done.returncode == 126
    assert_one_line_error(done.stderr, "nowhere")


def test_dangling_symlink_segment_is_damaged(dirs: tuple[Path, Path]) -> None:
    """A dangling symlink where the segment should be is damage, not absence."""
    archive, pg_wal = dirs
    (archive / NAME).symlink_to(archive / "gone")
    done = restore(archive, NAME, str(pg_wal / "RECOVERYXLOG"))
    assert done.returncode == 126
    assert_one_line_error(done.stderr, NAME)


def test_absent_file_is_still_exit_1(dirs: tuple[Path, Path]) -> None:
    archive, pg_wal = dirs
    done = restore(archive, NAME, str(pg_wal / "RECOVERYXLOG"))
    assert done.returncode == 1
    assert_one_line_error(done.stderr, "not in the archive")


# -- symlinks and the temporary file ----------------------------------------------------------
def test_planted_symlink_at_temp_name_is_not_written_through(
        dirs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """A symlink planted where the temporary file would be created is neither followed nor
    removed; the segment still arrives at %p."""
    archive, pg_wal = dirs
    segment = wal_segment(3)
    (archive / NAME).write_bytes(segment)
    victim = archive / "victim"
    victim.write_bytes(b"keep me")
    planted = pg_wal / temporary_name("RECOVERYXLOG")
    planted.symlink_to(victim)
    assert main(["restore", "-D", str(archive), NAME, str(pg_wal / "RECOVERYXLOG")]) == 0
    assert victim.read_bytes() == b"keep me"
    assert planted.is_symlink()
    assert (pg_wal / "RECOVERYXLOG").read_bytes() == segment
    assert sorted(os.listdir(pg_wal)) == sorted(["RECOVERYXLOG", planted.name])


def test_symlink_at_target_is_replaced_not_followed(dirs: tuple[Path, Path]) -> None:
    archive, pg_wal = dirs
    segment = wal_segment(3)
    (archive / NAME).write_bytes(segment)
    victim = archive / "victim"
    victim.write_bytes(b"keep me")
    (pg_wal / "RECOVERYXLOG").symlink_to(victim)
    done = restore(archive, NAME, str(pg_wal / "RECOVERYXLOG"))
    assert done.returncode == 0, done.stderr
    assert victim.read_bytes() == b"keep me"
    assert not (pg_wal / "RECOVERYXLOG").is_symlink()
    assert (pg_wal / "RECOVERYXLOG").read_bytes() == segment


def test_temp_file_is_fsynced_before_the_rename(dirs: tuple[Path, Path],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary file's data is durable before it takes %p's name."""
    archive, pg_wal = dirs
    (archive / NAME).write_bytes(wal_segment(3))
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync-dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync-file")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    assert main(["restore", "-D", str(archive), NAME, str(pg_wal / "RECOVERYXLOG")]) == 0
    assert events == ["fsync-file", "replace", "fsync-dir"]


STALLED_RESTORE = (
    "import signal, sys\n"
    "from receivewal.restore import writing as restore\n"
    "from receivewal.commands.cli import main\n"
    "def stalled(out, data, size):\n"
    "    out.write(bytes(8192))\n"
    "    out.flush()\n"
    "    print('stalled', file=sys.stderr, flush=True)\n"
    "    signal.pause()\n"
    "restore._write_padded = stalled\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def test_sigterm_removes_the_temporary_file(dirs: tuple[Path, Path]) -> None:
    """SIGTERM in the middle of a restore (the copy is held, by a hook in the child, after the
    temporary file got its first chunk) leaves no temporary file and no %p, and the helper
    dies of the signal as PostgreSQL expects."""
    archive, pg_wal = dirs
    (archive / NAME).write_bytes(wal_segment(3))
    target = pg_wal / "RECOVERYXLOG"
    argv = [sys.executable, "-c", STALLED_RESTORE, "restore", "-D", str(archive), NAME,
            str(target)]
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stderr is not None
        assert proc.stderr.readline() == "stalled\n"
        assert len(os.listdir(pg_wal)) == 1  # the temporary file, not %p
        assert not target.exists()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGTERM
    assert os.listdir(pg_wal) == []
