"""The prefetch spool's odd paths (issue 25, items 3, 11 and 12): a spool no live filler owns
is never served, a new filler starts from an empty spool, the spool records the system
identifier and the exact source it was filled from (a bucket's endpoint and profile
included), a symbolic link planted in the spool's path is never followed, and an archive
path that is not UTF-8 works with prefetch on. Real files and real filler processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.holders import holders_of
from support.walgen import SEGMENT, SYSID, name_of, wal_segment

from receivewal.archive import durable, location
from receivewal.restore import served, spoolfiles
from receivewal.restore.call import source_id
from receivewal.restore.filler import SPOOL_DIR, Spool

OTHER = SYSID + 1
IDENTITY = ".receivewal-archive.json"


def fill_archive(path: Path, sysid: int, segnos: range = range(3, 7)) -> None:
    """An archive of database system ``sysid``: segments ``segnos`` and its identity file."""
    path.mkdir(exist_ok=True)
    for name in os.listdir(path):
        (path / name).unlink()
    (path / IDENTITY).write_text(json.dumps({"system_identifier": str(sysid),
                                             "wal_segment_size": SEGMENT, "timeline": 1}))
    for segno in segnos:
        (path / name_of(segno)).write_bytes(wal_segment(segno, system_identifier=sysid))


def restore(archive: Path | bytes, name: str, target: Path, *, prefetch: int = 2,
            ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RECEIVEWAL_PREFETCH": str(prefetch), "RECEIVEWAL_PREFETCH_IDLE": "5"}
    directory = archive if isinstance(archive, bytes) else str(archive)
    return subprocess.run([sys.executable, "-m", "receivewal", "restore", "-D", directory,
                           name, str(target)], capture_output=True, text=True, check=False,
                          timeout=120, env=env)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within 60 s"
        time.sleep(0.05)


def kill_the_filler(pg_wal: Path) -> None:
    """SIGKILL the filler (the holder of the spool's lock) and wait until it is gone."""
    lock = pg_wal / SPOOL_DIR / ".lock"
    wait_until(lambda: bool(holders_of(lock)), "the filler holding the spool's lock")
    for pid in holders_of(lock):
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not holders_of(lock), "the killed filler to be gone")


# -- item 3 ----------------------------------------------------------------------------------------
def test_a_killed_fillers_spool_is_never_served_after_the_archive_changed(
        tmp_path: Path) -> None:
    """A filler spools segments 4 and 5 of cluster X's archive and is SIGKILLed; the archive
    at that path is then replaced by cluster Y's. The next calls get Y's segments: the spool
    no live filler owns is emptied, not served (before: X's segment 4 came from the spool,
    its first page header's timeline and address being all that was compared), and the new
    filler does not keep the killed one's segment 5 in its window."""
    archive = tmp_path / "archive"
    fill_archive(archive, SYSID)
    pg_wal = tmp_path / "pg_wal"
    pg_wal.mkdir()
    target = pg_wal / "RECOVERYXLOG"
    assert restore(archive, name_of(3), target).returncode == 0
    spool = Spool.beside(target, source_id(str(archive)))
    wait_until(lambda: {name_of(4), name_of(5)} <= set(os.listdir(spool.dir)),
               "the filler to spool segments 4 and 5")
    kill_the_filler(pg_wal)
    fill_archive(archive, OTHER)
    for segno in (4, 5):
        done = restore(archive, name_of(segno), target)
        assert done.returncode == 0, done.stderr
        assert target.read_bytes() == wal_segment(segno, system_identifier=OTHER), \
            f"segment {segno}: {done.stderr}"


