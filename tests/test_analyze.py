"""``receivewal analyze`` on an embedded local Spark session over archives of two real servers.

One Spark session is shared (tests/conftest.py: JVM start-up dominates); each archive comes from
its own PostgreSQL 15 server, so the two have different system identifiers. The second archive has
a segment removed and is given as a ``file://`` URI, so it takes the Hadoop-path route: listed
through Spark's binaryFile source, read by the executors through pyarrow's file systems. The
Parquet tables must agree with ``verify`` on the same directories.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from support.sparkarchives import (
    SEGMENT_SIZE,
    SharedSession,
    TwoArchives,
    archive_key,
    rmgr_table_totals,
)

from receivewal.check import sparksession
from receivewal.check.analyze import (
    AnalyzeResult,
    run_analyze,
    scan_from_json,
    scan_to_json,
)
from receivewal.check.report import utc
from receivewal.check.verify import rmgr_totals, verify_archive
from receivewal.commands.group import cli

pytestmark = [pytest.mark.spark, pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def archives(two_archives: TwoArchives) -> tuple[Path, Path, str]:
    """Two archives from two servers; the second lacks one segment (its name is returned)."""
    BUILT[:] = two_archives.built
    return two_archives.alpha, two_archives.beta, two_archives.removed


key = archive_key
BUILT: list[float] = []  # when the archives' servers were started and stopped


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
    for archive in archives[:2]:
        totals = rmgr_table_totals(spark, result.tables["segment_rmgr"], key(archive))
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
    first = min(path.name for path in beta.iterdir())  # the run before the hole: an island
    assert [(p["file"], p["severity"]) for p in problems
            if p["archive"] == key(beta) and p["kind"] == "older_island"] == [(first, "warning")]
    rows = {r["archive"]: r for r in spark.read.parquet(result.tables["archives"]).collect()}
    assert rows[key(alpha)]["recoverable"] is True
    assert rows[key(beta)]["recoverable"] is False
    assert rows[key(alpha)]["system_identifier"] != rows[key(beta)]["system_identifier"]


def section(md: str, title: str) -> str:
    """The text of one ``## title`` section of the Markdown report."""
    return md.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_report_summary_comes_first_and_tells_the_verdict(
        result: AnalyzeResult, archives: tuple[Path, Path, str]) -> None:
    """The summary is the first section: archives, time span, WAL volume in human units,
    recoverable (naming the broken archive) and the problem count."""
    md = (result.output / "report" / "report.md").read_text()
    assert md.split("\n## ")[1].startswith("Summary\n")
    summary = section(md, "Summary")
    alpha_segments = len(list(archives[0].iterdir()))
    beta_segments = len(list(archives[1].iterdir()))
    assert "- **Archives:** 2\n" in summary
    volume = (alpha_segments + beta_segments) * SEGMENT_SIZE / 1024 / 1024
    assert f"- **WAL volume:** {volume:.1f} MB in {alpha_segments + beta_segments} segment files" \
        in summary
    assert "- **Recoverable:** NO: beta (1 of 2 yes)" in summary
    assert "- **Problems:** 1 error(s), 1 warning(s)" in summary  # the hole, the island before it
    first = min(c.span[0] for c in result.clocks.values() if c.span)
    last = max(c.span[1] for c in result.clocks.values() if c.span)
    assert f"- **Time span:** {utc(first)} to {utc(last)} (" in summary
    assert BUILT[0] - 300 <= first <= last <= BUILT[1]


def test_wal_per_hour_adds_up_to_the_archive(spark: Any, result: AnalyzeResult,
                                             archives: tuple[Path, Path, str]) -> None:
    """Bytes per hour (table and report) add up to the WAL the archive holds: every segment
    of the intact archive, the segments of the other one."""
    table = spark.read.parquet(result.tables["wal_per_hour"]).collect()
    for archive in archives[:2]:
        hours = [r["wal_bytes"] for r in table if r["archive"] == key(archive)]
        files = len(list(archive.iterdir()))
        assert hours
        assert sum(hours) == pytest.approx(files * SEGMENT_SIZE, abs=len(hours))
        assert result.clocks[key(archive)].wal_bytes == files * SEGMENT_SIZE
    rows = {r["archive"]: r for r in spark.read.parquet(result.tables["archives"]).collect()}
    assert rows[key(archives[0])]["wal_bytes"] == len(list(archives[0].iterdir())) * SEGMENT_SIZE
    assert rows[key(archives[0])]["first_record_time"] is not None
    md = (result.output / "report" / "report.md").read_text()
    hourly = section(md, "WAL over time")
    assert "| hour (UTC) | alpha | beta |" in hourly
    assert " MB |" in hourly


