"""The fast paths of a base backup and of its unpack check what the slow ones check: a tar piece
taken whole inside a file is hashed as an event would have been, and one sync of the file
system stands for the fsyncs only where it reports what they would have (issue 36 items 1
and 2)."""

from __future__ import annotations

import ctypes
import errno
import itertools
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.backups import PlayedLink, Recording, make_manifest, make_tar, new_archive, progress

from receivewal.archive import durable
from receivewal.backup.backupdir import BACKUPS
from receivewal.backup.command import BackupRequest, Position, Tablespace
from receivewal.backup.manifest import BackupMismatch
from receivewal.backup.receipt import ArchiveInfo, Receipt
from receivewal.backup.record import BackupRecord
from receivewal.backup.transfer import take_backup
from receivewal.errors import ArchiveError
from receivewal.recovery.unpack import unpack_backup
from receivewal.replication.commands import ServerInfo

FILES = [("PG_VERSION", b"15\n"), ("base/5/16384", bytes(range(256)) * 700),
         ("base/5/16385", b"x" * 70_000), ("global/pg_control", b"\x07" * 8192)]
START, END = Position(0x2000028, 1), Position(0x2000100, 1)


class Sink:
    """A BackupSink that keeps nothing."""

    def begin_archive(self, archive: ArchiveInfo) -> None:
        pass

    def archive_bytes(self, data: memoryview) -> None:
        pass

    def end_archive(self) -> None:
        pass


def messages(tar: bytes, manifest: bytes, cuts: list[int]) -> list[bytes]:
    """The COPY stream of one base.tar cut at ``cuts``, then the manifest."""
    edges = sorted({0, len(tar), *(c % (len(tar) + 1) for c in cuts)})
    pieces = [b"d" + tar[a:b] for a, b in itertools.pairwise(edges)]
    return [new_archive("base.tar", ""), *pieces, progress(len(tar)), b"m", b"d" + manifest]


def receive(stream: list[bytes]) -> None:
    receipt = Receipt([Tablespace(None, None, None)], Sink(), algorithm="SHA256")
    for message in stream:
        receipt.receive(message)
    receipt.finish(START, END)


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=300_000), max_size=40),
       flip=st.integers(min_value=0, max_value=len(FILES[1][1]) - 1))
def test_a_stream_cut_anywhere_is_checked_the_same(cuts: list[int], flip: int) -> None:
    """Whatever the pieces (a piece inside one file, across a header, ending on a member's
    end), a good stream is received and one changed byte of a file is named."""
    tar, manifest = make_tar(FILES, dirs=["base", "base/5", "global"]), make_manifest(FILES)
    receive(messages(tar, manifest, cuts))
    at = tar.index(FILES[1][1]) + flip
    changed = tar[:at] + bytes([tar[at] ^ 1]) + tar[at + 1:]
    with pytest.raises(BackupMismatch, match=r'"base/5/16384" has SHA256 checksum'):
        receive(messages(changed, manifest, cuts))


# -- the unpack's durability ---------------------------------------------------------------------
def stored_backup(archive: Path) -> BackupRecord:
    """A backup of FILES taken into ``archive`` from a played stream."""
    tar, manifest = make_tar(FILES, dirs=["base", "base/5", "global"]), make_manifest(FILES)
    recording = Recording([[("0/2000028", "1")], [(None, None, None)]],
                          messages(tar, manifest, [5000, 77_000]), [("0/2000100", "1")])
    server = ServerInfo("7", 1, 0x3000000, 16 << 20, 0o600, 150000)
    return take_backup(PlayedLink(recording), BackupRequest(), archive, server, sync=False)


def test_a_writeback_error_syncfs_reports_fails_the_unpack_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = stored_backup(tmp_path)

    def failing(fd: int) -> int:
        ctypes.set_errno(errno.EIO)
        return -1

    monkeypatch.setattr(durable, "_syncfs_reports_errors", lambda: True)
    monkeypatch.setattr(durable, "_syncfs_function", lambda: failing)
    with pytest.raises(ArchiveError) as caught:
        unpack_backup(tmp_path / BACKUPS / record.backup_id, record, tmp_path / "pgdata")
    assert "could not sync the files written under" in str(caught.value)
    assert os.strerror(errno.EIO) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_syncfs_replaces_the_fsyncs_only_where_it_reports_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a syncfs that reports writeback errors: one per root, no fsync of a file; on an
    older kernel: an fsync of every file and directory, as before."""
    record = stored_backup(tmp_path)
    fsynced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        fsynced.append(fd)
        real_fsync(fd)

    synced: list[int] = []

    def syncfs(fd: int) -> int:
        synced.append(fd)
        return 0

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(durable, "_syncfs_reports_errors", lambda: True)
    monkeypatch.setattr(durable, "_syncfs_function", lambda: syncfs)
    unpacked = unpack_backup(tmp_path / BACKUPS / record.backup_id, record, tmp_path / "a")
    assert (len(synced), fsynced, unpacked.files) == (1, [], len(FILES))

    monkeypatch.setattr(durable, "_syncfs_reports_errors", lambda: False)
    unpack_backup(tmp_path / BACKUPS / record.backup_id, record, tmp_path / "b")
    assert len(fsynced) >= len(FILES) + 3  # the files, base/5, base and global
    assert len(synced) == 1

    fsynced.clear()
    unpack_backup(tmp_path / BACKUPS / record.backup_id, record, tmp_path / "c", sync=False)
    assert (fsynced, len(synced)) == ([], 1)


def test_syncfs_needs_linux_58() -> None:
    assert durable._syncfs_reports_errors() == (
        os.uname().sysname == "Linux"
        and tuple(int(p) for p in os.uname().release.split(".")[:2]) >= (5, 8))
