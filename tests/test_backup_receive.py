"""Base backups from a real PostgreSQL 15 server into ``ARCHIVE/backups/<id>/`` (issue 28).

One primary for the module (1 MiB segments, a tablespace, pgbench's tables): a backup taken
while pgbench writes is received, checked against its manifest, written (client-side zstd) and
then matches that manifest by pg_verifybackup once unpacked; the server's own compression is
stored as sent; a member changed on the way is caught at receipt, naming the file; the
receipt checks pg_basebackup's own tar and manifest the same way; SIGKILL while the backup is
written leaves no directory with a record; and the memory a backup takes does not grow with
the database.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.backups import (
    PlayedLink,
    Recording,
    RecordingLink,
    backup_under_load,
    loaded_primary,
    replication_link,
    verifybackup,
)
from support.memory import PEAK_RSS_KB
from support.servers import PgServer, as_server_user, make_shared_dir, pg_bin

from receivewal.archive.compression import parse_compress_option
from receivewal.archive.durable import is_temporary
from receivewal.backup.backupdir import BACKUPS
from receivewal.backup.catalog import EntryState, read_catalog
from receivewal.backup.command import BackupRequest
from receivewal.backup.manifest import BackupMismatch, ManifestCheck, parse_manifest
from receivewal.backup.record import RECORD_NAME, BackupRecord
from receivewal.backup.tar import MemberData, MemberStart, TarReader
from receivewal.backup.transfer import BackupLink, take_backup
from receivewal.errors import ArchiveError, ReceivewalError
from receivewal.recovery.choice import RecoveryTarget, choose_backup
from receivewal.recovery.unpack import unpack_backup
from receivewal.replication.commands import ServerInfo

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Primary:
    pg: PgServer
    tablespace: Path
    server: ServerInfo
    archive: Path
    record: BackupRecord  # the backup taken while pgbench ran
    recording: Recording  # its COPY stream, as the server sent it


@pytest.fixture(scope="module")
def primary() -> Iterator[Primary]:
    base = make_shared_dir("receivewal-backup-")
    pg: PgServer | None = None
    try:
        pg, tablespace = loaded_primary(base)
        archive = base / "archive"
        archive.mkdir()
        recorder = RecordingLink(None)

        def recording(link: BackupLink) -> BackupLink:
            recorder.link = link
            return recorder

        server, record = backup_under_load(pg, archive, "under load", "zstd", recording)
        yield Primary(pg, tablespace, server, archive, record, recorder.recording)
    finally:
        if pg is not None:
            pg.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def test_a_backup_under_load_is_written_whole_and_matches_its_manifest(primary: Primary,
                                                                       tmp_path: Path) -> None:
    """The record is last and says what is there; the archives are zstd; unpacked, the files
    are what pg_verifybackup expects of the manifest the server sent."""
    record = primary.record
    directory = primary.archive / BACKUPS / record.backup_id
    names = sorted(p.name for p in directory.iterdir())
    assert names == sorted([RECORD_NAME, "backup_manifest", "base.tar.zst",
                            next(a.name for a in record.archives if a.tablespace_oid)])
    assert all(a.name.endswith(".tar.zst") and a.compression == "zstd" for a in record.archives)
    assert {a.location for a in record.archives} == {"", str(primary.tablespace)}
    assert all(a.stored_bytes == (directory / a.name).stat().st_size for a in record.archives)
    assert record.system_identifier == primary.server.system_identifier
    assert record.label == "under load"
    assert record.start_lsn < record.end_lsn
    assert record.timeline == record.end_timeline == 1
    assert record.database_bytes > 20 << 20
    mtimes = {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}
    assert mtimes[RECORD_NAME] == max(mtimes.values())
    stored = json.loads((directory / RECORD_NAME).read_text())
    assert stored["backup_id"] == record.backup_id
    pgdata, moved = tmp_path / "pgdata", tmp_path / "ts"
    unpack_backup(directory, record, pgdata, mapping={str(primary.tablespace): str(moved)})
    [oid] = [a.tablespace_oid for a in record.archives if a.tablespace_oid is not None]
    # the tablespace's new directory: in tablespace_map, from which PostgreSQL makes the link
    # when it starts (pg_verifybackup reads tablespaces through the links: made here by hand)
    assert (pgdata / "tablespace_map").read_text() == f"{oid} {moved}\n"
    (pgdata / "pg_tblspc" / str(oid)).symlink_to(moved)
    done = verifybackup(pgdata, directory / "backup_manifest", "tablespace_map")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "backup successfully verified" in done.stdout


@pytest.mark.parametrize(("server", "client", "stored"), [
    ("gzip:5", "lz4", "gzip"), ("lz4", "none", "lz4"), ("zstd:level=3", "gzip", "zstd"),
    (None, "gzip:1", "gzip"), (None, "none", ""),
])
def test_compression_on_either_side_is_stored_and_unpacks(primary: Primary, tmp_path: Path,
                                                          server: str | None, client: str,
                                                          stored: str) -> None:
    """What the server compressed is stored as sent (the client's --compress does not apply
    twice); a plain stream is compressed as asked; either unpacks against the manifest. The
    server takes PROGRESS and MAX_RATE as the command spells them."""
    request = BackupRequest(label="compressed", fast=True, progress=True, max_rate=1024 * 1024,
                            server_compression=None if server is None
                            else parse_compress_option(server))
    with replication_link(primary.pg) as conn:
        record = take_backup(conn, request, tmp_path, primary.server,
                             compress=parse_compress_option(client), sync=False)
    assert {a.compression for a in record.archives} == {stored}
    directory = tmp_path / BACKUPS / record.backup_id
    unpacked = unpack_backup(directory, record, tmp_path / "pgdata",
                             mapping={str(primary.tablespace): str(tmp_path / "ts")}, sync=False)
    assert unpacked.files == len(parse_manifest((directory / "backup_manifest")
                                                .read_bytes()).files)


def test_without_a_tablespace_map_the_link_is_made_to_the_mapped_directory(
        primary: Primary, tmp_path: Path) -> None:
    """TABLESPACE_MAP off: the base archive holds pg_tblspc/<oid> as a symbolic link, which
    the unpack makes toward the tablespace's new directory (never writing through it)."""
    with replication_link(primary.pg) as conn:
        record = take_backup(conn, BackupRequest(fast=True, tablespace_map=False), tmp_path,
                             primary.server, sync=False)
    moved = tmp_path / "ts"
    unpack_backup(tmp_path / BACKUPS / record.backup_id, record, tmp_path / "pgdata",
                  mapping={str(primary.tablespace): str(moved)}, sync=False)
    [oid] = [a.tablespace_oid for a in record.archives if a.tablespace_oid is not None]
    link = tmp_path / "pgdata" / "pg_tblspc" / str(oid)
    assert link.is_symlink()
    assert link.readlink() == moved
    assert not (tmp_path / "pgdata" / "tablespace_map").exists()
    assert any(moved.rglob("*")), "the tablespace's files are in its new directory"


