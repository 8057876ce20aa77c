"""What ``receivewal stream`` does before START_REPLICATION, seen from inside a real start-up
against a real server: the archive directory is listed once (the lock's listing serves the
temporaries, the identity, the resume point, the islands, the .partial files and the upload
backlog), and nothing is imported that a plain stream does not use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.seaweed import SeaweedS3
from support.servers import PgServer
from support.streams import receivewal, wal_files

pytestmark = pytest.mark.server

PROBE = """\
import json, os, sys
target = os.path.realpath(sys.argv[1])
listed = []

def count_listings(event, args):
    if event in ("os.scandir", "os.listdir") and isinstance(args[0], str | bytes | os.PathLike) \\
            and os.path.realpath(os.fsdecode(args[0])) == target:
        listed.append(event)

sys.addaudithook(count_listings)
import importlib
status = importlib.import_module(sys.argv[2]).main(sys.argv[3:])
print(json.dumps({"status": status, "listed": listed, "modules": sorted(sys.modules)}))
"""


def probe_stream(archive: Path, *args: str, env: dict[str, str] | None = None,
                 entry: str = "receivewal.commands.cli") -> dict[str, object]:
    """Run ``receivewal stream -D ARCHIVE ARGS`` through the console script's entry point
    (``entry``: the drop-in's takes its arguments without ``stream``) in a fresh interpreter;
    its exit status, its listings of the archive directory (audit events) and the modules it
    had loaded at the end."""
    command = ["stream", "--log-format", "json"] if entry.endswith(".cli") else []
    done = subprocess.run([sys.executable, "-c", PROBE, str(archive), entry, *command, "-D",
                           str(archive), *args], capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    assert result["status"] == 0, done.stderr[-2000:]
    return result


# Loaded only when used: a compressed frame's codec, --upload-to's store and uploader,
# --metrics-address's exporter, the WAL reader (when .partial forms compete) and its CRC.
NOT_NEEDED_PACKAGES = {"zstandard", "lz4", "backports", "compression", "crc32c", "boto3",
                       "botocore", "prometheus_client"}
NOT_NEEDED_MODULES = {"receivewal.archive.bucket", "receivewal.archive.objectstore",
                      "receivewal.archive.uploads", "receivewal.walreceiver.uploader",
                      "receivewal.wal.reader"}


@pytest.mark.shared_server
def test_a_plain_stream_start_up_imports_no_codec_store_exporter_or_wal_reader(
        pg: PgServer, archive_dir: Path) -> None:
    """A stream from a server without pg_streampack (compression asked for, as by default,
    but not granted) into a new archive, then resumed: no codec library, no object store
    client, no metrics exporter, no WAL reader is loaded."""
    for _ in range(2):
        pg.generate_wal(1)
        result = probe_stream(archive_dir, "-d", pg.dsn, "-E", pg.mid_segment_lsn(), "-n")
        modules = result["modules"]
        assert isinstance(modules, list)
        assert [m for m in modules if m in NOT_NEEDED_MODULES
                or m.split(".")[0] in NOT_NEEDED_PACKAGES] == []


def resumable_archive(pg: PgServer, archive: Path) -> str:
    """An archive a first run filled (complete segments, a .partial, the identity file), a
    crash's temporary file beside them, and an --endpos for a resumed run a segment later."""
    pg.generate_wal(2)
    first = receivewal("stream", "-D", str(archive), "-d", pg.dsn, "-E", pg.mid_segment_lsn(),
                       "-n")
    assert first.returncode == 0, first.stderr
    (archive / ".000000010000000000000009.partial.receivewal-tmp").write_bytes(b"crash")
    pg.generate_wal(1)
    return pg.mid_segment_lsn()


@pytest.mark.shared_server
def test_a_resumed_start_up_lists_the_archive_directory_once(pg: PgServer,
                                                             archive_dir: Path) -> None:
    """Removing a crash's temporaries, checking the identity, finding the resume point and the
    islands and settling .partial files all read the one listing the lock took."""
    endpos = resumable_archive(pg, archive_dir)
    result = probe_stream(archive_dir, "-d", pg.dsn, "-E", endpos, "-n")
    assert result["listed"] == ["os.scandir"]
    assert not any(name.endswith(".receivewal-tmp") for name in os.listdir(archive_dir))
    assert wal_files(archive_dir)[-1].endswith(".partial")


@pytest.mark.shared_server
def test_an_uploading_start_up_lists_the_archive_directory_once(
        pg: PgServer, archive_dir: Path, seaweed: SeaweedS3) -> None:
    """With --upload-to, the uploader's backlog comes from the same listing too."""
    endpos = resumable_archive(pg, archive_dir)
    env = {**seaweed.env(), "RECEIVEWAL_TEST_UPLOAD_RETRY": "0.05"}
    result = probe_stream(archive_dir, "-d", pg.dsn, "-E", endpos, "-n", "--upload-to",
                          f"s3://{seaweed.bucket}/startup", env=env)
    assert result["listed"] == ["os.scandir"]


@pytest.mark.shared_server
def test_the_drop_in_lists_the_archive_directory_once(pg: PgServer, archive_dir: Path) -> None:
    """pg_receivewal's check that the directory can be opened lists nothing: the daemon's one
    listing is the only one."""
    endpos = resumable_archive(pg, archive_dir)
    result = probe_stream(archive_dir, "-d", pg.dsn, "-E", endpos, "-n",
                          entry="receivewal.commands.pg_receivewal")
    assert result["listed"] == ["os.scandir"]
