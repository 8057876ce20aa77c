"""``receivewal analyze s3://BUCKET/PREFIX`` on an embedded Spark session and a real S3 server.

The driver lists the prefix once with boto3; the executors stream their objects with boto3
through :mod:`receivewal.archive.bucket` (no s3a). The archive is one real server's segments,
compressed in turn with every at-rest method and uploaded with put_new; one object of a second
upload is deleted, and a third carries an identity object of another database system.
analyze's tables must equal ``verify``'s report on the same bucket archive, and that report the
local archive's.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.seaweed import SeaweedS3
from support.servers import make_shared_dir
from support.sparkarchives import (
    SEGMENT_SIZE,
    build_single_archive,
    compressed_copy,
    rmgr_table_totals,
    segment_table_rows,
    verify_segment_rows,
)

from receivewal.archive.bucket import Bucket
from receivewal.archive.identity import IDENTITY_FILE, ArchiveIdentity, identity_to_json
from receivewal.check.analyze import AnalyzeResult, run_analyze
from receivewal.check.verify import rmgr_totals, verify_archive

pytestmark = [pytest.mark.spark, pytest.mark.server, pytest.mark.slow]
OTHER_SYSTEM = "7399999999999999999"


@pytest.fixture(scope="module")
def seaweed(seaweed_server: SeaweedS3) -> SeaweedS3:
    """The S3 server the shared Spark session was started for (tests/conftest.py)."""
    return seaweed_server


@pytest.fixture(scope="module")
def s3_env(seaweed: SeaweedS3) -> Iterator[dict[str, str]]:
    """The store's endpoint and credentials in the driver's environment, as a DBA's configured
    chain (the shared Spark session of tests/conftest.py started with them in it too: its
    Python workers have them)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in seaweed.env().items():
            patch.setenv(name, value)
        yield seaweed.env()


@pytest.fixture(scope="module")
def uploaded(seaweed: SeaweedS3, s3_env: dict[str, str],
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str, str]]:
    """(local archive, its bucket URL, a second upload's URL, the segment deleted there)."""
    base = make_shared_dir("receivewal-analyze-s3-")
    local = tmp_path_factory.mktemp("mixed")
    try:
        plain = tmp_path_factory.mktemp("plain")
        build_single_archive(base, "s3a", plain)
        compressed_copy(plain, local)
        urls = [f"s3://{seaweed.bucket}/analyze/{name}" for name in ("whole", "gap", "foreign")]
        for url in urls:
            bucket = Bucket.connect(url)
            for path in sorted(local.iterdir()):
                bucket.put_new(path.name, path)
        Bucket.connect(urls[2]).put_new(IDENTITY_FILE, identity_to_json(
            ArchiveIdentity(OTHER_SYSTEM, SEGMENT_SIZE, 1)))
        names = sorted(p.name for p in local.iterdir())
        removed = names[len(names) // 2]
        seaweed.client().delete_object(Bucket=seaweed.bucket,
                                       Key=Bucket.connect(urls[1]).key(removed))
        yield local, urls[0], urls[1], removed
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def result(spark: Any, uploaded: tuple[Path, str, str, str],
           tmp_path_factory: pytest.TempPathFactory) -> AnalyzeResult:
    """One analyze run over both bucket archives."""
    _, whole, gap, _ = uploaded
    return run_analyze(spark, [whole, gap, foreign(whole)], tmp_path_factory.mktemp("analysis"))


def foreign(whole: str) -> str:
    """The upload whose identity object names another database system."""
    return whole.replace("/whole", "/foreign")


def test_analyze_tables_of_a_bucket_equal_verify(spark: Any, result: AnalyzeResult,
                                                 uploaded: tuple[Path, str, str, str]) -> None:
    """Per segment (records, record bytes, FPI bytes, valid end) and per resource manager,
    the tables equal verify's report on the same bucket archive, which equals the local
    archive's; every segment is read (mixed plain, gzip, lz4 and zstd objects)."""
    local, whole, gap, _ = uploaded
    on_disk, _ = verify_archive(local, jobs=1)
    for url in (whole, gap):
        report, _ = verify_archive(url, jobs=1)
        assert segment_table_rows(spark, result.tables["segments"], url) == \
            verify_segment_rows(report)
        assert rmgr_table_totals(spark, result.tables["segment_rmgr"], url) == \
            rmgr_totals(report.scans)
    from_bucket, _ = verify_archive(whole, jobs=1)
    assert verify_segment_rows(from_bucket) == verify_segment_rows(on_disk)
    assert len(on_disk.scans) == len(list(local.iterdir()))


def test_analyze_finds_the_deleted_object_as_verify_does(
        spark: Any, result: AnalyzeResult, uploaded: tuple[Path, str, str, str]) -> None:
    """The deleted object is a missing_segment at its name and LSN in the problems table,
    the archive is not recoverable there, and the intact one is."""
    _, whole, gap, removed = uploaded
    problems = spark.read.parquet(result.tables["problems"]).collect()
    assert not [p for p in problems if p["archive"] == whole]
    missing = [(p["file"], p["lsn"]) for p in problems
               if p["archive"] == gap and p["kind"] == "missing_segment"]
    stem = removed.split(".")[0]
    assert missing == [(stem, int(stem[16:], 16) * SEGMENT_SIZE)]
    report, _ = verify_archive(gap, jobs=1)
    assert sorted((p.kind, p.file, p.lsn) for p in report.problems) == \
        sorted((p["kind"], p["file"], p["lsn"]) for p in problems if p["archive"] == gap)
    assert result.archives[whole].recoverable is True
    assert result.archives[gap].recoverable is False


def test_analyze_compares_the_identity_object_with_the_segments_as_verify_does(
        spark: Any, result: AnalyzeResult, uploaded: tuple[Path, str, str, str]) -> None:
    """An identity object naming another database system than the segments: every segment is
    foreign to the archive, which is not recoverable, in analyze's problems as in verify's."""
    local, whole, _, _ = uploaded
    url = foreign(whole)
    problems = spark.read.parquet(result.tables["problems"]).collect()
    found = sorted((p["kind"], p["file"], p["lsn"]) for p in problems if p["archive"] == url)
    assert {kind for kind, _, _ in found} >= {"foreign_segment"}
    assert {file for kind, file, _ in found if kind == "foreign_segment"} == \
        {p.name for p in local.iterdir()}
    report, _ = verify_archive(url, jobs=1)
    assert sorted((p.kind, p.file, p.lsn) for p in report.problems) == found
    assert result.archives[url].recoverable is False
    assert result.archives[url].system_identifier == int(OTHER_SYSTEM)
