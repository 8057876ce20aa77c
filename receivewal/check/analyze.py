"""The ``analyze`` job: the verify work as a PySpark job over many archives (one per server).

The driver lists each archive (a directory; ``s3://`` with boto3; a Hadoop path with Spark's
``binaryFile`` source, contents unread), plans one task per segment with the same rules as
``verify``, and ships *file paths* to the executors. Each executor reads and scans its segments
itself (a Python UDF calling :func:`receivewal.check.verify.scan_file`; objects streamed with
boto3, Hadoop paths with pyarrow), so no segment byte passes through the JVM; it also
picks the timestamps out of commit and checkpoint records (:mod:`receivewal.check.walclock`).
The driver then cross-checks each archive's per-segment summaries (a few hundred bytes per
segment), spreads its WAL over the hours, and writes Parquet tables and a report
(:mod:`receivewal.check.report`). The command line is :mod:`receivewal.commands.analyze`.

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
import datetime
import io
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

from receivewal.archive.compression import Opener, open_local, read_wal_file
from receivewal.archive.location import is_bucket_url, is_uri, pyarrow_uri
from receivewal.archive.sealed import DecryptingOpener, Unsealer, fingerprint_of, sealed_cap
from receivewal.archive.sources import BucketOpener, OpenedLocation, recorded_identity
from receivewal.archive.view import locate
from receivewal.check.crosscheck import (
    ArchiveReport,
    FollowerRun,
    ScanTask,
    check_archive,
    choose_files,
    plan_scans,
)
from receivewal.check.verify import (
    classify,
    detect_segment_size,
    histories_of,
    scan_file,
    system_identifier_of,
)
from receivewal.check.walclock import WalClock, thin_marks, time_marks, wal_clock
from receivewal.errors import ArchiveError
from receivewal.wal.lsn import DEFAULT_SEGMENT_SIZE, format_lsn
from receivewal.wal.names import ENCRYPTED_SUFFIX, SegmentFile
from receivewal.wal.reader import RmgrTotals, SegmentScan, WalProblem
from receivewal.wal.rmgr import rmgr_name

TASK_SCHEMA = ("archive string, base string, file string, compression string, timeline long, "
               "segno long, partial boolean, followers string, file_bytes long, "
               "segment_size long, compressibility boolean, identity string")
RESULT_SCHEMA = (
    "struct<file_bytes: bigint, data_bytes: bigint, zstd_bytes: bigint, lz4_bytes: bigint, "
    "seconds: double, records: bigint, record_bytes: bigint, fpi_bytes: bigint, "
    "valid_end: bigint, switched: boolean, system_identifier: string, scan_json: string, "
    "rmgr: array<struct<rmgr: string, rmgr_id: int, records: bigint, record_bytes: bigint, "
    "fpi_bytes: bigint>>, "
    "problems: array<struct<kind: string, file: string, lsn: bigint, detail: string, "
    "severity: string>>, "
    "marks: array<struct<lsn: bigint, time: double>>>"
)


# -- files -------------------------------------------------------------------------------------
def open_uri(uri: str) -> BinaryIO:
    """Open a file named by a URI with pyarrow's file systems (hdfs, s3/s3a, gs, file)."""
    from pyarrow import fs as pafs

    filesystem, path = pafs.FileSystem.from_uri(pyarrow_uri(uri))
    return cast(BinaryIO, filesystem.open_input_stream(path))


def opener_for(base: str) -> Opener | None:
    """How executors open files under ``base``: an ``s3://`` archive with boto3 (through
    :mod:`receivewal.archive.bucket`), other URIs with pyarrow, None for local files."""
    if is_bucket_url(base):
        return BucketOpener(base)
    return open_uri if is_uri(base) else None


def list_archive(spark: Any, root: str) -> list[tuple[str, int]]:
    """(file name, size) of every file directly under ``root``; contents are not read (an
    ``s3://`` archive: one listing of the prefix, on the driver; a directory as verify lists
    it, so that a FIFO, a device or a directory under a WAL file's name is that file,
    unreadable, and reported)."""
    if is_bucket_url(root) or not is_uri(root):
        return locate(root).listing()
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


class _KeepRaw:
    """An opener that keeps the raw bytes of one file as it is read, so that the executor can
    decode it a second time (for the record timestamps) without reading it twice.

    At most ``limit`` bytes are kept: a file larger than that is oversize for its segment size
    in any format (compressed WAL is never twice the segment), so what is kept is enough for
    the reader to report it as a problem, and memory stays bounded whatever the file's size.
    """

    def __init__(self, path: str, inner: Opener | None, limit: int) -> None:
        self.path, self.inner, self.raw, self.limit = path, inner or open_local, b"", limit

    def __call__(self, path: str) -> BinaryIO:
        if path != self.path:
            return self.inner(path)
        with self.inner(path) as fh:
            self.raw = fh.read(self.limit)
        return io.BytesIO(self.raw)