def flip_byte_of(recording: Recording, member: str) -> Recording:
    """The recording with the first byte of ``member``'s data (in base.tar) changed."""
    payloads = list(recording.payloads)
    reader = TarReader("base.tar")
    inside = False
    for index, payload in enumerate(payloads):
        if payload[:1] == b"n":
            inside = payload[1:].split(b"\0")[0] == b"base.tar"
        elif inside and payload[:1] == b"d":
            fed = reader.offset  # the archive's offset of this payload's first data byte
            for event in reader.feed(payload[1:]):
                if isinstance(event, MemberStart):
                    wanted = event.member.name == member and event.member.size > 0
                elif isinstance(event, MemberData) and wanted:
                    at = 1 + reader.offset - len(event.data) - fed
                    payloads[index] = payload[:at] + bytes([payload[at] ^ 0xFF]) + \
                        payload[at + 1:]
                    return Recording(recording.before, payloads, recording.end_rows)
    raise AssertionError(f"{member} not found in base.tar")


def test_a_file_changed_in_transit_is_caught_at_receipt(primary: Primary,
                                                        tmp_path: Path) -> None:
    """A byte of global/pg_control changed on its way: the backup is refused with its name,
    and no backup directory stays behind."""
    altered = flip_byte_of(primary.recording, "global/pg_control")
    with pytest.raises(BackupMismatch, match=r'"global/pg_control" has SHA256 checksum \w+ on '
                                             r"receipt, \w+ in the manifest"):
        take_backup(PlayedLink(altered), BackupRequest(), tmp_path, primary.server, sync=False)
    assert list((tmp_path / BACKUPS).iterdir()) == []
    take_backup(PlayedLink(primary.recording), BackupRequest(), tmp_path, primary.server,
                sync=False)  # the same recording, unaltered, is received
    assert [e.state for e in read_catalog(tmp_path)] == [EntryState.COMPLETE]


