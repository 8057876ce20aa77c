"""``receivewal analyze``: the verify work as a PySpark job over many archives (one per server).

The driver lists each archive (a local directory, or a Hadoop path listed through Spark's
``binaryFile`` source without reading contents), plans one task per segment with the same
rules as ``verify``, and ships *file paths* to the executors. Each executor reads and scans its
segments itself (a Python UDF calling :func:`receivewal.verify.scan_file`; Hadoop paths are
opened with pyarrow's file systems), so no segment byte passes through the JVM. The driver
then cross-checks each archive's per-segment summaries (a few hundred bytes per segment) and
writes Parquet tables and a report.

With ``--remote sc://HOST:PORT`` the same job runs over Spark Connect: only the DataFrame API
is used (no SparkContext or RDD), the UDF is shipped by reference, so the server's Python
workers must be able to import ``receivewal``, and the Connect server writes the Parquet
tables itself, so archive paths and the output directory must be the same for the client
and the server (one machine, a shared file system, or Hadoop URIs for the archives).

pyspark, pyarrow and matplotlib are imported inside functions: this module imports without
the ``spark`` extra, so the CLI and ``verify`` work without it.
"""

# ruff: noqa: PLC0415 - pyspark, pyarrow and matplotlib are the optional spark extra: lazy
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

import click

from receivewal.archive.compression import Opener, open_local
from receivewal.check.crosscheck import (
    ArchiveReport,
    ScanTask,
    check_archive,
    choose_files,
    plan_scans,
)
from receivewal.check.verify import classify, detect_segment_size, scan_file
from receivewal.errors import ArchiveError, ConfigurationError
from receivewal.wal.lsn import DEFAULT_SEGMENT_SIZE, format_lsn
from receivewal.wal.names import SegmentFile, parse_history_file_name
from receivewal.wal.reader import RmgrTotals, SegmentScan, WalProblem
from receivewal.wal.rmgr import rmgr_name

LOG4J2 = "rootLogger.level = error\nrootLogger.appenderRef.stderr.ref = console\n" \
         "appender.console.type = Console\nappender.console.name = console\n" \
         "appender.console.target = SYSTEM_ERR\nappender.console.layout.type = PatternLayout\n" \
         "logger.repl.name = org.apache.spark.repl.Main\nlogger.repl.level = error\n"

TASK_SCHEMA = ("archive string, base string, file string, compression string, timeline long, "
               "segno long, partial boolean, followers string, file_bytes long, "
               "segment_size long, compressibility boolean")
RESULT_SCHEMA = (
    "struct<file_bytes: bigint, data_bytes: bigint, zstd_bytes: bigint, lz4_bytes: bigint, "
    "seconds: double, records: bigint, record_bytes: bigint, fpi_bytes: bigint, "
    "valid_end: bigint, switched: boolean, system_identifier: string, scan_json: string, "
    "rmgr: array<struct<rmgr: string, rmgr_id: int, records: bigint, record_bytes: bigint, "
    "fpi_bytes: bigint>>, "
    "problems: array<struct<kind: string, file: string, lsn: bigint, detail: string, "
    "severity: string>>>"
)


