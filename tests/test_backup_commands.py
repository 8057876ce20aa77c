"""``receivewal backup`` and ``receivewal recover`` as a user runs them, against a real
PostgreSQL 15 and SeaweedFS: the ``stream`` daemon archives the server's WAL into a directory
and uploads it to a bucket; a backup into each is taken while pgbench writes; then a
recovery to a time between two marker transactions, from the bucket alone and from the
directory, reaches the rows committed before the target and none after. And what must be
refused: a non-empty PGDATA, a backup whose WAL never reaches the archive (named), another
server's archive, a backup killed while it is written, a backup damaged at rest (verify)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from support.backups import give_to_postgres, loaded_primary, start_pgbench, start_recovered
from support.postgres_user import S3_PACKAGES, install_for_postgres, readable_by_postgres
from support.seaweed import SeaweedS3
from support.servers import PgServer, make_shared_dir
from support.streams import (
    RECEIVEWAL,
    receivewal,
    start_streaming,
    stop,
    wait_for,
)

from receivewal.archive.bucket import Bucket
from receivewal.archive.compression import decompress_chunks, new_compressor, parse_compress_option
from receivewal.archive.multipart import StreamUpload
from receivewal.backup.catalog import EntryState, read_catalog, read_entry
from receivewal.errors import ObjectConflict

pytestmark = pytest.mark.server

_names = itertools.count()


@dataclass
class World:
    base: Path
    pg: PgServer
    seaweed: SeaweedS3
    archive: Path  # the stream daemon's directory
    url: str  # where it uploads
    tablespace: Path
    local_id: str  # the backup taken into the directory
    bucket_id: str  # the backup uploaded to the bucket
    target: str  # a time between the marker rows 'before' and 'after'
    history_rows: str  # pgbench_history's count(*) once pgbench was stopped
    prefix: str  # restore_command's prefix, runnable by the server user, store in its env

    def env(self) -> dict[str, str]:
        return self.seaweed.env()


def run(world: World, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``receivewal ARGS`` with the store's environment."""
    return receivewal(*args, env=world.env(), timeout=timeout)


def backup_id_of(stdout: str) -> str:
    """The ID a successful ``receivewal backup`` printed."""
    first = stdout.splitlines()[0]
    assert first.startswith("backup "), stdout
    assert " complete: " in first, stdout
    return first.split()[1]


def holds(world: World, name: str) -> bool:
    """Whether the directory and the bucket both hold the segment ``name``."""
    client = world.seaweed.client()
    prefix = world.url.split("/", 3)[3]
    found = client.list_objects_v2(Bucket=world.seaweed.bucket, Prefix=f"{prefix}/{name}")
    return (world.archive / name).exists() and found.get("KeyCount", 0) > 0


