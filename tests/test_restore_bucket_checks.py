"""``receivewal restore -D s3://BUCKET/PREFIX`` checks what it serves and never hangs (issue 25),
against a real S3 server (SeaweedFS) and, for the prefix typo, a real recovery: an object
with a flipped bit or of another cluster is exit 126 (the filler does not spool it either), a
prefix without the archive's identity object is 126 for every file (never 1, which ends
recovery early), and a store that accepts connections and never answers is 126 within the
call's bound, having said what it waits for."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard
from support.bucketcalls import new_prefix, put, restore, spooled
from support.postgres_user import S3_PACKAGES, install_for_postgres
from support.recovery import recover_or_stop
from support.seaweed import SeaweedS3
from support.servers import PgServer
from support.tcpproxy import SilentListener
from support.walgen import SEGMENT, SYSID, name_of, record_offsets, wal_segment

from receivewal.restore.call import restore_timeout, source_id
from receivewal.restore.filler import Spool
from receivewal.restore.remote import BucketSource
from receivewal.wal.lsn import format_lsn

pytestmark = pytest.mark.server


@pytest.fixture
def url(store: SeaweedS3) -> str:
    """A fresh prefix holding the identity object of the archive of ``SYSID``."""
    return new_prefix(store)


# -- issue 25: restore checks what it serves (items 1 and 2, from a bucket) ----------------------
def flipped(data: bytes, offset: int) -> bytes:
    out = bytearray(data)
    out[offset] ^= 0x10
    return bytes(out)


@pytest.mark.parametrize(("form", "prefetch"), [("plain", "2"), ("zstd", "0")])
def test_an_object_with_a_flipped_bit_is_126(url: str, tmp_path: Path, form: str,
                                             prefetch: str) -> None:
    """Item 1: an object holding its segment with one bit flipped in a record (a .zst made
    from the flipped bytes decodes fine): exit 126, one line naming the object and the
    record's LSN, %p left as it was; with prefetch on, the filler does not spool it either
    (the call waits for it, asks it, then restores it itself)."""
    data = wal_segment(4)
    at = record_offsets(data)[50]
    put(url, name_of(3), wal_segment(3))
    key = name_of(4)
    if form == "zstd":
        key += ".zst"
        put(url, key, zstandard.ZstdCompressor(write_checksum=True).compress(
            flipped(data, at + 33)))
    else:
        put(url, key, flipped(data, at + 33))
    target = tmp_path / "pg_wal" / "RECOVERYXLOG"
    target.parent.mkdir()
    assert restore(url, name_of(3), target, "--prefetch", prefetch).returncode == 0
    done = restore(url, name_of(4), target, "--prefetch", prefetch)
    assert done.returncode == 126, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"{url}/{key}" in done.stderr, done.stderr
    assert format_lsn(4 * SEGMENT + at) in done.stderr, done.stderr
    assert target.read_bytes() == wal_segment(3)
    assert sorted(os.listdir(target.parent)) == [".receivewal", "RECOVERYXLOG"] \
        if prefetch != "0" else ["RECOVERYXLOG"]
    if prefetch != "0":
        assert name_of(4) not in spooled(Spool.beside(target, source_id(url)))


def test_another_clusters_object_is_126(url: str, tmp_path: Path) -> None:
    """Item 2: valid WAL of another database system under the right key, at a prefix whose
    identity object names this one: exit 126 naming both system identifiers."""
    put(url, name_of(3), wal_segment(3, system_identifier=SYSID + 1))
    done = restore(url, name_of(3), tmp_path / "RECOVERYXLOG", "--prefetch", "0")
    assert done.returncode == 126, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert str(SYSID + 1) in done.stderr, done.stderr
    assert str(SYSID) in done.stderr, done.stderr
    assert os.listdir(tmp_path) == []


# -- issue 25, item 4: a prefix without the archive's identity object --------------------------
@pytest.mark.parametrize("prefetch", ["0", "2"])
@pytest.mark.parametrize("identity", ["absent", "garbled"])
def test_a_prefix_without_a_readable_identity_object_is_126_never_1(
        store: SeaweedS3, tmp_path: Path, prefetch: str, identity: str) -> None:
    """A mistyped prefix (or another endpoint) holds no identity object: every call, for a
    segment or a history file, present or not, is exit 126 naming the identity object (before:
    "no such key", exit 1, and recovery promoted early); a garbled one likewise."""
    url = new_prefix(store, None)
    put(url, name_of(3), wal_segment(3))
    if identity == "garbled":
        put(url, ".receivewal-archive.json", b'{"system_identifier": "x"')
    wal = tmp_path / "pg_wal"
    wal.mkdir()
    (tmp_path / "recovery.signal").touch()  # a recovery: the first call starts the filler
    for name, target in (("00000002.history", "RECOVERYHISTORY"), (name_of(3), "RECOVERYXLOG"),
                         (name_of(4), "RECOVERYXLOG")):
        done = restore(url, name, wal / target, "--prefetch", prefetch)
        assert done.returncode == 126, done.stderr
        lines = done.stderr.splitlines()
        assert len(lines) == 1, done.stderr
        assert f"{url}/.receivewal-archive.json" in lines[0], done.stderr
        assert not (wal / target).exists()


def test_recovery_of_a_stream_backup_from_a_mistyped_prefix_stops(
        pg: PgServer, store: SeaweedS3, server_base: Path) -> None:
    """Item 4 end to end: a base backup taken with ``-X stream`` (consistent on its own)
    recovers with restore_command naming a prefix with a typo. Before: every call was exit 1
    ("no such key"), and PostgreSQL promoted at the backup's end without the rows written
    after it. Now the first call is exit 126 and recovery stops."""
    sysid = pg.sql("SELECT system_identifier FROM pg_control_system()")
    url = new_prefix(store, sysid)
    backup = pg.base_backup("stream-backup", "-X", "stream")
    pg.sql("CREATE TABLE t (id int)")
    pg.sql("INSERT INTO t SELECT generate_series(1, 1000)")
    pg.switch_wal()
    for path in complete_segments_of_running(pg):
        put(url, path.name, path.read_bytes())
    command = install_for_postgres(server_base, S3_PACKAGES)
    env = " ".join(f"{k}={v}" for k, v in store.env().items())
    mistyped = url.replace("/wal", "/wall")
    promoted = recover_or_stop(backup, f"{env} RECEIVEWAL_PREFETCH_IDLE=3 {command} -D "
                                       f"{mistyped} %f %p")
    try:
        log = backup.logfile.read_text()
        assert not promoted, f"promoted without the rows written after the backup:\n{log}"
        assert f"{mistyped}/.receivewal-archive.json" in log, log
        assert "command not executable" in log, log
    finally:
        backup.stop("immediate")


def complete_segments_of_running(pg: PgServer) -> list[Path]:
    """The running server's segments before the one it writes now."""
    current = pg.sql("SELECT pg_walfile_name(pg_current_wal_insert_lsn())")
    return sorted(p for p in pg.pg_wal.iterdir()
                  if len(p.name) == 24 and p.is_file() and p.name < current)