def test_report_tables_use_human_sizes_and_list_the_problem(result: AnalyzeResult) -> None:
    """Sizes as ``1.2 MB`` and counts with separators; the missing segment is listed."""
    md = (result.output / "report" / "report.md").read_text()
    rmgr = section(md, "Resource managers: alpha")
    assert "| resource manager | records | record bytes | full-page images | share |" in rmgr
    heap = next(line for line in rmgr.splitlines() if line.startswith("| Heap |"))
    records = heap.split(" | ")[1]
    assert "," in records or int(records) < 1000
    assert heap.split(" | ")[2].endswith(("MB", "kB"))
    assert "missing_segment" in section(md, "Problems")
    html = (result.output / "report" / "report.html").read_text()
    assert "<p><b>Recoverable:</b> NO: beta (1 of 2 yes)</p>" in html


def test_report_charts_for_many_archives(result: AnalyzeResult) -> None:
    """Four PNG charts, the comparison among them since there are two archives; the pages
    show them all."""
    pngs = [p for p in result.report_files if p.suffix == ".png"]
    assert [p.name for p in pngs] == ["wal_over_time.png", "wal_by_rmgr.png", "segments.png",
                                      "archives_compared.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    page = (result.output / "report" / "report.html").read_text()
    assert all(f"<img src='{p.name}'" in page for p in pngs)


def test_cli_on_one_archive_is_quiet_and_leaves_no_scratch(
        archives: tuple[Path, Path, str], tmp_path: Path) -> None:
    """``receivewal analyze`` on the intact archive, its own JVM and all, with its summary's
    reader gone (``analyze DIR | head -1`` where the reader has left: a closed pipe, EPIPE):
    exit 0, no error, traceback or Spark WARN line on the console, its scratch directory
    removed; the report says "No problems found." and draws no comparison for a single
    archive. (The verdict it prints: test_cli_prints_the_verdict_of_the_archive; one JVM
    started for both, test_analyze_exits' reader that left is this run.)"""
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch_root)}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "receivewal", "analyze", "-o", "out",
                               str(archives[0])], cwd=tmp_path, env=env, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=600, check=False)
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "error" not in proc.stderr.lower(), proc.stderr
    assert not re.search(r"\bWARN\b|log level", proc.stderr), proc.stderr
    assert not list(scratch_root.glob("receivewal-spark-*"))
    md = (tmp_path / "out" / "report" / "report.md").read_text()
    assert "- **Problems:** No problems found." in section(md, "Summary")
    assert section(md, "Problems").strip() == "No problems found."
    assert "- **Recoverable:** yes, every archive" in md
    assert sorted(p.name for p in (tmp_path / "out" / "report").glob("*.png")) == [
        "segments.png", "wal_by_rmgr.png", "wal_over_time.png"]


def test_cli_prints_the_verdict_of_the_archive(spark: Any, archives: tuple[Path, Path, str],
                                               tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``receivewal analyze`` on the intact archive through the real command group (on the
    shared session; the JVM of its own starts in the test above): exit 0, the verdict and WAL
    volume on stdout."""
    monkeypatch.setattr(sparksession, "make_session", lambda *_, **__: SharedSession(spark))
    run = CliRunner().invoke(cli, ["analyze", "-o", str(tmp_path / "out"), str(archives[0])])
    assert run.exit_code == 0, run.output
    files = len(list(archives[0].iterdir()))
    assert f"{archives[0]}: {files} segments, {files}.0 MB of WAL, 0 error(s), recoverable" \
        in run.stdout


def test_scan_json_round_trip(archives: tuple[Path, Path, str]) -> None:
    """The per-segment summary the executors send to the driver loses nothing it needs."""
    report, _ = verify_archive(archives[0], jobs=1)
    scan = report.scans[0]
    assert scan_from_json(scan_to_json(scan)) == scan