def marks_of(scan: SegmentScan, keep: _KeepRaw, compression: str) -> list[dict[str, Any]]:
    """The segment's timestamped records (first and last of each second), as rows."""
    if not scan.record_lsns or not keep.raw:
        return []
    data = read_wal_file(keep.path, compression, open_binary=lambda _: io.BytesIO(keep.raw))
    return [{"lsn": lsn, "time": when}
            for lsn, when in thin_marks(time_marks(data, scan.start_lsn, scan.record_lsns))]


def scan_row(row: Any) -> dict[str, Any]:
    """Executor side: read and scan one segment named by a task row."""
    seg = SegmentFile(segno=row.segno, timeline=row.timeline, compression=row.compression,
                      partial=row.partial, encrypted=row.file.endswith(ENCRYPTED_SUFFIX),
                      fingerprint=fingerprint_of(row.file))
    task = ScanTask(row.file, seg, tuple(FollowerRun(*f) for f in json.loads(row.followers)))
    base = row.base
    inner = opener_for(base)
    if seg.encrypted or any(f.encrypted for f in task.followers):  # decrypted on the executor
        inner = DecryptingOpener(inner, row.identity, sealed_cap(row.segment_size))
    keep = _KeepRaw(base.rstrip("/") + "/" + row.file, inner,
                    limit=2 * row.segment_size + 1)
    result = scan_file(task, base, row.segment_size, compressibility=row.compressibility,
                       collect_lsns=True, open_binary=keep, file_bytes=row.file_bytes)
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
        "marks": marks_of(scan, keep, row.compression) if scan else [],
    }


# -- the job -----------------------------------------------------------------------------------
@dataclass
class AnalyzeResult:
    """What the job wrote and found."""

    output: Path
    archives: dict[str, ArchiveReport]
    clocks: dict[str, WalClock]
    seconds: float
    segments: int
    tables: dict[str, str]
    report_files: list[Path]


def plan_archive(spark: Any, root: str, compressibility: bool, identity_file: str | None = None,
                 ) -> tuple[list[tuple[Any, ...]], dict[int, str], int, list[WalProblem],
                            int | None]:
    """Task rows, history texts, segment size, naming problems and the system identifier
    its identity record names (None: none) of one archive; ``identity_file`` decrypts its
    sealed segments on the executors (the same path on each)."""
    files = list_archive(spark, root)
    sizes = dict(files)
    names = [n for n, _ in files]
    base = root.rstrip("/")
    if not classify(names, DEFAULT_SEGMENT_SIZE)[0]:
        raise ArchiveError(f"{root} holds no WAL segment files")
    opener = opener_for(base)
    identity = recorded_identity(base, names, opener)
    segment_size = detect_segment_size(base, names, opener, identity)
    segments, history_names = classify(names, segment_size)
    chosen, problems = choose_files(segments)
    rows = [(root, base, t.file, t.segment.compression, t.segment.timeline, t.segment.segno,
             t.segment.partial, json.dumps(t.followers), sizes[t.file], segment_size,
             compressibility, identity_file)
            for t in plan_scans(chosen, segment_size=segment_size)]
    histories = histories_of(OpenedLocation(base, opener), history_names, problems)
    return rows, dict(histories), segment_size, problems, system_identifier_of(identity)


def parallelism(spark: Any) -> int:
    try:
        return int(spark.sparkContext.defaultParallelism)
    except (AttributeError, NotImplementedError):  # Spark Connect sessions have no SparkContext
        return 16


def run_analyze(spark: Any, roots: Iterable[str], output: Path, *,
                compressibility: bool = True, report: bool = True,
                identity_file: str | None = None) -> AnalyzeResult:
    """Scan every segment of every archive on Spark; write Parquet tables and a report.
    Sealed segments are decrypted with ``identity_file`` (``--identity``: checked here, and
    read at the same path by every executor); without one, each is a ``not_checked``
    problem."""
    if identity_file:
        Unsealer(identity_file).keys()  # a bad identity file fails before the job starts
    began = time.perf_counter()
    output = output.resolve()  # a Connect server resolves a relative path in its own directory
    output.mkdir(parents=True, exist_ok=True)
    roots = list(dict.fromkeys(roots))
    rows, plans = [], {}
    for root in roots:
        archive_rows, histories, segment_size, problems, sysid = plan_archive(
            spark, root, compressibility, identity_file)
        rows += archive_rows
        plans[root] = (histories, segment_size, problems, sysid)
    tables = {name: str(output / name) for name in ("segments", "segment_rmgr", "problems",
                                                     "archives", "wal_per_hour")}
    collected = _scan_all(spark, rows, tables)
    reports, clocks = {}, {}
    for root in roots:
        histories, segment_size, naming, sysid = plans[root]
        own = [r for r in collected if r["archive"] == root]
        unreadable = [WalProblem(**p.asDict()) for r in own if r["scan_json"] is None
                      for p in r["problems"]]
        scans = [scan_from_json(r["scan_json"]) for r in own if r["scan_json"] is not None]
        reports[root] = check_archive(segment_size, scans, histories,
                                      extra_problems=naming + unreadable,
                                      system_identifier=sysid)
        clocks[root] = wal_clock(scans, segment_size,
                                 ((m["lsn"], m["time"]) for r in own for m in r["marks"]))
    _write_archive_tables(spark, tables, reports, clocks)
    report_files: list[Path] = []
    if report:
        from receivewal.check.report import write_report

        report_files = write_report(spark, tables, reports, clocks, output / "report")
    return AnalyzeResult(output, reports, clocks, time.perf_counter() - began, len(rows),
                         tables, report_files)


