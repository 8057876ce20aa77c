"""``receivewal analyze`` on an embedded local Spark session over archives of two real servers.

One Spark session is shared by the module (JVM start-up dominates); each archive comes from its
own PostgreSQL 15 server, so the two have different system identifiers. The second archive has
a segment removed and is given as a ``file://`` URI, so it takes the Hadoop-path route: listed
through Spark's binaryFile source, read by the executors through pyarrow's file systems. The
Parquet tables must agree with ``verify`` on the same directories.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.sparkarchives import SEGMENT_SIZE, archive_key, two_server_archives

from receivewal.check.analyze import (
    AnalyzeResult,
    make_session,
    run_analyze,
    scan_from_json,
    scan_to_json,
)
from receivewal.check.verify import rmgr_totals, verify_archive

pytestmark = [pytest.mark.spark, pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The module's one embedded Spark session (two cores: the machine is shared)."""
    session = make_session(scratch=tmp_path_factory.mktemp("spark"), master="local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, str]]:
    """Two archives from two servers; the second lacks one segment (its name is returned)."""
    with two_server_archives(tmp_path_factory.mktemp("archives"), "receivewal-analyze-") as built:
        yield built


key = archive_key


@pytest.fixture(scope="module")
def result(spark: Any, archives: tuple[Path, Path, str],
           tmp_path_factory: pytest.TempPathFactory) -> AnalyzeResult:
    """One analyze run over both archives."""
    alpha, beta, _ = archives
    return run_analyze(spark, [key(alpha), key(beta)], tmp_path_factory.mktemp("analysis"))


def test_segment_table_agrees_with_verify(spark: Any, result: AnalyzeResult,
                                          archives: tuple[Path, Path, str]) -> None:
    """One row per segment file per archive; records and bytes equal verify's."""
    segments = spark.read.parquet(result.tables["segments"])
    for archive in archives[:2]:
        rows = segments.where(segments.archive == key(archive)).collect()
        report, _ = verify_archive(archive, jobs=1)
        assert len(rows) == len(report.scans) == len(list(archive.iterdir()))
        assert sum(r["records"] for r in rows) == sum(s.records for s in report.scans)
        assert sum(r["fpi_bytes"] for r in rows) == sum(s.fpi_bytes for s in report.scans)
        assert all(r["zstd_bytes"] < r["data_bytes"] for r in rows)
        assert all(r["data_bytes"] == SEGMENT_SIZE for r in rows)


def test_rmgr_table_agrees_with_verify(spark: Any, result: AnalyzeResult,
                                       archives: tuple[Path, Path, str]) -> None:
    """Records, record bytes and FPI bytes per resource manager equal verify's totals."""
    table = spark.read.parquet(result.tables["segment_rmgr"])
    for archive in archives[:2]:
        totals: dict[str, tuple[int, int, int]] = {}
        for r in table.where(table.archive == key(archive)).collect():
            acc = totals.get(r["rmgr"], (0, 0, 0))
            totals[r["rmgr"]] = (acc[0] + r["records"], acc[1] + r["record_bytes"],
                                 acc[2] + r["fpi_bytes"])
        report, _ = verify_archive(archive, jobs=1)
        assert totals == rmgr_totals(report.scans)
        assert "Heap" in totals


def test_problems_and_archives_tables(spark: Any, result: AnalyzeResult,
                                      archives: tuple[Path, Path, str]) -> None:
    """The removed segment is a missing_segment problem with its file and LSN; the intact
    archive is recoverable, the other is not; the two system identifiers differ."""
    alpha, beta, removed = archives
    problems = spark.read.parquet(result.tables["problems"]).collect()
    assert not [p for p in problems if p["archive"] == key(alpha)]
    missing = [p for p in problems if p["archive"] == key(beta) and p["kind"] == "missing_segment"]
    assert [(p["file"], p["lsn"]) for p in missing] == [
        (removed, int(removed[16:], 16) * SEGMENT_SIZE)]
    rows = {r["archive"]: r for r in spark.read.parquet(result.tables["archives"]).collect()}
    assert rows[key(alpha)]["recoverable"] is True
    assert rows[key(beta)]["recoverable"] is False
    assert rows[key(alpha)]["system_identifier"] != rows[key(beta)]["system_identifier"]


def test_report_has_charts_and_pages(result: AnalyzeResult) -> None:
    """Four PNG charts plus Markdown and HTML pages that name both archives."""
    pngs = [p for p in result.report_files if p.suffix == ".png"]
    assert len(pngs) == 4
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    md = next(p for p in result.report_files if p.suffix == ".md").read_text()
    assert "alpha" in md
    assert "beta" in md
    assert "missing_segment" in md
    assert "<img src='compressibility.png'" in next(
        p for p in result.report_files if p.suffix == ".html").read_text()


def test_scan_json_round_trip(archives: tuple[Path, Path, str]) -> None:
    """The per-segment summary the executors send to the driver loses nothing it needs."""
    report, _ = verify_archive(archives[0], jobs=1)
    scan = report.scans[0]
    assert scan_from_json(scan_to_json(scan)) == scan
