"""``backup``, ``recover`` and ``cleanup`` on an archive in a bucket when the store hangs, goes
away or the backup is killed mid-upload (issue 32 item 4, issue 31 item 11), against a real
PostgreSQL 15 and SeaweedFS. Every store call is bounded (RECEIVEWAL_STORE_TIMEOUT, shortened
here), a line on standard error says within seconds what is waited for, SIGTERM ends each
command at once, and nothing that is not in the bucket in full ever says complete: an
interrupted backup is never chosen by ``recover``, ``verify`` lists it, and ``cleanup`` against
a store that is down removes nothing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.agekeys import age_keygen
from support.seaweed import SeaweedS3
from support.servers import PgServer, make_shared_dir
from support.streams import RECEIVEWAL, receivewal, start_streaming, stop, wait_for
from support.tcpproxy import SilentListener, TcpProxy

pytestmark = pytest.mark.server

PREFIX = "hung"
SHORT = {"RECEIVEWAL_STORE_TIMEOUT": "1"}  # a request waits 1 s for the store's answer
LONG = {"RECEIVEWAL_STORE_TIMEOUT": "600"}  # longer than any test waits: SIGTERM must not


@dataclass
class World:
    base: Path
    pg: PgServer
    seaweed: SeaweedS3
    url: str
    complete: str  # a complete backup in the bucket

    def env(self, endpoint: str | None = None, **extra: str) -> dict[str, str]:
        """The store's settings (its endpoint replaced by ``endpoint``) and ``extra``."""
        env = {**self.seaweed.env(), **extra}
        if endpoint is not None:
            env["AWS_ENDPOINT_URL"] = endpoint
        return env

    def stored(self) -> list[str]:
        """Every object of the prefix, through the real store."""
        client = self.seaweed.client()
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=self.seaweed.bucket, Prefix=f"{PREFIX}/")
        return sorted(item["Key"] for page in pages for item in page.get("Contents", ()))

    def uploads(self) -> list[tuple[str, str]]:
        """(key, upload ID) of the unfinished multipart uploads under the backups."""
        listed = self.seaweed.client().list_multipart_uploads(
            Bucket=self.seaweed.bucket, Prefix=f"{PREFIX}/backups/")
        return [(item["Key"], item["UploadId"]) for item in listed.get("Uploads", ())]

    def drop_uploads(self) -> None:
        client = self.seaweed.client()
        for key, upload_id in self.uploads():
            client.abort_multipart_upload(Bucket=self.seaweed.bucket, Key=key,
                                          UploadId=upload_id)