@pytest.fixture(scope="module")
def world(seaweed: SeaweedS3) -> Iterator[World]:
    base = make_shared_dir("receivewal-backupcmd-")
    pg: PgServer | None = None
    streamer = None
    try:
        pg, tablespace = loaded_primary(base)
        archive = base / "archive"
        archive.mkdir()
        url = f"s3://{seaweed.bucket}/backups-test"
        log = base / "stream.log"
        streamer = start_streaming("-D", str(archive), "-d", pg.dsn, "--upload-to", url,
                                   log=log, env=seaweed.env())
        world = World(base, pg, seaweed, archive, url, tablespace, "", "", "", "",
                      install_for_postgres(base, S3_PACKAGES))
        load = start_pgbench(pg, 240)  # stopped once both backups are taken
        time.sleep(1)
        local = run(world, "backup", "-D", str(archive), "-d", pg.dsn, "--fast",
                    "--compress", "lz4", "--label", "local")
        bucket = run(world, "backup", "-D", url, "-d", pg.dsn, "--fast", "--label", "bucket",
                     "--server-compress")
        assert load.poll() is None, "pgbench was still writing when the backups ended"
        load.send_signal(signal.SIGINT)
        load.wait(timeout=30)
        assert local.returncode == 0, local.stderr
        assert bucket.returncode == 0, bucket.stderr
        world.local_id, world.bucket_id = backup_id_of(local.stdout), backup_id_of(bucket.stdout)
        world.history_rows = pg.sql("SELECT count(*) FROM pgbench_history")
        assert int(world.history_rows) > 0
        pg.sql("CREATE TABLE marker (what text) TABLESPACE ts")
        pg.sql("INSERT INTO marker VALUES ('before')")
        time.sleep(1.1)
        world.target = pg.sql("SELECT clock_timestamp()")
        time.sleep(1.1)
        pg.sql("INSERT INTO marker VALUES ('after')")
        last = pg.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
        pg.switch_wal()
        wait_for(lambda: holds(world, last), timeout=60, what=f"{last} archived and uploaded")
        readable_by_postgres(archive)
        yield world
    finally:
        if streamer is not None:
            stop(streamer)
        if pg is not None:
            pg.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def recover_and_check(world: World, archive: str, expect_id: str) -> str:
    """``recover --target-time`` from ``archive`` into a new data directory (the tablespace
    moved), the server started: 'before' and every pgbench transaction are there, 'after'
    is not. The command's output."""
    # the stream daemon goes on completing segments with mode 0600 after the fixture made the
    # archive readable: the server user's restore_command must read them too
    readable_by_postgres(world.archive)
    name = f"recovered-{next(_names)}"
    pgdata, moved = world.base / name, world.base / f"{name}-ts"
    env = " ".join(f"{k}={v}" for k, v in world.env().items())
    done = run(world, "recover", "--to", str(pgdata), "-D", archive, "--target-time",
               world.target, "-T", f"{world.tablespace}={moved}", "--restore-command-prefix",
               f"{env} RECEIVEWAL_PREFETCH_IDLE=2 {world.prefix}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"backup {expect_id} "), done.stdout
    assert f"pg_ctl -D {pgdata} -l {pgdata}/recovery.log start" in done.stdout
    give_to_postgres(pgdata, moved)
    try:
        server = start_recovered(world.base, name)
    except subprocess.CalledProcessError as exc:
        log = world.base / f"{name}.log"
        raise AssertionError(log.read_text() if log.exists() else str(exc)) from exc
    try:
        assert server.sql("SELECT string_agg(what, ',') FROM marker") == "before"
        assert server.sql("SELECT count(*) FROM pgbench_history") == world.history_rows
        assert server.sql("SELECT count(*) FROM ts_rows") == "2000"
        assert "recovery stopping before commit" in server.logfile.read_text()
    finally:
        server.stop("immediate")
    return done.stdout


def test_recover_to_a_time_from_the_bucket_alone(world: World) -> None:
    """The bucket holds the uploaded backup (compressed by the server) and WAL: recover picks
    that backup and the restore_command reads the bucket."""
    out = recover_and_check(world, world.url, world.bucket_id)
    assert "AWS_ENDPOINT_URL" in out  # the server's environment needs the store's


def test_recover_to_a_time_from_the_directory(world: World) -> None:
    recover_and_check(world, str(world.archive), world.local_id)


def test_backups_lists_the_directorys_and_the_buckets_backups(world: World) -> None:
    """``backups -D`` (issue 35 §2) of the directory and of the bucket: each backup taken
    into it on its line, complete, with its WAL held; ``--json`` says the same, oldest
    first."""
    for archive, backup_id in ((str(world.archive), world.local_id),
                               (world.url, world.bucket_id)):
        shown = run(world, "backups", "-D", archive)
        assert shown.returncode == 0, shown.stderr
        line = next(line for line in shown.stdout.splitlines()
                    if line.startswith(f"{backup_id}  "))
        assert "  plain  complete  recovers from " in line, line
        assert line.endswith("  WAL held"), line
        document = json.loads(run(world, "backups", "-D", archive, "--json").stdout)
        ids = [b["backup_id"] for b in document]
        assert ids == sorted(ids)
        listed = next(b for b in document if b["backup_id"] == backup_id)
        assert (listed["state"], listed["wal_held"], listed["sealed"]) == \
            ("complete", True, False)
        assert listed["stored_bytes"] > 0
    local = json.loads(run(world, "backups", "-D", str(world.archive), "--json").stdout)
    assert next(b for b in local if b["backup_id"] == world.local_id)["compression"] == "lz4"


def test_status_reports_the_backups_of_the_bucket_it_uploads_to(world: World,
                                                                tmp_path: Path) -> None:
    """``status`` of a daemon that uploads (issue 35 §3) counts the bucket's backups: with
    no backup in the directory, its oldest recoverable point is the bucket's oldest (the one
    ``backups -D BUCKET`` lists first complete with its WAL), not "none"."""
    listed = json.loads(run(world, "backups", "-D", world.url, "--json").stdout)
    first = next(b for b in listed if b["state"] == "complete" and b["wal_held"])
    alone = tmp_path / "alone"  # the daemon's state file, the directory without backups
    alone.mkdir()
    shutil.copy(world.archive / ".receivewal-state.json", alone)
    shown = status_lines(run(world, "status", "-D", str(alone)).stdout)
    assert shown["oldest recoverable"].endswith(
        f"(backup {first['backup_id']}, in the bucket)"), shown
    complete = len([b for b in listed if b["state"] == "complete"])
    assert shown["bucket"].startswith(f"{complete} backups "), shown
    document = json.loads(run(world, "status", "-D", str(alone), "--json").stdout)
    assert document["archive"]["oldest_recoverable"] is None
    assert document["bucket"]["oldest_recoverable"]["backup_id"] == first["backup_id"]
    assert document["bucket"]["oldest_recoverable"]["lsn"] == first["start_lsn"]
    beside = run(world, "status", "-D", str(world.archive))  # the running daemon's
    assert beside.returncode == 0, beside.stdout
    assert status_lines(beside.stdout)["bucket"].startswith(f"{complete} backups ")


def status_lines(stdout: str) -> dict[str, str]:
    """``status``'s lines after its first, by label (the columns' padding stripped)."""
    lines = (line.split(":", 1) for line in stdout.splitlines()[1:] if ":" in line)
    return {label.strip(): value.strip() for label, value in lines}


def test_a_data_directory_that_is_not_empty_is_refused(world: World, tmp_path: Path) -> None:
    (tmp_path / "PG_VERSION").write_text("15\n")
    done = run(world, "recover", "--to", str(tmp_path), "-D", str(world.archive))
    assert done.returncode == 1
    assert done.stderr.strip() == (f"receivewal: error: data directory {tmp_path} is not "
                                   "empty: recover writes only into an empty or new directory")
    assert [p.name for p in tmp_path.iterdir()] == ["PG_VERSION"]


def test_verify_checks_the_backups_and_names_a_tampered_member(world: World,
                                                              tmp_path: Path) -> None:
    """verify reads every backup back against its manifest: both archives' pass; a copy of
    the directory whose base.tar.lz4 says '16' in PG_VERSION fails, naming the file."""
    for archive, backup_id in ((str(world.archive), world.local_id),
                               (world.url, world.bucket_id)):
        done = run(world, "verify", archive)
        assert f"backup {backup_id}: verified" in done.stdout, done.stdout + done.stderr
        assert done.returncode == 0
    report = json.loads(run(world, "verify", "--json", str(world.archive)).stdout)
    assert [(b["backup_id"], b["state"]) for b in report["backups"]
            if b["backup_id"] == world.local_id] == [(world.local_id, "verified")]
    copy = tmp_path / "archive"
    # the daemon still streams: its open files and temporary names are no part of the copy
    skip = shutil.ignore_patterns("*.partial", "*.lock", "*.receivewal-tmp")
    shutil.copytree(world.archive, copy, ignore=skip)
    tar_path = copy / "backups" / world.local_id / "base.tar.lz4"
    with tar_path.open("rb") as fh:
        tar = b"".join(decompress_chunks(fh, "lz4"))
    at = tar.index(b"15\n", tar.index(b"PG_VERSION"))
    compressor = new_compressor(parse_compress_option("lz4"))
    written = tar_path.stat().st_size
    changed = compressor.begin() + compressor.compress(tar[:at] + b"16" + tar[at + 2:]) \
        + compressor.finish()
    tar_path.write_bytes(changed)
    done = run(world, "verify", str(copy))
    assert done.returncode == 1
    if len(changed) == written:  # the members are read and checked against the manifest
        assert (f'backup {world.local_id}: FAILED: backup {world.local_id} does not match its '
                'manifest: "PG_VERSION" has SHA256 checksum') in done.stdout, done.stdout
    else:  # the scan already shows it is not the file written (issue 32 item 1)
        assert (f"backup {world.local_id}: FAILED: its record is there, not all its files: "
                f"base.tar.lz4 holds {len(changed)} bytes, its record says {written}"
                ) in done.stdout, done.stdout


def test_a_backup_whose_wal_never_comes_is_not_complete_and_names_the_segment(
        world: World, tmp_path: Path) -> None:
    """An archive the stream daemon does not feed (its identity only): the backup waits
    --wal-wait seconds, names the first segment missing, exits 1 and leaves no backup."""
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    shutil.copy(world.archive / ".receivewal-archive.json", lonely)
    done = run(world, "backup", "-D", str(lonely), "-d", world.pg.dsn, "--fast", "--wal-wait",
               "1")
    assert done.returncode == 1
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("receivewal: error: backup ")
    assert f"is not complete: the archive {lonely} lacks WAL segment 00000001" in error
    assert "is receivewal stream archiving this server's WAL there?" in error
    assert list((lonely / "backups").iterdir()) == []


def test_another_servers_archive_and_bad_options_are_refused(world: World,
                                                             tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / ".receivewal-archive.json").write_text(json.dumps(
        {"system_identifier": "7000000000000000001", "wal_segment_size": 1 << 20,
         "timeline": 1}))
    done = run(world, "backup", "-D", str(other), "-d", world.pg.dsn)
    assert done.returncode == 1
    assert "belongs to database system 7000000000000000001, but the server is database " \
        "system" in done.stderr
    assert not (other / "backups").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    done = run(world, "backup", "-D", str(empty), "-d", world.pg.dsn)
    assert done.returncode == 1
    assert "is not a receivewal archive (it has no identity record)" in done.stderr
    for bad, complaint in ((("--compress", "brotli"), "one of zstd, lz4, gzip, none"),
                           (("--max-rate", "1"), "a transfer rate from 32k"),
                           (("--compress", "zstd:99"), "compression")):
        done = run(world, "backup", "-D", str(world.archive), "-d", world.pg.dsn, *bad)
        assert done.returncode == 1
        assert complaint in done.stderr, done.stderr


def test_sigkill_during_a_backup_leaves_nothing_recover_takes(world: World) -> None:
    """A backup throttled to 32 kB/s, killed with SIGKILL once its first archive is
    uploaded (bucket) or its directory holds a file (directory): the catalog shows it
    incomplete, recover refuses it by name, and latest still takes the complete one."""
    for archive in (world.url, str(world.archive)):
        proc = subprocess.Popen([*RECEIVEWAL, "backup", "-D", archive, "-d", world.pg.dsn,
                                 "--fast", "--max-rate", "32"], env={**os.environ, **world.env()},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_for(lambda a=archive: started_backup(world, a) is not None, timeout=60,
                     what="the backup to store its first file")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        killed = started_backup(world, archive)
        assert killed is not None
        done = run(world, "recover", killed, "--to", str(world.base / "never"), "-D", archive)
        assert done.returncode == 1
        assert f"backup {killed} is not complete" in done.stderr, done.stderr
        assert not (world.base / "never").exists()
    entries = {e.backup_id: e.state for e in read_catalog(world.archive)}
    assert entries[world.local_id] is EntryState.COMPLETE
    assert EntryState.INTERRUPTED in entries.values()


def started_backup(world: World, archive: str, *, running: bool = False) -> str | None:
    """The backup being written that holds a file (an object) but no record, if any (with
    ``running``, in a directory: one whose writer still holds its lock)."""
    known = {world.local_id, world.bucket_id}
    if archive.startswith("s3://"):
        client = world.seaweed.client()
        prefix = world.url.split("/", 3)[3] + "/backups/"
        listed = client.list_objects_v2(Bucket=world.seaweed.bucket, Prefix=prefix)
        ids = {item["Key"][len(prefix):].split("/")[0] for item in listed.get("Contents", ())}
        return next(iter(ids - known), None)
    for path in (Path(archive) / "backups").iterdir():
        if path.name not in known and any(path.iterdir()) \
                and (not running or read_entry(path).state is EntryState.RUNNING):
            return path.name
    return None


def test_the_recovery_target_must_come_after_a_backup(world: World) -> None:
    """A target time before every backup ended: no backup, and the error says why."""
    early = datetime.fromisoformat(world.target.replace(" ", "T")).replace(year=2000)
    done = run(world, "recover", "--to", str(world.base / "early"), "-D", str(world.archive),
               "--target-time", early.isoformat())
    assert done.returncode == 1
    assert "no backup to recover to time 2000-" in done.stderr
    assert "after the target time" in done.stderr


def test_a_stream_upload_of_several_parts_is_the_bytes_written_and_create_only(
        store: SeaweedS3) -> None:
    """40 MiB written in uneven pieces go up as three parts (16 + 16 + 8 MiB) and read back
    whole; a second upload to the key of other bytes is an ObjectConflict and the object
    stays; of the same bytes (a retry) it succeeds."""
    url = f"s3://{store.bucket}/stream-upload-{next(_names)}"
    bucket = Bucket.connect(url)
    data = os.urandom(1 << 20) * 40
    upload = StreamUpload(bucket, "big")
    at = 0
    for size in itertools.cycle((1, 70_000, 3 << 20, 12345)):
        if at >= len(data):
            break
        upload.write(memoryview(data)[at:at + size])
        at += size
    assert upload.finish() == len(data)
    assert len(upload._parts) == 3
    assert bucket.get_bytes("big", len(data)) == data
    again = StreamUpload(bucket, "big")
    again.write(data[:100])
    with pytest.raises(ObjectConflict, match="a different object is already stored"):
        again.finish()
    assert bucket.get_bytes("big", len(data)) == data
    same = StreamUpload(bucket, "big")
    same.write(data)
    assert same.finish() == len(data)


def test_a_relative_archive_directory_is_written_absolute_into_restore_command(
        world: World) -> None:
    """The server runs restore_command in its data directory: recover -D archive (relative
    to the command's directory) writes the archive's absolute path."""
    pgdata = world.base / f"relative-{next(_names)}"
    done = subprocess.run([*RECEIVEWAL, "recover", "--to", str(pgdata), "-D", "archive", "-T",
                           f"{world.tablespace}={pgdata}-ts", "--no-sync"], cwd=world.base,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    auto_conf = (pgdata / "postgresql.auto.conf").read_text()
    assert f" -D {world.archive} %f %p'" in auto_conf, auto_conf


def test_sigterm_stops_a_backup_that_is_receiving_and_removes_it(world: World) -> None:
    """SIGTERM while the server sends (throttled to 32 kB/s, so data keeps coming): the
    backup stops within seconds, exits 1 saying so, and its directory is gone."""
    proc = subprocess.Popen([*RECEIVEWAL, "backup", "-D", str(world.archive), "-d",
                             world.pg.dsn, "--fast", "--max-rate", "32"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: started_backup(world, str(world.archive), running=True) is not None,
                 timeout=60, what="the backup to store its first file")
        backup_id = started_backup(world, str(world.archive), running=True)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert "base backup stopped before it was complete" in stderr
    assert not (world.archive / "backups" / str(backup_id)).exists()


def test_the_retention_policy_runs_after_a_backup_and_a_bad_one_before_it(
        world: World) -> None:
    """``backup --recovery-window`` applies the policy once the backup is complete and
    prints cleanup's plan (a window of ten years keeps every complete backup and the WAL from
    the oldest one's start); a policy that
    cannot be read is refused before any backup is started."""
    before = {p.name for p in (world.archive / "backups").iterdir()}
    done = run(world, "backup", "-D", str(world.archive), "-d", world.pg.dsn, "--fast",
               "--keep-backups", "0")
    assert done.returncode != 0
    assert "backups to keep" in done.stderr, done.stderr
    assert {p.name for p in (world.archive / "backups").iterdir()} == before
    done = run(world, "backup", "-D", str(world.archive), "-d", world.pg.dsn, "--fast",
               "--recovery-window", "3650d")
    assert done.returncode == 0, done.stderr
    new = backup_id_of(done.stdout)
    lines = done.stdout.splitlines()
    assert f"backup {world.local_id}: kept: " in done.stdout, done.stdout
    assert f"backup {new}: kept: " in done.stdout, done.stdout
    removed = [line for line in lines if line.startswith("backup ") and ": removed: " in line]
    # the SIGKILL test's directory, when it ran first on this world, is the one that goes
    assert all(line.endswith(": removed: an interrupted backup (no record, no writer)")
               for line in removed), done.stdout
    assert lines[-1].startswith(f"removed {len(removed)} backup"), lines[-1]
    assert any(line.endswith("recovers along timeline 1") and world.local_id in line
               for line in lines), done.stdout
    assert (world.archive / "backups" / world.local_id / "backup.json").is_file()