def _scan_all(spark: Any, rows: list[tuple[Any, ...]], tables: dict[str, str]) -> list[Any]:
    """Run the scans; write the per-segment tables; collect what the cross-checks need."""
    from pyspark.sql import functions as sf

    partitions = max(1, min(len(rows), parallelism(spark) * 4))
    tasks = spark.createDataFrame(rows, TASK_SCHEMA).repartition(partitions)
    scan_udf = sf.udf(scan_row, RESULT_SCHEMA, useArrow=False)
    scanned = tasks.withColumn("r", scan_udf(sf.struct(*tasks.columns))).select(
        "archive", "file", "timeline", "segno", "partial", "compression", "r.*").persist()
    scanned.select(
        "archive", "file", "timeline", "segno", "partial", "compression", "file_bytes",
        "data_bytes", "zstd_bytes", "lz4_bytes", "records", "record_bytes", "fpi_bytes",
        "valid_end", "switched", "system_identifier", "seconds",
        sf.size("problems").alias("problems"),
    ).write.mode("overwrite").parquet(tables["segments"])
    scanned.select("archive", "file", "timeline", "segno", sf.explode("rmgr").alias("m")) \
        .select("archive", "file", "timeline", "segno", "m.*") \
        .write.mode("overwrite").parquet(tables["segment_rmgr"])
    collected = scanned.select("archive", "file", "scan_json", "problems", "marks").collect()
    scanned.unpersist()
    return list(collected)


def _write_archive_tables(spark: Any, tables: dict[str, str],
                          reports: dict[str, ArchiveReport], clocks: dict[str, WalClock]) -> None:
    """The problems, archives and wal_per_hour tables (made on the driver: they are small)."""
    problem_rows = [(root, p.kind, p.file, p.lsn, format_lsn(p.lsn), p.severity, p.detail)
                    for root, rep in reports.items() for p in rep.problems]
    spark.createDataFrame(problem_rows, "archive string, kind string, file string, lsn long, "
                          "lsn_text string, severity string, detail string") \
        .write.mode("overwrite").parquet(tables["problems"])
    archive_rows = []
    for root, rep in reports.items():
        rec, clock = rep.recovery, clocks[root]
        archive_rows.append((
            root, rep.recoverable, str(rep.system_identifier),
            rec.timeline if rec else None, format_lsn(rec.start_lsn) if rec else None,
            format_lsn(rec.end_lsn) if rec else None, rec.stop_reason if rec else "no segments",
            len(rep.scans), rep.segment_size, clock.wal_bytes,
            _utc(clock.span[0]) if clock.span else None,
            _utc(clock.span[1]) if clock.span else None))
    spark.createDataFrame(archive_rows, "archive string, recoverable boolean, "
                          "system_identifier string, timeline long, start_lsn string, "
                          "end_lsn string, stop_reason string, segments long, "
                          "segment_size long, wal_bytes long, first_record_time timestamp, "
                          "last_record_time timestamp") \
        .write.mode("overwrite").parquet(tables["archives"])
    hour_rows = [(root, _utc(hour), n) for root, clock in clocks.items()
                 for hour, n in clock.hourly.items()]
    spark.createDataFrame(hour_rows, "archive string, hour timestamp, wal_bytes long") \
        .write.mode("overwrite").parquet(tables["wal_per_hour"])


def _utc(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC)


def summary_lines(result: AnalyzeResult) -> list[str]:
    """What ``analyze`` prints: a verdict per archive, then where the tables and report are."""
    from receivewal.check.sizes import human_bytes

    lines = []
    for root, rep in result.archives.items():
        errors = sum(p.severity == "error" for p in rep.problems)
        verdict = "recoverable" if rep.recoverable else "NOT recoverable"
        lines.append(f"{root}: {len(rep.scans)} segments, "
                     f"{human_bytes(result.clocks[root].wal_bytes)} of WAL, "
                     f"{errors} error(s), {verdict}")
    lines.append(f"tables: {', '.join(result.tables.values())}")
    lines += [f"report: {path}" for path in result.report_files if path.suffix != ".png"]
    lines.append(f"{result.segments} segments in {result.seconds:.1f} s")
    return lines
