"""``receivewal logical -D OUTDIR --upload-to s3://... --keep-local AGE`` against a real
PostgreSQL 15 and a real S3 server (SeaweedFS), issue 35 item 5: every completed change file
goes up, in order and create-only; a file leaves OUTDIR only once it is uploaded and the slot
is confirmed past it; the bucket and what OUTDIR still holds together hold every row."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from support.changelog import read_log
from support.logical import LOGICAL_CONF
from support.seaweed import SeaweedS3
from support.servers import running_server
from support.streams import log_events, receivewal, start_receivewal, stop, wait_for

from receivewal.logical.store import parse_file_name
from receivewal.logicalreceiver.changeuploads import UPLOADED_FILE, completed_files

pytestmark = pytest.mark.server

ROWS = 600
_prefixes = itertools.count()


def keys(seaweed: SeaweedS3, prefix: str) -> set[str]:
    pages = seaweed.client().get_paginator("list_objects_v2").paginate(
        Bucket=seaweed.bucket, Prefix=f"{prefix}/")
    return {item["Key"][len(prefix) + 1:] for page in pages for item in page.get("Contents", ())}


def completed(log: Path) -> list[str]:
    return [str(e["file"]) for e in log_events(log.read_text())
            if e.get("event") == "change_file_completed"]


def test_change_files_go_up_in_order_and_leave_outdir_once_uploaded_and_confirmed(
        seaweed: SeaweedS3, tmp_path: Path) -> None:
    prefix = f"changes-{next(_prefixes)}"
    out, log, mirror = tmp_path / "out", tmp_path / "log", tmp_path / "mirror"
    out.mkdir()
    mirror.mkdir()
    with running_server(LOGICAL_CONF) as pg:
        pg.sql("CREATE TABLE items (id int PRIMARY KEY, what text)")
        pg.sql("CREATE PUBLICATION pub FOR ALL TABLES")
        dsn = f"host=127.0.0.1 port={pg.port} user=postgres dbname=postgres"
        args = ["-d", dsn, "-S", "up", "-D", str(out), "-P", "pub", "--file-size", "8kB",
                "--no-sync", "--log-format", "json"]
        made = receivewal("logical", *args, "--create-slot")
        assert made.returncode == 0, made.stderr
        for n in range(ROWS // 20):
            pg.sql(f"INSERT INTO items SELECT g, repeat('x', 80) FROM "
                   f"generate_series({n * 20}, {n * 20 + 19}) g")
        proc = start_receivewal(
            "logical", *args, "--upload-to", f"s3://{seaweed.bucket}/{prefix}",
            "--keep-local", "1s", "--status-interval", "1",
            env={**seaweed.env(), "RECEIVEWAL_TEST_UPLOAD_RETRY": "0.05",
                 "RECEIVEWAL_TEST_LOCAL_INTERVAL": "0.2"}, stderr_path=log)
        try:
            wait_for(lambda: len(completed(log)) >= 5 or proc.poll() is not None,
                     what="change files completed")
            assert proc.poll() is None, log.read_text()[-3000:]
            pg.sql("INSERT INTO items VALUES (-1, 'last')")  # a last one, past the others
            wait_for(lambda: set(completed(log)) <= keys(seaweed, prefix), timeout=60,
                     what="every completed file uploaded")
            wait_for(lambda: len(completed_files(out)) <= 1, timeout=60,
                     what="the uploaded and confirmed files gone from OUTDIR")
            record = json.loads((out / UPLOADED_FILE).read_text())
            assert record["through"] == sorted(completed(log))[-1]
            events = [e.get("event") for e in log_events(log.read_text())]
            assert "local_files_removed" in events
            uploaded = [str(e["file"]) for e in log_events(log.read_text())
                        if e.get("event") == "file_uploaded"]
            assert uploaded == sorted(uploaded)  # in order
        finally:
            assert stop(proc) == 0
    client = seaweed.client()
    for name in keys(seaweed, prefix):
        body = client.get_object(Bucket=seaweed.bucket, Key=f"{prefix}/{name}")["Body"].read()
        (mirror / name).write_bytes(body)
    for path in out.iterdir():  # the newest file and the .partial
        if parse_file_name(path.name) is not None and not (mirror / path.name).exists():
            (mirror / path.name).write_bytes(path.read_bytes())
    inserts = [r for r in read_log(mirror) if r.get("op") == "insert"]
    assert len(inserts) == ROWS + 1
