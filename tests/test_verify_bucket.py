"""``receivewal verify s3://BUCKET/PREFIX`` against a real S3 server (SeaweedFS).

The archive is one real server's completed segments (1 MiB), uploaded with the uploader's own
create-only put (:meth:`Bucket.put_new`) plain under one prefix and zstd-compressed under
another, as ``--upload-to`` leaves them. The bucket archive's report must be the local
archive's, byte for byte in JSON; what the store does (a deleted object, refused credentials)
must read as it would for a local archive. The prefix's identity object is read as a
directory's identity file is: by verify (whose segments the archive holds) and by restore
(the segment size).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.seaweed import SeaweedS3
from support.servers import make_shared_dir
from support.sparkarchives import COMPRESSORS, SEGMENT_SIZE, build_single_archive

from receivewal.archive.bucket import Bucket
from receivewal.archive.identity import IDENTITY_FILE, ArchiveIdentity, identity_to_json
from receivewal.check import verify
from receivewal.commands.cli import cli

pytestmark = pytest.mark.server

_prefixes = itertools.count()
OTHER_SYSTEM = "7399999999999999999"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One real server's completed segments, plain, in a local directory."""
    base = make_shared_dir("receivewal-verify-s3-")
    out = tmp_path_factory.mktemp("archive")
    try:
        build_single_archive(base, "s3", out)
        yield out
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def s3_env(seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The store's endpoint and credentials, through the environment only (boto3's chain)."""
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    return seaweed.env()


def upload(seaweed: SeaweedS3, directory: Path) -> str:
    """Upload every file of ``directory`` with put_new under a fresh prefix; its URL."""
    url = f"s3://{seaweed.bucket}/verify-{next(_prefixes)}/wal"
    bucket = Bucket.connect(url)
    for path in sorted(directory.iterdir()):
        bucket.put_new(path.name, path)
    return url


def zstd_copy(local: Path, out: Path) -> Path:
    """The archive with every segment compressed as ``-Z zstd`` stores it (``.zst``)."""
    out.mkdir()
    for path in local.iterdir():
        (out / (path.name + ".zst")).write_bytes(COMPRESSORS[".zst"](path.read_bytes()))
    return out


def verify_json(archive: str, *args: str) -> tuple[int, dict[str, object]]:
    """Exit code and JSON report of ``receivewal verify --json ARCHIVE``."""
    result = CliRunner().invoke(cli, ["verify", "--json", *args, archive])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.output)


@pytest.mark.usefixtures("s3_env")
@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "zstd"])
def test_verify_of_a_bucket_equals_verify_of_the_same_files_on_disk(
        local: Path, seaweed: SeaweedS3, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, compressed: bool) -> None:
    """An archive uploaded with put_new (plain, and zstd) is recoverable, and its report is
    the local archive's, field for field; read in this process, and by two worker processes
    (each with a client of its own)."""
    directory = zstd_copy(local, tmp_path / "zstd") if compressed else local
    url = upload(seaweed, directory)
    code, from_disk = verify_json(str(directory), "-j", "1")
    assert code == 0
    assert from_disk["recoverable"] is True
    for jobs in ("1", "2"):
        # a worker per segment: the archive is far too small to earn a pool otherwise
        monkeypatch.setattr(verify, "BYTES_PER_WORKER", 1)
        code, from_bucket = verify_json(url, "-j", jobs)
        assert code == 0
        assert from_bucket == from_disk
    assert len(from_disk["segments"]) == len(list(local.iterdir()))  # type: ignore[arg-type]


def test_a_deleted_object_is_a_gap_naming_its_segment(
        local: Path, seaweed: SeaweedS3, s3_env: dict[str, str]) -> None:
    """An object deleted from the bucket is a missing_segment at its file name and LSN, and
    the archive is not recoverable (exit 1), as a file deleted from a directory."""
    url = upload(seaweed, local)
    names = sorted(p.name for p in local.iterdir())
    removed = names[len(names) // 2]
    bucket = Bucket.connect(url)
    seaweed.client().delete_object(Bucket=seaweed.bucket, Key=bucket.key(removed))
    code, report = verify_json(url)
    assert code == 1
    assert report["recoverable"] is False
    missing = [(p["file"], p["lsn"]) for p in report["problems"]  # type: ignore[attr-defined]
               if p["kind"] == "missing_segment"]
    lsn = int(removed[16:], 16) * SEGMENT_SIZE
    assert missing == [(removed, f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}")]


def test_wrong_credentials_are_one_line_and_a_non_zero_exit(
        local: Path, seaweed: SeaweedS3, s3_env: dict[str, str]) -> None:
    """With a wrong secret key, verify prints one line naming the bucket and saying access was
    denied, no traceback, and exits 1."""
    url = upload(seaweed, local)
    env = {**os.environ, **s3_env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    done = subprocess.run([sys.executable, "-m", "receivewal", "verify", url], env=env,
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert url in lines[0]
    assert "access denied" in lines[0]
    assert "Traceback" not in done.stderr


@pytest.mark.usefixtures("s3_env")
def test_a_damaged_object_is_the_damage_verify_finds_on_disk(
        local: Path, seaweed: SeaweedS3, tmp_path: Path) -> None:
    """One byte flipped inside a record of an uploaded segment: verify of the bucket reports
    the same crc_mismatch (file and LSN) as verify of the damaged files on disk, exit 1."""
    damaged = tmp_path / "damaged"
    shutil.copytree(local, damaged)
    victim = sorted(damaged.iterdir())[1]
    data = bytearray(victim.read_bytes())
    data[SEGMENT_SIZE // 2 + 1000] ^= 0x40
    victim.write_bytes(bytes(data))
    url = upload(seaweed, damaged)
    code, from_disk = verify_json(str(damaged))
    assert code == 1
    kinds = {(p["kind"], p["file"]) for p in from_disk["problems"]}  # type: ignore[attr-defined]
    assert ("crc_mismatch", victim.name) in kinds, kinds
    code, from_bucket = verify_json(url)
    assert code == 1
    assert from_bucket == from_disk


def claim(url: str, system_identifier: str) -> None:
    """Write the prefix's identity object as a daemon's claim writes it."""
    Bucket.connect(url).put_new(IDENTITY_FILE, identity_to_json(
        ArchiveIdentity(system_identifier, SEGMENT_SIZE, 1)))


@pytest.mark.usefixtures("s3_env")
def test_the_identity_object_is_compared_with_the_segments(
        local: Path, seaweed: SeaweedS3) -> None:
    """The prefix's identity object names another database system than its segments (it was
    deleted and another cluster claimed the prefix): every segment is foreign to the archive
    and it is NOT recoverable (it read as recoverable); with the segments' own system it is."""
    code, from_disk = verify_json(str(local))
    own = str(from_disk["system_identifier"])
    names = sorted(p.name for p in local.iterdir())
    mine, theirs = upload(seaweed, local), upload(seaweed, local)
    claim(mine, own)
    claim(theirs, OTHER_SYSTEM)
    code, report = verify_json(mine)
    assert code == 0
    assert report["recoverable"] is True
    code, report = verify_json(theirs)
    assert code == 1
    assert report["recoverable"] is False
    assert str(report["system_identifier"]) == OTHER_SYSTEM
    foreign = [p for p in report["problems"]  # type: ignore[attr-defined]
               if p["kind"] == "foreign_segment"]
    assert sorted(p["file"] for p in foreign) == names
    assert own in foreign[0]["detail"]


def test_restore_from_a_bucket_speaks_of_the_identity_objects_segment_size(
        seaweed: SeaweedS3, s3_env: dict[str, str], tmp_path: Path) -> None:
    """A bucket archive of 1 MiB segments: a short object under a segment's name whose first
    page is not a valid header is refused (126) as shorter than a 1 MiB segment, the size the
    identity object states (the error spoke of 16777216 bytes: the identity was not read)."""
    url = f"s3://{seaweed.bucket}/verify-{next(_prefixes)}/wal"
    claim(url, OTHER_SYSTEM)
    name = "000000010000000000000003"
    Bucket.connect(url).put_new(name, bytes(4096))
    env = {**os.environ, **s3_env, "RECEIVEWAL_PREFETCH": "0"}
    done = subprocess.run([sys.executable, "-m", "receivewal", "restore", "-D", url, name,
                           str(tmp_path / "RECOVERYXLOG")], env=env, capture_output=True,
                          text=True, check=False, timeout=120)
    assert done.returncode == 126, done.stderr
    assert str(SEGMENT_SIZE) in done.stderr
    assert str(16 * 1024 * 1024) not in done.stderr
    assert not (tmp_path / "RECOVERYXLOG").exists()
