"""``receivewal stream --upload-to s3://... --keep-local AGE|SIZE`` against real PostgreSQL 15
servers (1 MiB segments: WAL is cheap) and a real S3 server (SeaweedFS): the archive directory
shrinks to the local rule while streaming, the bucket keeps every segment, a segment the bucket
does not hold (the store down) is never removed, and recovery from the bucket alone brings the
cluster back once the directory has let its old segments go."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from support.backups import give_to_postgres, start_recovered
from support.postgres_user import S3_PACKAGES, install_for_postgres
from support.seaweed import SeaweedS3
from support.servers import PgServer, make_shared_dir
from support.streams import (
    complete_segments,
    log_events,
    receivewal,
    start_streaming,
    stop,
    wait_for,
)

pytestmark = pytest.mark.server

_prefixes = itertools.count()


@pytest.fixture
def small() -> Iterator[PgServer]:
    """A started primary with 1 MiB segments, in a directory the server user can use."""
    base = make_shared_dir("receivewal-localdisk-")
    pg = PgServer(base, "primary")
    try:
        pg.init(initdb_args=("--wal-segsize=1",))
        pg.start()
        yield pg
    finally:
        pg.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def url_of(seaweed: SeaweedS3) -> str:
    return f"s3://{seaweed.bucket}/local-{next(_prefixes)}"


def env_of(seaweed: SeaweedS3) -> dict[str, str]:
    """The daemon's environment: the store's, short retries, the rule applied often."""
    return {**seaweed.env(), "RECEIVEWAL_TEST_UPLOAD_RETRY": "0.05",
            "RECEIVEWAL_TEST_LOCAL_INTERVAL": "0.2"}


def keys(seaweed: SeaweedS3, url: str) -> set[str]:
    """The names of the objects under the URL's prefix, listed with the test's own client."""
    prefix = url.split("/", 3)[3]
    pages = seaweed.client().get_paginator("list_objects_v2").paginate(
        Bucket=seaweed.bucket, Prefix=f"{prefix}/")
    return {item["Key"][len(prefix) + 1:] for page in pages for item in page.get("Contents", ())}


def completed(log: Path) -> list[str]:
    """The segments the daemon completed, as its log says."""
    return [str(e["segment"]) for e in log_events(log.read_text())
            if e.get("event") == "segment_completed"]


def state(archive: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = receivewal("status", "-D", str(archive), "--json", env=env)
    return json.loads(result.stdout)["state"]  # type: ignore[no-any-return]


def updated_at(archive: Path) -> float:
    """When the daemon last wrote its state file (seconds since the epoch)."""
    return datetime.fromisoformat(state(archive)["updated_at"]).timestamp()


def switches(pg: PgServer, count: int) -> None:
    """``count`` segments completed on the server."""
    for _ in range(count):
        pg.switch_wal()


def test_the_directory_shrinks_to_its_window_while_the_bucket_keeps_every_segment(
        small: PgServer, seaweed: SeaweedS3) -> None:
    """--keep-local 3MB: once uploaded, all but the three newest segments leave the
    directory; every segment completed is in the bucket; status and the log say so."""
    archive, log, url = small.base / "archive", small.base / "stream.log", url_of(seaweed)
    archive.mkdir()
    proc = start_streaming("-D", str(archive), "-d", small.dsn, "--upload-to", url,
                           "--keep-local", "3MB", log=log, env=env_of(seaweed))
    try:
        switches(small, 10)
        wait_for(lambda: len(completed(log)) >= 10, what="ten segments completed")
        wait_for(lambda: set(completed(log)) <= keys(seaweed, url), what="their uploads")
        wait_for(lambda: len(complete_segments(archive)) <= 3, what="the directory shrunk")
        assert complete_segments(archive) == sorted(completed(log))[-len(
            complete_segments(archive)):]  # the newest stay
        wait_for(lambda: state(archive)["local_removed_files"] >= 7, timeout=30,
                 what="the removals in the state file")
        now = state(archive)
        assert now["local_rule"] == "segments of the last 3MB"
        # three segments, the .partial and the records (identity, state, uploads)
        assert 3 << 20 < now["local_bytes"] < (4 << 20) + (64 << 10)
        assert now["local_last_removed"].endswith(" bytes)")
        text = receivewal("status", "-D", str(archive), env=seaweed.env()).stdout
        assert re.search(r"^local copy keeps: +segments of the last 3MB, ", text, re.M), text
        assert re.search(r"^removed locally: +\d+ files, ", text, re.M), text
        assert any(e.get("event") == "local_files_removed" for e in log_events(log.read_text()))
    finally:
        assert stop(proc) == 0
    assert (archive / ".receivewal-archive.json").exists()  # the identity record stays


def test_a_segment_the_bucket_does_not_hold_is_never_removed(
        small: PgServer, seaweed: SeaweedS3) -> None:
    """The store killed: the segments completed meanwhile stay however old, while the rule
    keeps running; once the store is back they go up, and then leave the directory."""
    archive, log, url = small.base / "archive", small.base / "stream.log", url_of(seaweed)
    archive.mkdir()
    proc = start_streaming("-D", str(archive), "-d", small.dsn, "--upload-to", url,
                           "--keep-local", "1s", log=log, env=env_of(seaweed))
    try:
        switches(small, 2)
        wait_for(lambda: len(completed(log)) >= 2 and set(completed(log)) <= keys(seaweed, url),
                 what="two segments uploaded")
        seaweed.kill()
        try:
            before = set(completed(log))
            switches(small, 4)
            wait_for(lambda: len(set(completed(log)) - before) >= 4, what="four more segments")
            waiting = sorted(set(completed(log)) - before)
            done = time.time()
            # the state file written after two seconds of rule applications (every 0.2 s),
            # each seeing those segments older than the window
            wait_for(lambda: updated_at(archive) > done + 2, timeout=30,
                     what="the rule applied since")
            assert set(waiting) <= set(complete_segments(archive))
            now = state(archive)
            assert now["upload_pending_files"] >= 4
            assert now["local_rule"] == "segments of the last 1s"
        finally:
            seaweed.start()
        wait_for(lambda: set(waiting) <= keys(seaweed, url), timeout=90, what="the backlog")
        wait_for(lambda: not set(waiting[:-1]) & set(complete_segments(archive)),
                 what="the uploaded segments gone from the directory")
    finally:
        assert stop(proc) == 0


def test_recovery_from_the_bucket_alone_once_the_directory_let_the_wal_go(
        small: PgServer, seaweed: SeaweedS3) -> None:
    """A backup into the bucket, rows after it, the directory shrunk to its window (the
    backup's WAL gone from it): recover from the bucket brings every row back."""
    base = small.base
    archive, log, url = base / "archive", base / "stream.log", url_of(seaweed)
    archive.mkdir()
    prefix = install_for_postgres(base, S3_PACKAGES)
    proc = start_streaming("-D", str(archive), "-d", small.dsn, "--upload-to", url,
                           "--keep-local", "2MB", log=log, env=env_of(seaweed))
    try:
        small.sql("CREATE TABLE kept (n int)")
        backup = receivewal("backup", "-D", url, "-d", small.dsn, "--fast", env=seaweed.env(),
                            timeout=180)
        assert backup.returncode == 0, backup.stderr
        first = completed(log)[0]
        for n in range(5):
            small.sql(f"INSERT INTO kept SELECT g FROM generate_series(1, {1000 * (n + 1)}) g")
            switches(small, 1)
        last = small.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
        switches(small, 1)
        wait_for(lambda: last in keys(seaweed, url), timeout=90, what=f"{last} uploaded")
        wait_for(lambda: first not in complete_segments(archive), what="the old WAL gone")
    finally:
        assert stop(proc) == 0
    rows = small.sql("SELECT count(*) FROM kept")
    pgdata = base / "recovered"
    env = " ".join(f"{k}={v}" for k, v in seaweed.env().items())
    done = receivewal("recover", "--to", str(pgdata), "-D", url, "--restore-command-prefix",
                      f"{env} RECEIVEWAL_PREFETCH_IDLE=2 {prefix}", env=seaweed.env(),
                      timeout=180)
    assert done.returncode == 0, done.stderr
    give_to_postgres(pgdata)
    server = start_recovered(base, "recovered")
    try:
        assert server.sql("SELECT count(*) FROM kept") == rows == "15000"
    finally:
        server.stop("immediate")
