"""``receivewal backups -D ARCHIVE`` as a user runs it (issue 35 §2), on archive directories
made by hand: the backups oldest first, one line each or a JSON list, with their state and
whether the archive holds their WAL; "no backups"; a bad archive in one line. Against a real
server and bucket: tests/test_backup_commands.py."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from receivewal.backup.backupdir import BACKUPS
from receivewal.backup.record import (
    RECORD_NAME,
    BackupRecord,
    StoredArchive,
    WalSpan,
    record_to_json,
    utc_text,
)
from receivewal.wal.lsn import format_lsn
from receivewal.wal.names import wal_file_name

SEG = 16 << 20
NOW = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)


def receivewal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "receivewal", *args], capture_output=True,
                          text=True, check=False, timeout=60)


def put_backup(archive: Path, backup_id: str, first: int, last: int,
               sealed: bool = False) -> BackupRecord:
    """A complete backup in ``archive`` whose WAL is segments ``first`` .. ``last``."""
    start, end = first * SEG + 40, last * SEG + 256
    record = BackupRecord(
        backup_id=backup_id, label="l", system_identifier="7", server_version=150018,
        wal_segment_size=SEG, timeline=1, start_lsn=start, end_timeline=1, end_lsn=end,
        start_time=NOW + timedelta(minutes=first), end_time=NOW + timedelta(minutes=last),
        archives=(StoredArchive("base.tar.zst", None, "", "zstd", 10, 20),),
        wal_spans=(WalSpan(1, start, end),), manifest_name="backup_manifest",
        manifest_sha256="0" * 64, database_bytes=20,
        encrypted_to=("age1recipient",) if sealed else ())
    folder = archive / BACKUPS / backup_id
    folder.mkdir(parents=True)
    (folder / RECORD_NAME).write_bytes(record_to_json(record))
    (folder / "base.tar.zst").write_bytes(b"x" * 10)
    (folder / "backup_manifest").write_bytes(b"m")
    for name in ("base.tar.zst", "backup_manifest") if sealed else ():
        (folder / f"{name}.recipients").write_text("age1recipient\n")
    return record


def test_the_backups_are_listed_oldest_first_with_their_state_and_wal(tmp_path: Path) -> None:
    """Two complete backups (the second's WAL not all there: its segment 6 is missing), an
    interrupted one and one whose archive file is gone: one line each, oldest first."""
    old = put_backup(tmp_path, "20240601T120200Z", 2, 3)
    new = put_backup(tmp_path, "20240601T120500Z", 5, 6, sealed=True)
    gone = put_backup(tmp_path, "20240601T120800Z", 8, 8)
    (tmp_path / BACKUPS / gone.backup_id / "base.tar.zst").unlink()
    (tmp_path / BACKUPS / "20240601T121000Z").mkdir()
    (tmp_path / BACKUPS / "20240601T121000Z" / "base.tar").write_bytes(b"y")
    for segno in (2, 3, 5, 8):
        (tmp_path / wal_file_name(1, segno, SEG)).write_bytes(b"w")
    shown = receivewal("backups", "-D", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert len(lines) == 4, shown.stdout
    assert lines[0] == (
        f"{old.backup_id}  start {utc_text(old.start_time)} {format_lsn(old.start_lsn)}  "
        f"end {utc_text(old.end_time)} {format_lsn(old.end_lsn)}  timeline 1  10 bytes  zstd  "
        f"plain  complete  recovers from {format_lsn(old.end_lsn)}  WAL held")
    assert lines[1].startswith(f"{new.backup_id}  ")
    assert "  sealed  complete  " in lines[1]
    assert lines[1].endswith("WAL missing")
    assert lines[2].startswith(f"{gone.backup_id}  incomplete: ")
    assert lines[3].startswith("20240601T121000Z  interrupted: ")

    document = json.loads(receivewal("backups", "-D", str(tmp_path), "--json").stdout)
    assert [b["backup_id"] for b in document] == [old.backup_id, new.backup_id,
                                                  gone.backup_id, "20240601T121000Z"]
    assert [b["state"] for b in document] == ["complete", "complete", "incomplete",
                                              "interrupted"]
    assert [b["wal_held"] for b in document] == [True, False, None, None]
    assert document[0]["oldest_recovery_point"] == {"lsn": format_lsn(old.end_lsn),
                                                    "time": utc_text(old.end_time)}
    assert document[0]["stored_bytes"] == 10
    assert (document[0]["compression"], document[0]["sealed"]) == ("zstd", False)
    assert document[1]["sealed"] is True


def test_an_archive_without_backups_says_so(tmp_path: Path) -> None:
    shown = receivewal("backups", "-D", str(tmp_path))
    assert (shown.returncode, shown.stdout) == (0, "no backups\n")
    assert json.loads(receivewal("backups", "-D", str(tmp_path), "--json").stdout) == []


def test_a_bad_archive_is_one_line_and_fails(tmp_path: Path) -> None:
    for archive in (str(tmp_path / "none"), "s3://"):
        shown = receivewal("backups", "-D", archive)
        assert shown.returncode != 0
        assert shown.stdout == ""
        assert len(shown.stderr.splitlines()) == 1, shown.stderr
        assert shown.stderr.startswith("receivewal: error: ")
