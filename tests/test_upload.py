"""``receivewal stream --upload-to s3://BUCKET/PREFIX`` against real PostgreSQL and a real S3
server (SeaweedFS): every completed segment and history file reaches the bucket, in the
archive's at-rest format, whatever happens to the store or to the daemon meanwhile."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import zstandard
from support.seaweed import SeaweedS3
from support.servers import PgServer, pg_bin, running_server
from support.streams import (
    complete_segments,
    log_events,
    lsn_to_int,
    receivewal,
    slot_restart_lsn,
    start_receivewal,
    stop,
    wait_for,
)

from receivewal.archive.identity import IDENTITY_FILE

pytestmark = pytest.mark.server

SEGMENT = 16 * 1024 * 1024
_prefixes = itertools.count()


@pytest.fixture
def prefix(seaweed: SeaweedS3) -> str:
    """A fresh prefix of the module's bucket."""
    return f"upload-{next(_prefixes)}"


def store_env(seaweed: SeaweedS3, **changes: str) -> dict[str, str]:
    """The daemon's environment: boto3's chain pointed at the test store, short retries."""
    return {**seaweed.env(), "RECEIVEWAL_TEST_UPLOAD_RETRY": "0.05", **changes}


def keys(seaweed: SeaweedS3, prefix: str) -> set[str]:
    """The names of the objects under ``prefix/``, listed with the test's own client."""
    pages = seaweed.client().get_paginator("list_objects_v2").paginate(
        Bucket=seaweed.bucket, Prefix=f"{prefix}/")
    return {item["Key"][len(prefix) + 1:] for page in pages for item in page.get("Contents", ())}