# -- sessions ----------------------------------------------------------------------------------
def make_session(remote: str | None = None, scratch: Path | None = None,
                 master: str = "local[*]") -> Any:
    """The Spark session: Spark Connect with ``remote``; the cluster's under spark-submit;
    else an embedded local session with settings fit for one machine."""
    from pyspark.sql import SparkSession

    if remote:
        return SparkSession.builder.remote(remote).getOrCreate()
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # launched by spark-submit: its conf applies
        return SparkSession.builder.getOrCreate()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need this environment
    scratch = scratch or Path(tempfile.mkdtemp(prefix="receivewal-spark-"))
    scratch.mkdir(parents=True, exist_ok=True)
    log_conf = scratch / "log4j2.properties"
    log_conf.write_text(LOG4J2)
    java_opts = f"-Dlog4j2.configurationFile=file:{log_conf} -Dderby.system.home={scratch}"
    spark = (
        SparkSession.builder.master(master).appName("receivewal-analyze")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.local.dir", str(scratch))
        .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", str(os.cpu_count() or 2))
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.ui.enabled", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.execution.pythonUDF.arrow.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# -- files -------------------------------------------------------------------------------------
def is_uri(path: str) -> bool:
    """Whether ``path`` is a URI (hdfs://, s3a://, file://...) rather than a local path."""
    return "://" in path


def open_uri(uri: str) -> BinaryIO:
    """Open a file named by a URI with pyarrow's file systems (hdfs, s3/s3a, gs, file)."""
    from pyarrow import fs as pafs

    if uri.startswith("s3a://"):
        uri = "s3://" + uri[len("s3a://"):]
    filesystem, path = pafs.FileSystem.from_uri(uri)
    return cast(BinaryIO, filesystem.open_input_stream(path))


def opener_for(base: str) -> Opener | None:
    """How executors open files under ``base`` (None: the local file system)."""
    return open_uri if is_uri(base) else None


def list_archive(spark: Any, root: str) -> list[tuple[str, int]]:
    """(file name, size) of every file directly under ``root``; contents are not read."""
    if not is_uri(root):
        with os.scandir(root) as entries:
            return sorted((e.name, e.stat().st_size) for e in entries if e.is_file())
    rows = spark.read.format("binaryFile").load(root).select("path", "length").collect()
    return sorted((r["path"].rsplit("/", 1)[-1], int(r["length"])) for r in rows)


# -- executors ---------------------------------------------------------------------------------
def scan_to_json(scan: SegmentScan) -> str:
    """A scan as JSON (without the record list), for the driver's cross-checks."""
    data = dataclasses.asdict(scan)
    data["record_lsns"] = []
    data["rmgr"] = {str(k): dataclasses.asdict(v) for k, v in scan.rmgr.items()}
    data["record_types"] = {str(k): dataclasses.asdict(v) for k, v in scan.record_types.items()}
    return json.dumps(data)


def scan_from_json(text: str) -> SegmentScan:
    """The inverse of :func:`scan_to_json`."""
    data = json.loads(text)
    data["rmgr"] = {int(k): RmgrTotals(**v) for k, v in data["rmgr"].items()}
    data["record_types"] = {int(k): RmgrTotals(**v) for k, v in data["record_types"].items()}
    data["page_tlis"] = tuple(tuple(x) for x in data["page_tlis"])
    data["record_lsns"] = ()
    data["problems"] = tuple(WalProblem(**p) for p in data["problems"])
    return SegmentScan(**data)


def scan_row(row: Any) -> dict[str, Any]:
    """Executor side: read and scan one segment named by a task row."""
    seg = SegmentFile(segno=row.segno, timeline=row.timeline, compression=row.compression,
                      partial=row.partial)
    task = ScanTask(row.file, seg, tuple(tuple(f) for f in json.loads(row.followers)))
    base = row.base
    result = scan_file(task, base, row.segment_size, compressibility=row.compressibility,
                       open_binary=opener_for(base), file_bytes=row.file_bytes)
    scan = result.scan
    problems = [dataclasses.asdict(p) for p in (scan.problems if scan else result.problems)]
    return {
        "file_bytes": result.file_bytes, "zstd_bytes": result.zstd_bytes,
        "lz4_bytes": result.lz4_bytes, "seconds": result.seconds,
        "data_bytes": scan.data_bytes if scan else None,
        "records": scan.records if scan else None,
        "record_bytes": scan.record_bytes if scan else None,
        "fpi_bytes": scan.fpi_bytes if scan else None,
        "valid_end": scan.valid_end if scan else None,
        "switched": scan.switched if scan else None,
        "system_identifier": None if scan is None or scan.system_identifier is None
        else str(scan.system_identifier),
        "scan_json": scan_to_json(scan) if scan else None,
        "rmgr": [{"rmgr": rmgr_name(k), "rmgr_id": k, "records": v.records,
                  "record_bytes": v.record_bytes, "fpi_bytes": v.fpi_bytes}
                 for k, v in sorted(scan.rmgr.items())] if scan else [],
        "problems": problems,
    }


# -- the job -----------------------------------------------------------------------------------
@dataclass
class AnalyzeResult:
    """What the job wrote and found."""

    output: Path
    archives: dict[str, ArchiveReport]
    seconds: float
    segments: int
    tables: dict[str, str]
    report_files: list[Path]


def plan_archive(spark: Any, root: str, compressibility: bool
                 ) -> tuple[list[tuple[Any, ...]], dict[int, str], int, list[WalProblem]]:
    """Task rows, history texts, segment size and naming problems of one archive."""
    files = list_archive(spark, root)
    sizes = dict(files)
    names = [n for n, _ in files]
    base = root.rstrip("/")
    if not classify(names, DEFAULT_SEGMENT_SIZE)[0]:
        raise ArchiveError(f"{root} holds no WAL segment files")
    opener = opener_for(base)
    segment_size = detect_segment_size(base, names, opener)
    segments, history_names = classify(names, segment_size)
    chosen, problems = choose_files(segments)
    rows = [(root, base, t.file, t.segment.compression, t.segment.timeline, t.segment.segno,
             t.segment.partial, json.dumps(t.followers), sizes[t.file], segment_size,
             compressibility) for t in plan_scans(chosen)]
    histories = {}
    for name in history_names:
        tli = parse_history_file_name(name)
        if tli is not None:
            with (opener or open_local)(base + "/" + name) as fh:
                histories[tli] = fh.read().decode(errors="replace")
    return rows, histories, segment_size, problems


def _parallelism(spark: Any) -> int:
    try:
        return int(spark.sparkContext.defaultParallelism)
    except (AttributeError, NotImplementedError):  # Spark Connect sessions have no SparkContext
        return 16


def run_analyze(spark: Any, roots: Iterable[str], output: Path, *,
                compressibility: bool = True, report: bool = True) -> AnalyzeResult:
    """Scan every segment of every archive on Spark; write Parquet tables and a report."""
    from pyspark.sql import functions as sf

    began = time.perf_counter()
    output = output.resolve()  # a Connect server resolves a relative path in its own directory
    output.mkdir(parents=True, exist_ok=True)
    roots = list(dict.fromkeys(roots))
    rows, plans = [], {}
    for root in roots:
        archive_rows, histories, segment_size, problems = plan_archive(spark, root,
                                                                       compressibility)
        rows += archive_rows
        plans[root] = (histories, segment_size, problems)
    partitions = max(1, min(len(rows), _parallelism(spark) * 4))
    tasks = spark.createDataFrame(rows, TASK_SCHEMA).repartition(partitions)
    scan_udf = sf.udf(scan_row, RESULT_SCHEMA, useArrow=False)
    scanned = tasks.withColumn("r", scan_udf(sf.struct(*tasks.columns))).select(
        "archive", "file", "timeline", "segno", "partial", "compression", "r.*").persist()

    tables = {name: str(output / name) for name in ("segments", "segment_rmgr", "problems",
                                                     "archives")}
    scanned.select(
        "archive", "file", "timeline", "segno", "partial", "compression", "file_bytes",
        "data_bytes", "zstd_bytes", "lz4_bytes", "records", "record_bytes", "fpi_bytes",
        "valid_end", "switched", "system_identifier", "seconds",
        sf.size("problems").alias("problems"),
    ).write.mode("overwrite").parquet(tables["segments"])
    scanned.select("archive", "file", "timeline", "segno", sf.explode("rmgr").alias("m")) \
        .select("archive", "file", "timeline", "segno", "m.*") \
        .write.mode("overwrite").parquet(tables["segment_rmgr"])

    collected = scanned.select("archive", "file", "scan_json", "problems").collect()
    scanned.unpersist()
    reports = {}
    for root in roots:
        histories, segment_size, naming = plans[root]
        own = [r for r in collected if r["archive"] == root]
        unreadable = [WalProblem(**p.asDict()) for r in own if r["scan_json"] is None
                      for p in r["problems"]]
        scans = [scan_from_json(r["scan_json"]) for r in own if r["scan_json"] is not None]
        reports[root] = check_archive(segment_size, scans, histories,
                                      extra_problems=naming + unreadable)
    problem_rows = [(root, p.kind, p.file, p.lsn, format_lsn(p.lsn), p.severity, p.detail)
                    for root, rep in reports.items() for p in rep.problems]
    spark.createDataFrame(problem_rows, "archive string, kind string, file string, lsn long, "
                          "lsn_text string, severity string, detail string") \
        .write.mode("overwrite").parquet(tables["problems"])
    archive_rows = [(root, rep.recoverable, str(rep.system_identifier),
                     rep.recovery.timeline if rep.recovery else None,
                     format_lsn(rep.recovery.start_lsn) if rep.recovery else None,
                     format_lsn(rep.recovery.end_lsn) if rep.recovery else None,
                     rep.recovery.stop_reason if rep.recovery else "no segments",
                     len(rep.scans), rep.segment_size) for root, rep in reports.items()]
    spark.createDataFrame(archive_rows, "archive string, recoverable boolean, "
                          "system_identifier string, timeline long, start_lsn string, "
                          "end_lsn string, stop_reason string, segments long, "
                          "segment_size long").write.mode("overwrite").parquet(tables["archives"])
    report_files: list[Path] = []
    if report:
        from receivewal.check.report import write_report

        report_files = write_report(spark, tables, reports, output / "report")
    return AnalyzeResult(output, reports, time.perf_counter() - began, len(rows), tables,
                         report_files)


@click.command("analyze")
@click.argument("inputs", nargs=-1, required=True)
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path),
              default=Path("receivewal-analysis"), show_default=True,
              help="Directory for the Parquet tables and the report.")
