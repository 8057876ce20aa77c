"""A hole in the archive is never its end (issue 32, item 3): a segment missing while the
archive holds later WAL of its timeline (complete in any form, or a ``.partial``) is exit 126
with one line naming it and the next segment held, so that PostgreSQL stops recovery there
instead of promoting and losing every transaction after the hole. The archive's true end, a
history file asked for at the end of recovery, and the end of a timeline forked from one the
archive holds further are still exit 1. Against a directory and a real S3 server
(SeaweedFS); the ``recover`` side is in tests/test_recover_config.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from support.bucketcalls import new_prefix, put
from support.bucketcalls import restore as bucket_restore
from support.seaweed import SeaweedS3
from support.walgen import SYSID, name_of, wal_segment

IDENTITY = ".receivewal-archive.json"
HISTORY_2 = "1\t0/5000000\tno recovery target specified\n"  # timeline 2 forks in segment 5
#: (file name, body) of the archive: timeline 1 segments 3, 4, 6 (zstd-named) and 7 (5 is
#: missing, 8 is the end); timeline 2 (forked in 5) holds 5 and 6 only, timeline 1 going on
#: past its end as it does after a PITR fork.
HOLE = 5


def files(later: str) -> list[tuple[str, bytes]]:
    """The archive's files; ``later``: how the segment after the hole is held."""
    six = {"plain": (name_of(6), wal_segment(6)),
           "partial": (name_of(6) + ".partial", wal_segment(6)),
           "sealed": (name_of(6) + ".zst.age", b"age-encryption.org/v1\n")}[later]
    held = [(name_of(n), wal_segment(n)) for n in (3, 4)]
    if later != "partial":
        held.append((name_of(7), wal_segment(7)))
    return [*held, six, ("00000002.history", HISTORY_2.encode()),
            *((name_of(n, 2), wal_segment(n, 2)) for n in (5, 6))]


def restore(archive: str, name: str, target: Path, prefetch: str
            ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RECEIVEWAL_PREFETCH_IDLE": "5"}
    return subprocess.run([sys.executable, "-m", "receivewal", "restore", "-D", archive,
                           "--prefetch", prefetch, name, str(target)], capture_output=True,
                          text=True, check=False, timeout=120, env=env)


def assert_hole(done: subprocess.CompletedProcess[str], missing: str, following: str) -> None:
    assert done.returncode == 126, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert f'"{missing}" is missing' in done.stderr, done.stderr
    assert f'next: "{following}"' in done.stderr, done.stderr


def assert_end(done: subprocess.CompletedProcess[str], name: str) -> None:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert f'"{name}" is not in the archive' in done.stderr, done.stderr


Call = Callable[[str, str, Path, str], subprocess.CompletedProcess[str]]


def check_archive(archive: str, target: Path, later: str, prefetch: str,
                  call: Call = restore) -> None:
    """The hole is 126 naming it and the next segment held; the true end, a history file and
    the end of timeline 2 (timeline 1 held past it) are 1."""
    if prefetch != "0":  # a filler started by the call that restores segment 4
        assert call(archive, name_of(4), target, prefetch).returncode == 0
    assert_hole(call(archive, name_of(HOLE), target, prefetch), name_of(HOLE), name_of(6))
    if later != "partial":
        assert_end(call(archive, name_of(8), target, prefetch), name_of(8))
    assert_end(call(archive, "00000003.history", target, prefetch), "00000003.history")
    # timeline 2 ends after 6, though timeline 1 is held past it: the end, not a hole
    assert_end(call(archive, name_of(7, 2), target, prefetch), name_of(7, 2))


@pytest.mark.parametrize(("later", "prefetch"),
                         [("plain", "0"), ("partial", "0"), ("sealed", "0"), ("plain", "2")])
def test_a_hole_in_a_directory_is_126_its_end_1(tmp_path: Path, later: str,
                                                prefetch: str) -> None:
    archive = tmp_path / "archive"
    archive.mkdir()
    (archive / IDENTITY).write_text(
        f'{{"system_identifier": "{SYSID}", "wal_segment_size": 16777216, "timeline": 1}}')
    for name, body in files(later):
        (archive / name).write_bytes(body)
    target = tmp_path / "pg_wal" / "RECOVERYXLOG"
    target.parent.mkdir()
    check_archive(str(archive), target, later, prefetch)


@pytest.mark.server
@pytest.mark.parametrize(("later", "prefetch"), [("plain", "0"), ("partial", "2")])
def test_a_hole_in_a_bucket_is_126_its_end_1(store: SeaweedS3, tmp_path: Path, later: str,
                                             prefetch: str) -> None:
    url = new_prefix(store)
    for name, body in files(later):
        put(url, name, body)
    target = tmp_path / "pg_wal" / "RECOVERYXLOG"
    target.parent.mkdir()

    def call(archive: str, name: str, target: Path, prefetch: str
             ) -> subprocess.CompletedProcess[str]:
        return bucket_restore(archive, name, target, "--prefetch", prefetch)

    check_archive(url, target, later, prefetch, call)