def objects(seaweed: SeaweedS3, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix/``, read with the test's own client."""
    client = seaweed.client()
    return {name: bytes(client.get_object(Bucket=seaweed.bucket,
                                          Key=f"{prefix}/{name}")["Body"].read())
            for name in keys(seaweed, prefix)}


def stream(pg: PgServer, archive: Path, url: str, log: Path, *extra: str,
           env: dict[str, str], timeout: float = 60) -> subprocess.Popen[bytes]:
    """``receivewal stream --upload-to URL``, returned once it streams (within ``timeout``
    seconds)."""
    proc = start_receivewal("stream", "-D", str(archive), "-d", pg.dsn, "--upload-to", url,
                            "--log-format", "json", *extra, env=env, stderr_path=log)
    try:
        wait_for(lambda: '"streaming_started"' in log.read_text() or proc.poll() is not None,
                 timeout=timeout, what="streaming")
    except BaseException:
        proc.kill()
        raise
    assert proc.poll() is None, log.read_text()
    return proc


def status(archive: Path) -> tuple[int, dict[str, Any]]:
    result = receivewal("status", "-D", str(archive), "--json")
    return result.returncode, json.loads(result.stdout)


def uploaded_all(seaweed: SeaweedS3, prefix: str, archive: Path) -> bool:
    local = set(complete_segments(archive))
    return bool(local) and local <= keys(seaweed, prefix)


def run_pgbench(pg: PgServer, seconds: int) -> subprocess.Popen[bytes]:
    common = ["-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres"]
    subprocess.run([pg_bin("pgbench"), "-i", "-q", "-s", "2", *common, "postgres"],
                   check=True, capture_output=True)
    return subprocess.Popen([pg_bin("pgbench"), "-n", "-c", "2", "-T", str(seconds), *common,
                             "postgres"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def upload_two_segments(pg: PgServer, seaweed: SeaweedS3, prefix: str, tmp_path: Path,
                        *extra: str) -> tuple[Path, dict[str, bytes]]:
    """Stream with --upload-to (and ``extra``) until two segments are complete and uploaded,
    stop cleanly; the archive directory and the objects under the prefix."""
    archive = tmp_path / "archive"
    archive.mkdir()
    proc = stream(pg, archive, f"s3://{seaweed.bucket}/{prefix}", tmp_path / "log", *extra,
                  env=store_env(seaweed))
    try:
        pg.generate_wal(2)
        wait_for(lambda: len(complete_segments(archive)) >= 2, what="two segments")
        wait_for(lambda: uploaded_all(seaweed, prefix, archive), what="uploads")
    finally:
        assert stop(proc) == 0
    return archive, objects(seaweed, prefix)


def test_uploads_are_the_servers_segments_plain_with_the_identity_object(
        pg: PgServer, seaweed: SeaweedS3, prefix: str, tmp_path: Path) -> None:
    """Plain at rest: each uploaded segment is byte for byte the server's own file, and the
    prefix carries the cluster's identity object."""
    archive, stored = upload_two_segments(pg, seaweed, prefix, tmp_path)
    names = complete_segments(archive)
    for name in names:
        assert stored[name] == (pg.pg_wal / name).read_bytes(), name
    identity = json.loads(stored[IDENTITY_FILE])
    assert str(identity["system_identifier"]) == pg.sql(
        "SELECT system_identifier FROM pg_control_system()")


def test_uploads_are_the_archive_files_as_they_sit_with_zstd(
        pg: PgServer, seaweed: SeaweedS3, prefix: str, tmp_path: Path) -> None:
    """-Z zstd: the objects are the .zst files, and they decompress to the server's segments."""
    archive, stored = upload_two_segments(pg, seaweed, prefix, tmp_path, "-Z", "zstd")
    for name in complete_segments(archive):
        assert name.endswith(".zst")
        assert stored[name] == (archive / name).read_bytes()
        plain = zstandard.ZstdDecompressor().decompressobj().decompress(stored[name])
        assert plain == (pg.pg_wal / name.removesuffix(".zst")).read_bytes(), name


def test_a_store_killed_while_pgbench_writes_gets_every_segment_after_its_restart(
        pg: PgServer, seaweed: SeaweedS3, prefix: str, tmp_path: Path) -> None:
    """The store SIGKILLed mid-upload: streaming goes on locally, and once the store is back
    every completed segment arrives, identical to the local file."""
    archive = tmp_path / "archive"
    archive.mkdir()
    proc = stream(pg, archive, f"s3://{seaweed.bucket}/{prefix}", tmp_path / "log",
                  env=store_env(seaweed))
    bench = run_pgbench(pg, seconds=60)
    try:
        wait_for(lambda: set(complete_segments(archive)) & keys(seaweed, prefix),
                 what="a first upload")
        seaweed.kill()
        try:
            before = len(complete_segments(archive))
            pg.generate_wal(2)
            wait_for(lambda: len(complete_segments(archive)) >= before + 2,
                     what="streaming going on while the store is down")
            wait_for(lambda: status(archive)[1]["state"]["upload_pending_files"] >= 2,
                     what="the backlog in the state file")
            code, document = status(archive)
            assert document["state"]["upload_error"]["kind"] == "StoreError"
            assert code == 1, document["summary"]  # WARNING: the store is down
        finally:
            seaweed.start()
        bench.terminate()
        bench.wait(timeout=30)
        pg.switch_wal()
        wait_for(lambda: uploaded_all(seaweed, prefix, archive), timeout=90, what="the backlog")
    finally:
        bench.kill()
        bench.wait()
        assert stop(proc) == 0
    stored = objects(seaweed, prefix)
    for name in complete_segments(archive):
        assert stored[name] == (archive / name).read_bytes(), name
    assert status(archive)[1]["state"]["upload_pending_files"] == 0


def test_a_different_object_at_a_key_is_a_hard_error_and_stays_as_it_was(
        pg: PgServer, seaweed: SeaweedS3, prefix: str, tmp_path: Path) -> None:
    """An object planted at the next segment's key is never overwritten nor passed over:
    uploads stop there, the log and status (CRITICAL) name the key, streaming goes on."""
    archive = tmp_path / "archive"
    archive.mkdir()
    segment = pg.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
    client = seaweed.client()
    client.put_object(Bucket=seaweed.bucket, Key=f"{prefix}/{segment}", Body=b"planted")
    proc = stream(pg, archive, f"s3://{seaweed.bucket}/{prefix}", tmp_path / "log",
                  env=store_env(seaweed))
    try:
        pg.generate_wal(2)
        wait_for(lambda: len(complete_segments(archive)) >= 2, what="two segments")
        wait_for(lambda: status(archive)[1]["state"]["upload_error"] is not None,
                 what="the conflict in the state file")
        code, document = status(archive)
        assert code == 2, document["summary"]
        assert document["state"]["upload_error"]["kind"] == "ObjectConflict"
        assert f"{prefix}/{segment}" in document["summary"]
    finally:
        assert stop(proc) == 0
    stored = objects(seaweed, prefix)
    assert stored[segment] == b"planted"
    assert not set(complete_segments(archive)) - {segment} & set(stored)  # nothing past it
    log = (tmp_path / "log").read_text()
    assert '"upload_conflict"' in log
    assert "Traceback" not in log


def test_a_second_cluster_on_the_same_prefix_is_refused_and_writes_nothing(
        pg: PgServer, seaweed: SeaweedS3, prefix: str, tmp_path: Path) -> None:
    """One cluster per prefix: the daemon of another cluster exits 1 naming both system
    identifiers, before streaming, and the prefix holds only the first cluster's identity."""
    url = f"s3://{seaweed.bucket}/{prefix}"
    first = tmp_path / "first"
    first.mkdir()
    proc = stream(pg, first, url, tmp_path / "log1", env=store_env(seaweed))
    try:
        wait_for(lambda: IDENTITY_FILE in keys(seaweed, prefix), what="the claim")
    finally:
        assert stop(proc) == 0
    before = objects(seaweed, prefix)
    mine = pg.sql("SELECT system_identifier FROM pg_control_system()")
    with running_server(name="other") as other:
        theirs = other.sql("SELECT system_identifier FROM pg_control_system()")
        second = tmp_path / "second"
        second.mkdir()
        other.generate_wal(1)
        result = receivewal("stream", "-D", str(second), "-d", other.dsn, "--upload-to", url,
                            "--log-format", "json", env=store_env(seaweed), timeout=60)
    assert result.returncode == 1
    assert mine in result.stderr
    assert theirs in result.stderr
    assert "Traceback" not in result.stderr
    assert objects(seaweed, prefix) == before
    assert complete_segments(second) == []
    assert not (second / IDENTITY_FILE).exists()  # refused before the local archive was claimed


def test_wrong_credentials_streaming_goes_on_and_status_is_critical(
        pg: PgServer, seaweed: SeaweedS3, prefix: str, tmp_path: Path) -> None:
    """A rejected secret: segments keep arriving locally, status is CRITICAL with an error
    that says access was denied, and nothing is uploaded."""
    archive = tmp_path / "archive"
    archive.mkdir()
    env = store_env(seaweed, AWS_SECRET_ACCESS_KEY="not-the-secret")  # noqa: S106 - wrong on purpose
    proc = stream(pg, archive, f"s3://{seaweed.bucket}/{prefix}", tmp_path / "log", env=env)
    try:
        pg.generate_wal(2)
        wait_for(lambda: len(complete_segments(archive)) >= 2, what="local streaming")
        wait_for(lambda: status(archive)[1]["state"]["upload_pending_files"] >= 2,
                 what="the backlog in the state file")
        code, document = status(archive)
        assert code == 2, document["summary"]
        assert "access denied" in document["summary"]
        assert document["state"]["upload_error"]["kind"] == "StoreAccessDenied"
    finally:
        assert stop(proc) == 0
    assert objects(seaweed, prefix) == {}


def test_confirm_after_upload_holds_the_slot_while_the_store_is_down(
        pg: PgServer, seaweed: SeaweedS3, prefix: str, tmp_path: Path) -> None:
    """--confirm-after upload: restart_lsn never passes the end of the last uploaded segment
    while the store is down, and moves on once the backlog is uploaded."""
    pg.sql("SELECT pg_create_physical_replication_slot('held', true)")
    archive = tmp_path / "archive"
    archive.mkdir()
    proc = stream(pg, archive, f"s3://{seaweed.bucket}/{prefix}", tmp_path / "log",
                  "-S", "held", "--confirm-after", "upload", "-s", "0.2",
                  env=store_env(seaweed))
    try:
        pg.generate_wal(1)
        wait_for(lambda: uploaded_all(seaweed, prefix, archive), what="a first upload")
        seaweed.kill()
        try:
            uploaded = max(objects_before := complete_segments(archive))
            end = (int(uploaded[8:16], 16) * 0x100 + int(uploaded[16:], 16) + 1) * SEGMENT
            pg.generate_wal(3)
            wait_for(lambda: len(complete_segments(archive)) >= len(objects_before) + 3,
                     what="local streaming")
            wait_for(lambda: lsn_to_int(status(archive)[1]["state"]["flushed_lsn"] or "0/0")
                     > end + 2 * SEGMENT, what="the state file to show the local flush")
            # durable locally (and reported with the cap) two segments past the uploads...
            assert slot_restart_lsn(pg, "held") <= end  # ...but the slot holds
        finally:
            seaweed.start()
        pg.switch_wal()
        wait_for(lambda: uploaded_all(seaweed, prefix, archive), timeout=60, what="the backlog")
        last = max(complete_segments(archive))
        last_end = (int(last[8:16], 16) * 0x100 + int(last[16:], 16) + 1) * SEGMENT
        wait_for(lambda: slot_restart_lsn(pg, "held") >= last_end, what="the slot to move")
    finally:
        assert stop(proc) == 0


def test_a_daemon_killed_between_upload_and_record_resumes_without_loss(
        pg: PgServer, seaweed: SeaweedS3, prefix: str, tmp_path: Path) -> None:
    """SIGKILL after a segment is in the store but before the local record says so: the next
    run finds its own object (same checksum: success), nothing is overwritten or skipped, and
    every segment arrives once."""
    archive = tmp_path / "archive"
    archive.mkdir()
    url = f"s3://{seaweed.bucket}/{prefix}"
    marker = tmp_path / "paused"
    proc = stream(pg, archive, url, tmp_path / "log",
                  env=store_env(seaweed, RECEIVEWAL_TEST_UPLOAD_PAUSE=str(marker)))
    try:
        pg.generate_wal(2)
        wait_for(lambda: marker.exists() and marker.read_text() != "",
                 what="the uploader paused after a put")  # created, then written
        paused = marker.read_text()
        assert paused in keys(seaweed, prefix)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    proc = stream(pg, archive, url, tmp_path / "log2", env=store_env(seaweed))
    try:
        pg.generate_wal(1)
        wait_for(lambda: uploaded_all(seaweed, prefix, archive), what="every upload")
    finally:
        assert stop(proc) == 0
    stored = objects(seaweed, prefix)
    for name in complete_segments(archive):
        assert stored[name] == (pg.pg_wal / name).read_bytes(), name
    log = (tmp_path / "log2").read_text()
    assert "Traceback" not in log
    assert '"upload_conflict"' not in log


def test_a_promotion_uploads_the_history_file_before_the_new_timelines_segments(
        pg: PgServer, seaweed: SeaweedS3, prefix: str, tmp_path: Path) -> None:
    """Streaming from a standby that is promoted: 00000002.history goes up, identical to the
    server's, before any segment of timeline 2, and every completed file arrives."""
    standby = pg.make_standby("standby")
    archive = tmp_path / "archive"
    archive.mkdir()
    log = tmp_path / "log"
    proc = stream(standby, archive, f"s3://{seaweed.bucket}/{prefix}", log, "-s", "0.5",
                  env=store_env(seaweed))
    try:
        pg.generate_wal(1)
        pg.stop("fast")
        standby.promote()
        standby.generate_wal(1, table="after_promotion")
        wait_for(lambda: any(n.startswith("00000002") for n in complete_segments(archive))
                 and uploaded_all(seaweed, prefix, archive)
                 and "00000002.history" in keys(seaweed, prefix), what="timeline 2 uploaded")
    finally:
        assert stop(proc) == 0
        standby.stop("immediate")
    stored = objects(seaweed, prefix)
    assert stored["00000002.history"] == (standby.pg_wal / "00000002.history").read_bytes()
    order = [str(event["file"]) for event in log_events(log.read_text())
             if event["event"] == "file_uploaded"]
    first_tl2 = min(i for i, name in enumerate(order) if name.startswith("00000002000"))
    assert order.index("00000002.history") < first_tl2


def test_confirm_after_upload_never_moves_the_slot_back_to_an_old_backlog(
        pg: PgServer, seaweed: SeaweedS3, prefix: str, tmp_path: Path) -> None:
    """An archive streamed without uploads, then run with --confirm-after upload: while the
    old backlog goes up (here: stuck after its first segment, at a planted object), the slot
    stays where the first run left it, though a physical slot would take an older position."""
    pg.sql("SELECT pg_create_physical_replication_slot('kept', true)")
    archive = tmp_path / "archive"
    archive.mkdir()
    first = start_receivewal("stream", "-D", str(archive), "-d", pg.dsn, "-S", "kept",
                             "-s", "0.2", "--log-format", "json", stderr_path=tmp_path / "log1")
    try:
        pg.generate_wal(3)
        wait_for(lambda: len(complete_segments(archive)) >= 3, what="three segments")
        end = lsn_to_int(pg.sql("SELECT pg_current_wal_lsn()"))
        wait_for(lambda: slot_restart_lsn(pg, "kept") >= end - SEGMENT, what="the slot")
    finally:
        assert stop(first) == 0
    kept = slot_restart_lsn(pg, "kept")
    backlog = complete_segments(archive)
    seaweed.client().put_object(Bucket=seaweed.bucket, Key=f"{prefix}/{backlog[1]}",
                                Body=b"planted")
    proc = stream(pg, archive, f"s3://{seaweed.bucket}/{prefix}", tmp_path / "log2",
                  "-S", "kept", "-s", "0.2", "--confirm-after", "upload", env=store_env(seaweed))
    try:
        wait_for(lambda: (status(archive)[1]["state"]["upload_error"] or {}).get("kind")
                 == "ObjectConflict", what="the upload stuck at the planted object")
        assert backlog[0] in keys(seaweed, prefix)  # uploaded: its end is far behind the slot
        asked = pg.sql("SELECT now()")
        wait_for(lambda: pg.sql("SELECT count(*) FROM pg_stat_replication WHERE reply_time > "
                                f"'{asked}'") == "1", what="a status update after that")
        assert slot_restart_lsn(pg, "kept") == kept
    finally:
        assert stop(proc) == 0


def test_confirm_after_upload_after_a_fork_inside_the_archive_holds_the_slot(
        pg: PgServer, seaweed: SeaweedS3, prefix: str, tmp_path: Path) -> None:
    """The archive (and the bucket) hold timeline 1 well past the point where a promoted
    standby's timeline 2 forked from it (issue 31: such an archive goes on with the new
    primary). With --confirm-after upload on the new primary, the end of timeline 1's uploads
    is no measure of timeline 2's: while the store is down, nothing of timeline 2 is uploaded
    and the slot stays where it was created; once the store is back and timeline 2's segments
    are up, it moves on."""
    url = f"s3://{seaweed.bucket}/{prefix}"
    standby = pg.make_standby("standby")
    try:
        pg.generate_wal(1)
        before_fork = pg.endpos_inside_the_wal()
        archive = tmp_path / "archive"
        archive.mkdir()
        done = receivewal("stream", "-D", str(archive), "-d", pg.dsn, "-E", before_fork, "-n",
                          "--upload-to", url, env=store_env(seaweed))
        assert done.returncode == 0, done.stderr
        lsn = pg.current_lsn()
        wait_for(lambda: standby.sql(f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'") == "t",
                 what="replay")
        standby.promote()
        pg.generate_wal(4)  # the old primary goes on, into the archive and the bucket
        ahead = pg.endpos_inside_the_wal()
        done = receivewal("stream", "-D", str(archive), "-d", pg.dsn, "-E", ahead, "-n",
                          "--upload-to", url, env=store_env(seaweed))
        assert done.returncode == 0, done.stderr
        assert uploaded_all(seaweed, prefix, archive)
        standby.sql("SELECT pg_create_physical_replication_slot('held', true)")
        created = slot_restart_lsn(standby, "held")
        seaweed.kill()
        proc = None
        try:
            proc = stream(standby, archive, url, tmp_path / "log", "-S", "held",
                          "--confirm-after", "upload", "-s", "0.2", env=store_env(seaweed))
            standby.generate_wal(1, table="on_two")
            last = standby.sql("SELECT pg_walfile_name(pg_current_wal_lsn() - 1)")
            wait_for(lambda: last in complete_segments(archive), what="local streaming")
            asked = standby.sql("SELECT now()")
            wait_for(lambda: standby.sql(
                "SELECT count(*) FROM pg_stat_replication WHERE reply_time > "
                f"'{asked}'") == "1", what="a status update after that")
            assert slot_restart_lsn(standby, "held") == created
            seaweed.start()
            wait_for(lambda: last in keys(seaweed, prefix), timeout=60, what="timeline 2 up")
            wait_for(lambda: slot_restart_lsn(standby, "held") > created,
                     what="the slot to move")
        finally:
            if seaweed.process is None:
                seaweed.start()
            if proc is not None:
                assert stop(proc) == 0
    finally:
        standby.stop("immediate")