@click.option("--remote", default=None, metavar="sc://HOST:PORT",
              help="Run on a Spark Connect server instead of an embedded local session.")
@click.option("--master", default="local[*]", show_default=True,
              help="Master of the embedded session (ignored with --remote or spark-submit).")
@click.option("--no-compressibility", is_flag=True,
              help="Skip measuring each segment after zstd level 1 and lz4.")
def analyze_command(inputs: tuple[str, ...], output: Path, remote: str | None, master: str,
                    no_compressibility: bool) -> None:
    """Verify and analyse WAL archives (directories or Hadoop paths) as a Spark job."""
    try:
        import pyspark  # noqa: F401 - only to fail early with a clear message
    except ImportError as exc:
        raise click.ClickException("analyze needs the spark extra: "
                                   "pip install 'receivewal[spark]'") from exc
    spark = make_session(remote, master=master)
    try:
        result = run_analyze(spark, [str(Path(i).resolve()) if not is_uri(i) else i
                                     for i in inputs], output,
                             compressibility=not no_compressibility)
    except (ArchiveError, ConfigurationError) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        if remote:
            spark.stop()  # releases the session on the Connect server
    for root, rep in result.archives.items():
        errors = sum(p.severity == "error" for p in rep.problems)
        verdict = "recoverable" if rep.recoverable else "NOT recoverable"
        click.echo(f"{root}: {len(rep.scans)} segments, {errors} error(s), {verdict}")
    click.echo(f"tables: {', '.join(result.tables.values())}")
    for path in result.report_files:
        click.echo(f"report: {path}")
    click.echo(f"{result.segments} segments in {result.seconds:.1f} s")
    if not all(rep.recoverable for rep in result.archives.values()):
        raise click.exceptions.Exit(1)
