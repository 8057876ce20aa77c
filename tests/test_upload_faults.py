"""``stream --upload-to`` when the store or the prefix misbehaves (issue 25): a store that takes
connections and never answers, an identity object that cannot be read, deleted or replaced
while uploading, an upload that hangs, a different object at a key, the backlog left at an
``--endpos`` exit. Against real PostgreSQL and a real S3 server (SeaweedFS), through a TCP
proxy where the store must stall."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.seaweed import SeaweedS3
from support.servers import PgServer, free_port
from support.streams import (
    complete_segments,
    log_events,
    lsn_to_int,
    receivewal,
    stop,
    wait_for,
)
from support.tcpproxy import TcpProxy
from test_metrics import scrape
from test_upload import keys, objects, prefix, status, store_env, stream, uploaded_all

from receivewal.archive.identity import IDENTITY_FILE, ArchiveIdentity, identity_to_json
from receivewal.daemon.metrics import Address
from receivewal.wal.lsn import format_lsn

pytestmark = pytest.mark.server

__all__ = ["prefix"]  # test_upload's fixture, used here too
SEGMENT = 16 * 1024 * 1024
SHORT = "1"  # seconds: the uploader's connect and read timeouts in these tests
OTHER_SYSTEM = "7399999999999999999"


@pytest.fixture
def proxy(seaweed: SeaweedS3) -> Iterator[TcpProxy]:
    """A TCP proxy in front of the store's S3 port, which a test can stall."""
    relay = TcpProxy(seaweed.ports["s3.port"])
    yield relay
    relay.close()


def proxied_env(seaweed: SeaweedS3, proxy: TcpProxy, **changes: str) -> dict[str, str]:
    """The daemon's environment with the store behind ``proxy`` and short store timeouts."""
    return store_env(seaweed, AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy.port}",
                     RECEIVEWAL_TEST_UPLOAD_TIMEOUT=SHORT, **changes)


def events(log: Path, name: str) -> list[dict[str, object]]:
    return [e for e in log_events(log.read_text()) if e["event"] == name]


def identity_of(seaweed: SeaweedS3, prefix: str) -> dict[str, object]:
    return dict(json.loads(objects(seaweed, prefix)[IDENTITY_FILE]))


def test_a_store_that_never_answers_at_start_holds_neither_streaming_nor_sigterm(
        pg: PgServer, seaweed: SeaweedS3, prefix: str, proxy: TcpProxy,
        tmp_path: Path) -> None:
    """The store accepts TCP and never answers: the prefix is claimed from the uploader's
    thread, so streaming starts at once (before: 15 minutes blocked before
    START_REPLICATION), the log and the state file say what the uploads wait for, and SIGTERM
    acts within seconds."""
    proxy.stall()
    archive, log = tmp_path / "archive", tmp_path / "log"
    archive.mkdir()
    proc = stream(pg, archive, f"s3://{seaweed.bucket}/{prefix}", log, timeout=30,
                  env=proxied_env(seaweed, proxy))
    try:
        assert events(log, "upload_claim_deferred")
        code, document = status(archive)  # written when the stream started
        assert code == 1, document["summary"]  # WARNING: the store does not answer
        assert "no answer to the claim of the prefix" in document["summary"]
        assert document["state"]["upload_error"]["kind"] == "StoreError"
        assert proxy.accepted >= 1  # it was asked, and said nothing
        pg.switch_wal()
        wait_for(lambda: len(complete_segments(archive)) >= 1, what="a local segment")
    finally:
        assert stop(proc, timeout=20) == 0
    assert "Traceback" not in log.read_text()


@pytest.mark.parametrize("body", [b'{"system_identifier": "73', b"{" + b" " * 70_000 + b"}"],
                         ids=["garbled", "oversized"])
def test_an_unreadable_identity_object_holds_the_uploads_and_streaming_goes_on(
        pg: PgServer, seaweed: SeaweedS3, prefix: str, tmp_path: Path, body: bytes) -> None:
    """A garbled or oversized identity object at the prefix: the daemon archives locally (it
    exited 1 before writing anything), uploads nothing, and status is CRITICAL naming the
    object; once the object is removed, the prefix is claimed and the backlog goes up."""
    key = f"{prefix}/{IDENTITY_FILE}"
    seaweed.client().put_object(Bucket=seaweed.bucket, Key=key, Body=body)
    archive, log = tmp_path / "archive", tmp_path / "log"
    archive.mkdir()
    proc = stream(pg, archive, f"s3://{seaweed.bucket}/{prefix}", log, env=store_env(seaweed))
    try:
        pg.switch_wal()
        wait_for(lambda: len(complete_segments(archive)) >= 1, what="a local segment")
        wait_for(lambda: status(archive)[0] == 2, what="status CRITICAL")
        summary = status(archive)[1]["summary"]
        assert f"s3://{seaweed.bucket}/{key}" in summary
        assert keys(seaweed, prefix) == {IDENTITY_FILE}  # nothing uploaded past it
        assert objects(seaweed, prefix)[IDENTITY_FILE] == body  # and left as it was
        seaweed.client().delete_object(Bucket=seaweed.bucket, Key=key)
        wait_for(lambda: uploaded_all(seaweed, prefix, archive), what="the backlog")
        assert identity_of(seaweed, prefix)["system_identifier"] == pg.sql(
            "SELECT system_identifier FROM pg_control_system()")
    finally:
        assert stop(proc) == 0
    assert "Traceback" not in log.read_text()