def test_pg_basebackups_tar_and_manifest_are_checked_the_same_way(primary: Primary) -> None:
    """pg_basebackup -Ft's base.tar read by the tar reader matches its backup_manifest; the
    same tar with one byte of PG_VERSION changed does not, naming it."""
    out = primary.pg.base / "pg_basebackup"
    subprocess.run(as_server_user([
        pg_bin("pg_basebackup"), "-D", str(out), "-Ft", "-h", "127.0.0.1", "-p",
        str(primary.pg.port), "-U", "postgres", "-X", "none", "-c", "fast", "--no-sync",
        "--manifest-checksums=SHA256"]), check=True, capture_output=True)
    manifest = parse_manifest((out / "backup_manifest").read_bytes())

    def check(base_tar: bytes) -> None:
        verify = ManifestCheck("SHA256", "pg_basebackup's backup")
        for tar in sorted(out.glob("*.tar")):
            data = base_tar if tar.name == "base.tar" else tar.read_bytes()
            prefix = "" if tar.name == "base.tar" else f"pg_tblspc/{tar.name[:-4]}/"
            reader = TarReader(tar.name)
            for event in reader.feed(data):
                verify.follow(event, prefix.__add__)
            reader.close()
        verify.compare(manifest)

    base_tar = (out / "base.tar").read_bytes()
    check(base_tar)
    at = base_tar.index(b"15\n", base_tar.index(b"PG_VERSION"))
    with pytest.raises(BackupMismatch, match='"PG_VERSION" has SHA256 checksum'):
        check(base_tar[:at] + b"16" + base_tar[at + 2:])


# -- a process killed while it writes --------------------------------------------------------------
CHILD = """
import sys, time
sys.path[:0] = [{root!r}, {tests!r}]
from pathlib import Path
from support.backups import replication_link
from support.servers import PgServer
from receivewal.archive.compression import parse_compress_option
from receivewal.backup.command import BackupRequest
from receivewal.backup.transfer import take_backup
from receivewal.replication.commands import identify_server

pg = PgServer(Path({base!r}), "primary")
pg.port = {port}
def say(what):
    print(what, flush=True)
def committing(received):
    say("committing")
    time.sleep(60)
with replication_link(pg) as conn:
    server = identify_server(conn)
    take_backup(conn, BackupRequest(max_rate={rate}, fast=True), Path({archive!r}), server,
                compress=parse_compress_option("lz4"), before_commit=committing,
                on_progress=lambda done: say("progress"))
say("done")
"""


def run_child(primary: Primary, archive: Path, rate: int) -> subprocess.Popen[str]:
    code = CHILD.format(root=str(ROOT), tests=str(ROOT / "tests"), base=str(primary.pg.base),
                        port=primary.pg.port, archive=str(archive), rate=rate)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def kill_at(child: subprocess.Popen[str], line: str) -> None:
    assert child.stdout is not None
    for said in child.stdout:
        if said.strip() == line:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=30)
            return
    raise AssertionError(f"the backup process ended without saying {line!r}")