def test_a_buckets_spool_is_named_by_its_endpoint_and_profile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two stores with the same s3://bucket/prefix (another endpoint, through
    AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, or another profile) have spools of their own."""
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    url = "s3://bucket/prefix"
    seen = {source_id(url)}
    for name, value in (("AWS_ENDPOINT_URL", "http://a:9000"),
                        ("AWS_ENDPOINT_URL_S3", "http://b:9000"), ("AWS_PROFILE", "other")):
        monkeypatch.setenv(name, value)
        seen.add(source_id(url))
    assert len(seen) == 4
    assert len({spoolfiles.spool_dir("/x/pg_wal/RECOVERYXLOG", s) for s in seen}) == 4


def test_the_spool_records_its_source_and_system_and_serves_nothing_else(
        tmp_path: Path) -> None:
    """The filler records the exact source and the system identifier of what it spools
    (``.source``): a call serves a spooled file only when both match it, with a live filler;
    a file of another system planted in the spool is removed, not served."""
    archive = tmp_path / "archive"
    fill_archive(archive, SYSID)
    pg_wal = tmp_path / "pg_wal"
    pg_wal.mkdir()
    target = pg_wal / "RECOVERYXLOG"
    assert restore(archive, name_of(3), target).returncode == 0
    source = source_id(str(archive))
    spool = Spool.beside(target, source)
    wait_until(lambda: name_of(5) in os.listdir(spool.dir), "the filler's window")
    assert spoolfiles.recorded_source(str(spool.dir)) == (str(SYSID), str(SEGMENT), source)
    planted = wal_segment(4, system_identifier=OTHER)
    (spool.dir / name_of(4)).write_bytes(planted)
    assert not served.take(str(spool.dir), name_of(4), str(target), source)
    assert not (spool.dir / name_of(4)).exists()
    assert not served.take(str(spool.dir), name_of(5), str(target), source + "/else")
    assert served.take(str(spool.dir), name_of(5), str(target), source)
    assert target.read_bytes() == wal_segment(5)


# -- item 11 ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", [".receivewal", ".receivewal/prefetch"])
def test_a_symlink_planted_in_the_spools_path_is_not_followed(tmp_path: Path,
                                                              where: str) -> None:
    """A symbolic link at pg_wal/.receivewal or pg_wal/.receivewal/prefetch pointing at a
    directory of precious files: the filler never prunes through it (before: everything in
    the target was deleted), and the calls still restore from the archive."""
    archive = tmp_path / "archive"
    fill_archive(archive, SYSID)
    pg_wal = tmp_path / "pg_wal"
    pg_wal.mkdir()
    victim = tmp_path / "victim"
    (victim / "prefetch").mkdir(parents=True)
    for path in (victim / "precious", victim / "prefetch" / "precious"):
        path.write_text("keep me")
    link = pg_wal / where
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(victim if where == ".receivewal" else victim / "prefetch")
    target = pg_wal / "RECOVERYXLOG"
    for segno in (3, 4, 5):
        done = restore(archive, name_of(segno), target)
        assert done.returncode == 0, done.stderr
        assert target.read_bytes() == wal_segment(segno)
    time.sleep(1.0)  # a filler, had one started, would have pruned by now
    assert sorted(str(p.relative_to(victim)) for p in victim.rglob("*")) == [
        "precious", "prefetch", "prefetch/precious"]
    assert link.is_symlink()


# -- item 12 ---------------------------------------------------------------------------------------
def test_an_archive_path_that_is_not_utf8_works_with_prefetch(tmp_path: Path) -> None:
    """-D naming a directory whose name is not valid UTF-8 (Latin-1 "\\xe9"), prefetch on:
    the segments restore (before: a traceback from the spool's digest, exit 1), the later
    ones from the spool."""
    raw = os.fsencode(tmp_path) + b"/archiv\xe9"
    archive = Path(os.fsdecode(raw))
    fill_archive(archive, SYSID)
    pg_wal = tmp_path / "pg_wal"
    pg_wal.mkdir()
    target = pg_wal / "RECOVERYXLOG"
    for segno in (3, 4):
        done = restore(raw, name_of(segno), target)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        assert target.read_bytes() == wal_segment(segno)
    assert "from the prefetch spool" in done.stderr


# -- issue 26, item 2 ------------------------------------------------------------------------------
def test_a_spool_record_is_never_written_through_a_file_at_its_temporary_name(
        tmp_path: Path) -> None:
    """A file already at a spool record's temporary name (a killed call's leftover, or a hard
    link planted there) is left alone: the record is written through a new file, created
    exclusively as every file receivewal writes (before: it was opened with O_TRUNC, and the
    planted link's other name was overwritten)."""
    spool = tmp_path / "spool"
    spool.mkdir()
    precious = tmp_path / "precious"
    precious.write_text("keep me")
    os.link(precious, spool / durable.temporary_name(".wanted"))
    spoolfiles.record_wanted(str(spool), name_of(4))
    assert precious.read_text() == "keep me"
    assert spoolfiles.wanted(str(spool)) == name_of(4)


# -- issue 31, item 10 -----------------------------------------------------------------------------
def spool_filled(tmp_path: Path) -> tuple[Path, Path, Spool]:
    """An archive of cluster SYSID, a call for segment 3 with prefetch on, and the live
    filler's spool holding segments 4 and 5."""
    archive = tmp_path / "archive"
    fill_archive(archive, SYSID, range(3, 8))
    pg_wal = tmp_path / "pg_wal"
    pg_wal.mkdir()
    target = pg_wal / "RECOVERYXLOG"
    assert restore(archive, name_of(3), target).returncode == 0
    spool = Spool.beside(target, source_id(str(archive)))
    wait_until(lambda: {name_of(4), name_of(5)} <= set(os.listdir(spool.dir)),
               "the filler to spool segments 4 and 5")
    return archive, target, spool


def swap_in(archive: Path, sysid: int) -> None:
    """Put another archive directory of cluster ``sysid`` at ``archive``'s path (rename)."""
    other = archive.with_name("incoming")
    fill_archive(other, sysid, range(3, 8))
    archive.rename(archive.with_name("old"))
    other.rename(archive)


def test_an_archive_swapped_for_another_clusters_under_a_live_filler_is_refused(
        tmp_path: Path) -> None:
    """The filler of cluster X's archive still lives with segments 4 and 5 spooled when the
    directory at that path is swapped for cluster Y's archive: the next calls exit 126 naming
    both systems, and nothing is written to %p (before: segment 4 came from the old spool,
    exit 0, and the later calls restored Y's WAL into X's recovery)."""
    assert location.IDENTITY_FILE == IDENTITY
    archive, target, _spool = spool_filled(tmp_path)
    before = target.read_bytes()
    swap_in(archive, OTHER)
    try:
        for segno in (4, 6):
            done = restore(archive, name_of(segno), target)
            assert done.returncode == 126, done.stderr
            assert f"now holds database system {OTHER}'s WAL" in done.stderr, done.stderr
            assert f"were system {SYSID}'s" in done.stderr, done.stderr
            assert "Traceback" not in done.stderr
            assert target.read_bytes() == before
    finally:
        kill_the_filler(target.parent)


def test_the_same_clusters_archive_put_back_at_the_path_is_still_served(
        tmp_path: Path) -> None:
    """A copy of the same cluster's archive put at the path (another directory, another
    identity file, the same system) is not a mismatch: the spooled segment is served."""
    archive, target, _spool = spool_filled(tmp_path)
    swap_in(archive, SYSID)
    try:
        done = restore(archive, name_of(4), target)
        assert done.returncode == 0, done.stderr
        assert "from the prefetch spool" in done.stderr
        assert target.read_bytes() == wal_segment(4)
    finally:
        kill_the_filler(target.parent)