def test_the_identity_object_is_checked_again_while_uploading(
        pg: PgServer, seaweed: SeaweedS3, prefix: str, tmp_path: Path) -> None:
    """Deleted while the daemon uploads (by hand, or by an expiry rule: it is the oldest
    object), the identity object is written again before the next upload; replaced by another
    cluster's, the uploads stop there and status is CRITICAL naming it and both systems."""
    url, key = f"s3://{seaweed.bucket}/{prefix}", f"{prefix}/{IDENTITY_FILE}"
    archive, log = tmp_path / "archive", tmp_path / "log"
    archive.mkdir()
    client = seaweed.client()
    proc = stream(pg, archive, url, log,
                  env=store_env(seaweed, RECEIVEWAL_TEST_IDENTITY_RECHECK="0"))
    try:
        pg.switch_wal()
        wait_for(lambda: uploaded_all(seaweed, prefix, archive), what="a first upload")
        client.delete_object(Bucket=seaweed.bucket, Key=key)
        pg.switch_wal()
        wait_for(lambda: IDENTITY_FILE in keys(seaweed, prefix), what="the identity again")
        assert events(log, "identity_object_restored")
        mine = pg.sql("SELECT system_identifier FROM pg_control_system()")
        assert identity_of(seaweed, prefix)["system_identifier"] == mine
        wait_for(lambda: uploaded_all(seaweed, prefix, archive), what="the next upload")
        client.delete_object(Bucket=seaweed.bucket, Key=key)
        client.put_object(Bucket=seaweed.bucket, Key=key, Body=identity_to_json(
            ArchiveIdentity(OTHER_SYSTEM, 16 * 1024 * 1024, 1)))
        pg.switch_wal()
        wait_for(lambda: status(archive)[0] == 2, what="status CRITICAL")
        summary = status(archive)[1]["summary"]
        assert url in summary
        assert mine in summary
        assert OTHER_SYSTEM in summary
        assert not uploaded_all(seaweed, prefix, archive)  # nothing went up into its prefix
    finally:
        assert stop(proc) == 0
    assert "Traceback" not in log.read_text()


def test_a_hanging_upload_is_logged_within_one_try(
        pg: PgServer, seaweed: SeaweedS3, prefix: str, proxy: TcpProxy,
        tmp_path: Path) -> None:
    """The store stops answering in the middle of the uploads: each try is bounded by the
    uploader's short timeouts, so ``upload_failed`` comes within seconds (it took ~15 minutes:
    5 tries x boto3's 3 x 60 s), and the backlog goes up once the store answers again."""
    archive, log = tmp_path / "archive", tmp_path / "log"
    archive.mkdir()
    proc = stream(pg, archive, f"s3://{seaweed.bucket}/{prefix}", log,
                  env=proxied_env(seaweed, proxy))
    try:
        wait_for(lambda: IDENTITY_FILE in keys(seaweed, prefix), what="the claim")
        proxy.stall()
        pg.switch_wal()
        wait_for(lambda: events(log, "upload_failed"), timeout=20, what="upload_failed")
        failed = str(events(log, "upload_failed")[0]["error"])
        assert f"{prefix}/{complete_segments(archive)[0]}" in failed
        proxy.resume()
        wait_for(lambda: uploaded_all(seaweed, prefix, archive), what="the backlog")
    finally:
        assert stop(proc) == 0


def test_a_conflict_keeps_status_critical_and_shows_in_the_metrics(
        pg: PgServer, seaweed: SeaweedS3, prefix: str, proxy: TcpProxy,
        tmp_path: Path) -> None:
    """A different object at the next segment's key stops the uploads there: the metrics say
    so (stopped, the object), and status stays CRITICAL naming the object while the later
    tries of that file fail otherwise (the store not answering)."""
    segment = pg.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
    seaweed.client().put_object(Bucket=seaweed.bucket, Key=f"{prefix}/{segment}",
                                Body=b"planted")
    archive, log = tmp_path / "archive", tmp_path / "log"
    archive.mkdir()
    port = free_port()
    proc = stream(pg, archive, f"s3://{seaweed.bucket}/{prefix}", log,
                  "--metrics-address", f"127.0.0.1:{port}", env=proxied_env(seaweed, proxy))
    url = f"s3://{seaweed.bucket}/{prefix}/{segment}"
    try:
        pg.switch_wal()
        wait_for(lambda: scrape(Address("127.0.0.1", port)).get(
            ("receivewal_upload_stopped", ())) == 1, what="the stop in the metrics")
        metrics = scrape(Address("127.0.0.1", port))
        assert metrics[("receivewal_upload_stopped_object_info",
                        (("kind", "ObjectConflict"), ("object", url)))] == 1
        proxy.stall()
        wait_for(lambda: (status(archive)[1]["state"]["upload_error"] or {}).get("kind")
                 == "StoreError", what="a later try failing otherwise, in the state file")
        code, document = status(archive)
        assert code == 2, document["summary"]
        assert url in document["summary"]
        proxy.resume()
    finally:
        assert stop(proc) == 0