# -- issue 25, left open: a store that accepts connections and never answers -------------------
@pytest.fixture
def silent_store(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """AWS_ENDPOINT_URL of a listener that accepts connections and never answers."""
    listener = SilentListener()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{listener.port}")
    try:
        yield f"http://127.0.0.1:{listener.port}"
    finally:
        listener.close()


@pytest.mark.parametrize("prefetch", ["0", "2"])
def test_a_store_that_never_answers_is_126_within_the_call_bound(
        url: str, silent_store: str, tmp_path: Path, prefetch: str) -> None:
    """A store that accepts connections and never answers (before: 723 s for one call, 4 tries
    of boto3's 3 x 60 s reads): the call gives up within RECEIVEWAL_RESTORE_TIMEOUT (here 3 s),
    having said on stderr what it waits for, and exits 126 with one line naming the object and
    the store. With prefetch on (a recovery's first call starts the filler, which hangs as
    well), the waits for the filler count in the same bound."""
    wal = tmp_path / "pg_wal"
    wal.mkdir()
    (tmp_path / "recovery.signal").touch()
    began = time.monotonic()
    done = restore(url, "00000002.history", wal / "RECOVERYHISTORY", "--prefetch", prefetch,
                   env={"RECEIVEWAL_RESTORE_TIMEOUT": "3"}, timeout=60)
    took = time.monotonic() - began
    assert done.returncode == 126, done.stderr
    assert took < 15, f"{took:.1f} s: {done.stderr}"
    lines = done.stderr.splitlines()
    waiting = [line for line in lines if line.startswith("receivewal restore: waiting")]
    assert waiting, done.stderr
    assert silent_store in waiting[0], waiting
    errors = [line for line in lines if line not in waiting]
    assert len(errors) == 1, done.stderr
    assert silent_store in errors[0], errors
    assert "RECEIVEWAL_RESTORE_TIMEOUT" in errors[0], errors
    assert not (wal / "RECOVERYHISTORY").exists()


def test_each_try_has_short_connect_and_read_timeouts(url: str) -> None:
    """A restore's client gives each request a few seconds to connect and to read (boto3's
    defaults are 60 s), and tries once per attempt: the retries are receivewal's, few, and
    the whole call is bounded (RECEIVEWAL_RESTORE_TIMEOUT, default a few minutes)."""
    config = BucketSource(url).bucket.client.meta.config
    assert config.connect_timeout <= 5
    assert config.read_timeout <= 10
    assert config.retries["total_max_attempts"] == 1
    assert 60 <= restore_timeout() <= 600
