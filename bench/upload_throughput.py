"""Uploads to object storage: receivewal's create-only puts against boto3's own transfer manager,
and the daemon's catch-up with ``--upload-to`` against without. Run by hand (not in CI)::

    .venv/bin/python bench/upload_throughput.py [--gb 2] [--rounds 2] [--wal-gb 0.5]

It starts a local SeaweedFS S3 server (``weed mini`` from the test extra, loopback only, as the
tests do). Part 1 writes ``--gb`` GB of 16 MiB segment files and puts them, alternating
``--rounds`` times, once with receivewal's uploader path (``Bucket.put_new``: SHA-256 first,
then a create-only PUT with the checksum, one file after the other, in order, as the daemon
uploads) and once with boto3's ``upload_file`` (its transfer manager: multipart, threads).
Part 2 starts a private PostgreSQL, writes ``--wal-gb`` GB of WAL held by slots, and lets
``receivewal stream`` catch up to the same end LSN with and without ``--upload-to``; it prints
the catch-up MB/s of each and how many segments the bucket held when the daemon exited (uploads
run in a thread of their own; what is left goes up on the next run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from support.seaweed import SeaweedS3, running_seaweed
from support.servers import running_server

from receivewal.archive.bucket import Bucket, client_config

SEGMENT = 16 << 20
MB = 1e6


def make_segments(directory: Path, gb: float) -> list[Path]:
    """Files of 16 MiB named like segments, of bytes that do not compress."""
    block = os.urandom(1 << 20)
    paths = []
    for i in range(max(1, int(gb * 1e9 // SEGMENT))):
        path = directory / f"{1:08X}{0:08X}{i + 1:08X}"
        with path.open("wb") as fh:
            for j in range(SEGMENT >> 20):
                fh.write(block[j:] + block[:j])
        paths.append(path)
    return paths


def put_with_receivewal(url: str, files: list[Path]) -> float:
    bucket = Bucket.connect(url)
    began = time.monotonic()
    for path in files:
        bucket.put_new(path.name, path)
    return time.monotonic() - began


def put_with_transfer_manager(bucket: str, prefix: str, files: list[Path]) -> float:
    import boto3  # noqa: PLC0415 - the baseline's own client, as a boto3 user would make it

    client = boto3.client("s3", config=client_config())
    began = time.monotonic()
    for path in files:
        client.upload_file(str(path), bucket, f"{prefix}/{path.name}")
    return time.monotonic() - began


def part_uploads(store: SeaweedS3, gb: float, rounds: int, scratch: Path) -> None:
    files = make_segments(scratch, gb)
    total = len(files) * SEGMENT
    print(f"part 1: {len(files)} files, {total / MB:.0f} MB", flush=True)
    ours, theirs = [], []
    for i in range(rounds):
        ours.append(put_with_receivewal(f"s3://{store.bucket}/ours-{i}", files))
        theirs.append(put_with_transfer_manager(store.bucket, f"theirs-{i}", files))
        print(f"  round {i + 1}: receivewal {total / MB / ours[-1]:.1f} MB/s, "
              f"transfer manager {total / MB / theirs[-1]:.1f} MB/s", flush=True)
    a, b = total / MB / statistics.median(ours), total / MB / statistics.median(theirs)
    print(f"| uploader | MB/s (median of {rounds}) |\n|---|---:|\n"
          f"| receivewal (put_new, in order) | {a:.1f} |\n| boto3 upload_file | {b:.1f} |\n"
          f"receivewal / transfer manager: {a / b:.2f}x\n", flush=True)


def catch_up(dsn: str, slot: str, end: str, directory: Path, env: dict[str, str],
             *extra: str) -> float:
    began = time.monotonic()
    subprocess.run([sys.executable, "-m", "receivewal", "stream", "-D", str(directory),
                    "-d", dsn, "-S", slot, "-E", end, "-n", "--compression", "none",
                    "--log-format", "json", *extra], check=True, capture_output=True,
                   env=env, timeout=1800)
    return time.monotonic() - began


def part_catch_up(store: SeaweedS3, wal_gb: float, rounds: int, scratch: Path) -> None:
    env = {**os.environ, **store.env()}
    slots = [f"{kind}_{i}" for i in range(rounds) for kind in ("plain", "upload")]
    with running_server(conf={"max_replication_slots": str(len(slots) + 2),
                              "max_wal_size": "'4GB'", "wal_keep_size": "0"}) as pg:
        for slot in slots:
            pg.sql(f"SELECT pg_create_physical_replication_slot('{slot}', true)")
        start = pg.current_lsn()
        pg.sql("CREATE TABLE bench (id bigint, pad text)")
        while int(pg.sql(f"SELECT pg_current_wal_lsn() - '{start}'::pg_lsn")) < wal_gb * 1e9:
            pg.sql("INSERT INTO bench SELECT g, repeat(md5(g::text), 6) "
                   "FROM generate_series(1, 200000) g")
        end = pg.sql("SELECT pg_switch_wal()")
        wal = int(pg.sql(f"SELECT '{end}'::pg_lsn - '{start}'::pg_lsn"))
        print(f"part 2: {wal / MB:.0f} MB of WAL up to {end}", flush=True)
        times: dict[str, list[float]] = {"without": [], "with --upload-to": []}
        for i in range(rounds):
            for kind, slot in (("without", f"plain_{i}"), ("with --upload-to", f"upload_{i}")):
                directory = scratch / slot
                directory.mkdir()
                extra = ("--upload-to", f"s3://{store.bucket}/catch-up-{i}") \
                    if slot.startswith("upload") else ()
                times[kind].append(catch_up(pg.dsn, slot, end, directory, env, *extra))
                uploaded = ""
                if extra:
                    listed = Bucket.connect(extra[1]).list_names()
                    uploaded = f", {sum(len(n) == 24 for n in listed)} segments in the bucket"
                print(f"  round {i + 1} {kind}: {wal / MB / times[kind][-1]:.1f} MB/s"
                      f"{uploaded}", flush=True)
                shutil.rmtree(directory)
    a, b = (wal / MB / statistics.median(times[k]) for k in ("with --upload-to", "without"))
    print(f"| receivewal stream | catch-up MB/s (median of {rounds}) |\n|---|---:|\n"
          f"| without --upload-to | {b:.1f} |\n| with --upload-to | {a:.1f} |\n"
          f"with / without: {a / b:.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=2.0, help="GB of segment files to upload")
    parser.add_argument("--wal-gb", type=float, default=0.5, help="GB of WAL to catch up on")
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs of each")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="receivewal-upload-bench-"))
    try:
        with running_seaweed(scratch / "s3") as store:
            os.environ.update(store.env())  # boto3's standard chain, for both uploaders
            part_uploads(store, args.gb, args.rounds, scratch)
            for path in scratch.glob("0*"):
                path.unlink()
            part_catch_up(store, args.wal_gb, args.rounds, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