def test_an_endpos_exit_uploads_what_it_completed_or_says_what_is_left(
        pg: PgServer, seaweed: SeaweedS3, prefix: str, proxy: TcpProxy,
        tmp_path: Path) -> None:
    """--endpos with the store not answering: the exit waits --upload-wait seconds, then is
    1 with a line naming the files not uploaded (it was 0, with the backlog left silently).
    Run again with the store back: the exit at --endpos comes once every completed file is
    in the bucket."""
    first = lsn_to_int(pg.current_lsn()) // SEGMENT
    endpos = format_lsn((first + 3) * SEGMENT + 0x100)  # in the fourth segment
    archive, log = tmp_path / "archive", tmp_path / "log"
    archive.mkdir()
    url = f"s3://{seaweed.bucket}/{prefix}"
    env = proxied_env(seaweed, proxy, RECEIVEWAL_UPLOAD_WAIT="2")  # --upload-wait 2
    proxy.stall()
    proc = stream(pg, archive, url, log, "-E", endpos, env=env)
    for _ in range(4):
        pg.switch_wal()
    assert proc.wait(timeout=60) == 1
    completed = complete_segments(archive)
    assert len(completed) == 3
    failed = events(log, "failed")
    assert len(failed) == 1
    assert f"3 completed files not uploaded to {url}" in str(failed[0]["error"])
    assert completed[-1] in str(failed[0]["error"])
    assert "Traceback" not in log.read_text()
    proxy.resume()
    env["RECEIVEWAL_UPLOAD_WAIT"] = "45"  # a bound, not a pause: a loaded machine needs seconds
    done = receivewal("stream", "-D", str(archive), "-d", pg.dsn, "--upload-to", url,
                      "-E", endpos, "--log-format", "json", env=env, timeout=90)
    assert done.returncode == 0, done.stderr
    assert set(completed) <= keys(seaweed, prefix)


def test_a_segment_damaged_before_its_upload_is_refused_and_never_confirmed(
        pg: PgServer, seaweed: SeaweedS3, prefix: str, tmp_path: Path) -> None:
    """A completed local segment is damaged (one flipped bit) while it waits for the store:
    the uploader checks it first (page headers, record CRCs, the system identifier), refuses
    it and every segment after it (uploads go in order), status is CRITICAL naming the
    object, and with --confirm-after upload the slot never passes its start: the server
    keeps the only good copy. Before: the damaged file was uploaded as it was and the slot
    released the WAL."""
    pg.sql("SELECT pg_create_physical_replication_slot('held', true)")
    archive, log = tmp_path / "archive", tmp_path / "log"
    archive.mkdir()
    proc = stream(pg, archive, f"s3://{seaweed.bucket}/{prefix}", log, "-S", "held",
                  "--confirm-after", "upload", "-s", "0.2", env=store_env(seaweed))
    try:
        pg.generate_wal(1)
        wait_for(lambda: uploaded_all(seaweed, prefix, archive), what="a first upload")
        before = set(complete_segments(archive))
        seaweed.kill()
        try:
            pg.generate_wal(2)
            wait_for(lambda: len(set(complete_segments(archive)) - before) >= 2,
                     what="two segments completed while the store is down")
            damaged = min(set(complete_segments(archive)) - before)
            path = archive / damaged
            data = bytearray(path.read_bytes())
            data[SEGMENT // 2 + 1000] ^= 0x10
            path.write_bytes(bytes(data))
        finally:
            seaweed.start()
        wait_for(lambda: events(log, "upload_refused"), timeout=60,
                 what="the damaged segment refused")
        refused = events(log, "upload_refused")[0]
        assert damaged in str(refused["error"])
        assert "not uploaded" in str(refused["error"])
        assert damaged not in keys(seaweed, prefix)
        later = set(complete_segments(archive)) - before - {damaged}
        assert later
        assert not later & keys(seaweed, prefix)
        wait_for(lambda: status(archive)[0] == 2, what="status CRITICAL")
        assert damaged in status(archive)[1]["summary"]
        start = (int(damaged[8:16], 16) * 0x100 + int(damaged[16:], 16)) * SEGMENT
        restart = pg.sql("SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = "
                         "'held'")
        assert lsn_to_int(restart) <= start
    finally:
        stop(proc)