@pytest.mark.parametrize(("moment", "rate"), [("progress", 2048), ("committing", 0)])
def test_sigkill_while_writing_leaves_no_directory_with_a_record(
        primary: Primary, tmp_path: Path, moment: str, rate: int) -> None:
    """Killed while an archive streams in, or with archives and manifest written but before
    the record: the directory has no record, the catalog calls it interrupted, recovery finds
    no backup in it, and what it holds besides is a temporary file or complete files."""
    archive = tmp_path / "archive"
    archive.mkdir()
    kill_at(run_child(primary, archive, rate), moment)
    [directory] = (archive / BACKUPS).iterdir()
    names = sorted(p.name for p in directory.iterdir())
    assert RECORD_NAME not in names
    if moment == "progress":
        assert any(is_temporary(name) for name in names), names
    else:
        assert "backup_manifest" in names
        assert not any(is_temporary(name) for name in names), names
    [entry] = read_catalog(archive)
    assert entry.state is EntryState.INTERRUPTED
    records = [e.record for e in read_catalog(archive) if e.record is not None]
    with pytest.raises(ArchiveError, match="no complete backup"):
        choose_backup(records, RecoveryTarget(), 1, {})


def test_a_running_backup_is_told_from_an_interrupted_one(primary: Primary,
                                                          tmp_path: Path) -> None:
    """While the writer lives (its lock held) the directory is "being written"."""
    archive = tmp_path / "archive"
    archive.mkdir()
    child = run_child(primary, archive, 0)
    try:
        assert child.stdout is not None
        while child.stdout.readline().strip() != "committing":
            pass
        [entry] = read_catalog(archive)
        assert entry.state is EntryState.RUNNING
    finally:
        child.kill()
        child.wait(timeout=30)
    [entry] = read_catalog(archive)
    assert entry.state is EntryState.INTERRUPTED


# -- memory ----------------------------------------------------------------------------------------
MEASURE = """
import sys
sys.path[:0] = [{root!r}, {tests!r}]
from pathlib import Path
from support.backups import replication_link
from support.servers import PgServer
from receivewal.archive.compression import parse_compress_option
from receivewal.backup.command import BackupRequest
from receivewal.backup.transfer import take_backup
from receivewal.replication.commands import identify_server

pg = PgServer(Path({base!r}), "primary")
pg.port = {port}
with replication_link(pg) as conn:
    record = take_backup(conn, BackupRequest(fast=True), Path({archive!r}),
                         identify_server(conn), compress=parse_compress_option("zstd"),
                         sync=False)
print(record.database_bytes, {peak})
"""


def test_memory_does_not_grow_with_the_database(primary: Primary, tmp_path: Path) -> None:
    """A backup of a database grown to more than 150 MB takes less than 90 MB of memory in
    all (the interpreter, psycopg and the codecs included): the archives are never held."""
    primary.pg.sql("CREATE TABLE IF NOT EXISTS big AS SELECT g, repeat(md5(g::text), 8) AS pad "
                   "FROM generate_series(1, 400000) g")
    archive = tmp_path / "archive"
    archive.mkdir()
    code = MEASURE.format(root=str(ROOT), tests=str(ROOT / "tests"), base=str(primary.pg.base),
                          port=primary.pg.port, archive=str(archive), peak=PEAK_RSS_KB)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    database, peak_kb = map(int, done.stdout.split())
    assert database > 150 << 20
    assert peak_kb < 90 << 10, f"peak RSS {peak_kb} kB for a {database >> 20} MB database"


def test_a_backup_cut_off_by_the_server_leaves_nothing(primary: Primary,
                                                       tmp_path: Path) -> None:
    """The walsender terminated in the middle of the stream: one line from the server's side,
    and the backup directory is gone."""
    killed: list[str] = []

    def terminate(done: int) -> None:
        if not killed:
            killed.append(primary.pg.sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE backend_type = 'walsender'"))

    with replication_link(primary.pg) as conn, pytest.raises(ReceivewalError) as caught:
        take_backup(conn, BackupRequest(fast=True, max_rate=4096), tmp_path, primary.server,
                    on_progress=terminate, sync=False)
    assert killed == ["t"]
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith("base backup failed: ")
    assert "terminat" in str(caught.value)
    assert list((tmp_path / BACKUPS).iterdir()) == []