def backup_id_of(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert " complete: " in first, done.stdout
    return first.split()[1]


@pytest.fixture(scope="module")
def world(seaweed: SeaweedS3) -> Iterator[World]:
    base = make_shared_dir("receivewal-hungstore-")
    pg = PgServer(base, "primary")
    streamer = None
    try:
        pg.init(initdb_args=("--wal-segsize=1",))
        pg.start()
        pg.sql("CREATE TABLE filler AS SELECT g AS id, md5(g::text) AS pad "
               "FROM generate_series(1, 20000) g")
        archive = base / "archive"
        archive.mkdir()
        url = f"s3://{seaweed.bucket}/{PREFIX}"
        streamer = start_streaming("-D", str(archive), "-d", pg.dsn, "--upload-to", url,
                                   log=base / "stream.log", env=seaweed.env())
        complete = backup_id_of(receivewal("backup", "-D", url, "-d", pg.dsn, "--fast",
                                           timeout=180, env=seaweed.env()))
        yield World(base, pg, seaweed, url, complete)
    finally:
        if streamer is not None:
            stop(streamer)
        pg.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def silent() -> Iterator[SilentListener]:
    listener = SilentListener()
    try:
        yield listener
    finally:
        listener.close()


def command(world: World, name: str, target: Path) -> list[str]:
    """The argv of ``name`` (backup, recover, cleanup) on the world's bucket."""
    if name == "backup":
        return ["backup", "-D", world.url, "-d", world.pg.dsn, "--fast"]
    if name == "recover":
        return ["recover", "latest", "-D", world.url, "--to", str(target)]
    return ["cleanup", "-D", world.url, "--keep-backups", "1"]


def waiting_line(stderr: str, endpoint: str) -> str:
    """The line that says the command waits for the store at ``endpoint``."""
    lines = [line for line in stderr.splitlines()
             if line.startswith(f"receivewal: waiting for the object store at {endpoint}")]
    assert len(lines) >= 1, stderr
    return lines[0]


@pytest.mark.parametrize("name", ["recover", "cleanup", "backup"])
def test_a_store_that_never_answers_fails_each_command_bounded_saying_what_it_waits_for(
        world: World, silent: SilentListener, tmp_path: Path, name: str) -> None:
    """A store that accepts connections and never answers a byte: the command says within
    seconds, on standard error, that it waits for the store at that endpoint, gives up when
    the bounded tries have timed out (not after minutes: it was 357 s to 905 s), with one error
    line naming the endpoint, exit 1; nothing says complete and nothing is removed."""
    endpoint = f"http://127.0.0.1:{silent.port}"
    before = world.stored()
    done = receivewal(*command(world, name, tmp_path / "pgdata"), timeout=150,
                      env=world.env(endpoint, **SHORT))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "complete" not in done.stdout
    assert done.stdout == "" or name != "cleanup", done.stdout
    waiting_line(done.stderr, endpoint)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("receivewal: error: "), done.stderr
    assert endpoint in last, done.stderr
    assert "Traceback" not in done.stderr
    assert world.stored() == before
    assert not (tmp_path / "pgdata").exists() or not any((tmp_path / "pgdata").iterdir())


@pytest.mark.parametrize("name", ["backup", "recover", "cleanup"])
def test_sigterm_ends_a_command_waiting_on_a_hung_store_at_once(
        world: World, silent: SilentListener, tmp_path: Path, name: str) -> None:
    """SIGTERM while a request waits on a store that never answers (each request would wait
    600 s): the command ends at once, not when the request times out; backup (which handles
    the signal to give its upload up) exits 1 saying it was stopped, recover and cleanup end
    by the signal; nothing is removed."""
    endpoint = f"http://127.0.0.1:{silent.port}"
    before = world.stored()
    proc = subprocess.Popen([*RECEIVEWAL, *command(world, name, tmp_path / "pgdata")],
                            env={**os.environ, **world.env(endpoint, **LONG)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: silent.held, timeout=60, what="a request to the silent store")
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    if name == "backup":
        assert proc.returncode == 1, stdout + stderr
        last = stderr.strip().splitlines()[-1]
        assert last.startswith("receivewal: error: "), stderr
        assert "stopped by SIGTERM" in last, stderr
        assert endpoint in last, stderr
    else:
        assert proc.returncode == -signal.SIGTERM, stdout + stderr
    assert "complete" not in stdout
    assert world.stored() == before


def test_a_backup_stalled_mid_upload_fails_bounded_and_records_nothing(
        world: World, tmp_path: Path) -> None:
    """The store stalls in the middle of the base archive's upload (a proxy that stops
    forwarding after 64 KiB): the backup says what it waits for, gives up when its bounded
    tries have timed out, exit 1 with one error line, and no record of it is in the bucket;
    recover still starts from the complete backup."""
    proxy = TcpProxy(world.seaweed.ports["s3.port"])
    endpoint = f"http://127.0.0.1:{proxy.port}"
    before = world.stored()
    try:
        proxy.stall_after(64 << 10)
        done = receivewal(*command(world, "backup", tmp_path), timeout=150,
                          env=world.env(endpoint, **SHORT))
        assert proxy.stalled.is_set()
    finally:
        proxy.close()
    assert done.returncode == 1, done.stdout + done.stderr
    assert "complete" not in done.stdout
    waiting_line(done.stderr, endpoint)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("receivewal: error: "), done.stderr
    assert endpoint in last, done.stderr
    assert [key for key in world.stored() if key.endswith("/backup.json")] == \
        [key for key in before if key.endswith("/backup.json")]
    world.drop_uploads()  # the upload's abort could not reach the store either
    recovered = receivewal("recover", "latest", "-D", world.url, "--to",
                           str(tmp_path / "pgdata"), "--no-sync", env=world.env())
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert recovered.stdout.startswith(f"backup {world.complete} "), recovered.stdout


def test_sigterm_ends_a_backup_stalled_mid_upload_at_once(world: World, tmp_path: Path) -> None:
    """SIGTERM while the base archive's upload waits on a store that stalled (each request
    would wait 600 s; a hung backup took ~55 s to honour SIGTERM): exit 1 at once, saying it
    was stopped while it waited for the store, and no record of it in the bucket."""
    proxy = TcpProxy(world.seaweed.ports["s3.port"])
    endpoint = f"http://127.0.0.1:{proxy.port}"
    before = [key for key in world.stored() if key.endswith("/backup.json")]
    try:
        proxy.stall_after(64 << 10)
        proc = subprocess.Popen([*RECEIVEWAL, *command(world, "backup", tmp_path)],
                                env={**os.environ, **world.env(endpoint, **LONG)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(proxy.stalled.is_set, timeout=120, what="the upload to stall")
            proc.send_signal(signal.SIGTERM)
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            proc.kill()
            proc.wait()
    finally:
        proxy.close()
    assert proc.returncode == 1, stdout + stderr
    assert "complete" not in stdout
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("receivewal: error: base backup stopped by SIGTERM while it waited "
                           f"for the object store at {endpoint}"), stderr
    assert [key for key in world.stored() if key.endswith("/backup.json")] == before
    world.drop_uploads()  # its abort could not reach the stalled store


@pytest.mark.parametrize("name", ["recover", "cleanup"])
def test_a_store_that_is_down_fails_recover_and_cleanup_bounded_removing_nothing(
        world: World, tmp_path: Path, name: str) -> None:
    """The store refuses connections (the proxy in front of it closed): recover and cleanup
    fail after their bounded retries, exit 1, one error line naming the endpoint; cleanup
    removes nothing, recover writes nothing."""
    proxy = TcpProxy(world.seaweed.ports["s3.port"])
    endpoint = f"http://127.0.0.1:{proxy.port}"
    proxy.close()
    before = world.stored()
    done = receivewal(*command(world, name, tmp_path / "pgdata"), timeout=150,
                      env=world.env(endpoint, **SHORT))
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines()
              if not line.startswith("receivewal: waiting for")]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith("receivewal: error: "), done.stderr
    assert endpoint in errors[0]
    assert world.stored() == before
    assert not (tmp_path / "pgdata").exists() or not any((tmp_path / "pgdata").iterdir())


def test_a_backup_killed_mid_multipart_is_never_chosen_and_verify_lists_it(
        world: World, tmp_path: Path) -> None:
    """SIGKILL while the base archive's multipart upload is under way (the store stalled
    behind a proxy, so the backup is caught there): no record, so ``recover latest`` starts
    from the previous complete backup, ``verify`` lists the killed one as no backup, and
    ``cleanup`` keeps it (it may still be uploading, until it is abandoned). Sealed, so that
    the killed backup has an object (the recipients object goes before the archive); last in
    the module, as it lists a recipient in the archive's identity."""
    key = age_keygen(tmp_path / "key.txt")
    proxy = TcpProxy(world.seaweed.ports["s3.port"])
    endpoint = f"http://127.0.0.1:{proxy.port}"
    before_uploads = world.uploads()
    try:
        proxy.stall_after(64 << 10)
        proc = subprocess.Popen(
            [*RECEIVEWAL, *command(world, "backup", tmp_path), "--encrypt-to", key.recipient],
            env={**os.environ, **world.env(endpoint, **LONG)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: proxy.stalled.is_set() and len(world.uploads()) > len(
                before_uploads), timeout=120, what="the backup's multipart upload, stalled")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    finally:
        proxy.close()
    killed = {k.split("/")[2] for k, _ in world.uploads()} - \
        {k.split("/")[2] for k, _ in before_uploads}
    assert len(killed) == 1
    killed_id = killed.pop()
    assert f"{PREFIX}/backups/{killed_id}/backup.json" not in world.stored()
    recovered = receivewal("recover", "latest", "-D", world.url, "--to",
                           str(tmp_path / "pgdata"), "--no-sync", env=world.env())
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert recovered.stdout.startswith(f"backup {world.complete} "), recovered.stdout
    verified = receivewal("verify", world.url, env=world.env(), timeout=180)
    assert f"backup {killed_id}: not a backup: no record" in verified.stdout, \
        verified.stdout + verified.stderr
    cleaned = receivewal("cleanup", "-D", world.url, "--keep-backups", "1", env=world.env())
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert any(k.startswith(f"{PREFIX}/backups/{killed_id}/") for k in world.stored())
    world.drop_uploads()
