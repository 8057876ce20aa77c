"""``analyze --changes``: logical change logs (format 1, :doc:`docs/changelog.md`) as a Spark
source, counted per table and per hour.

The driver lists each change log directory as ``analyze`` lists a WAL archive (a directory;
``s3://`` with boto3; a Hadoop URI with Spark's ``binaryFile`` source) and keeps the files
named as the log names them (``.jsonl``, ``.jsonl.zst``, and the ``.partial`` being written,
read as a WAL archive's ``.partial`` segment is: up to the end of its last complete
transaction, :func:`receivewal.logical.scan.scan_file`; a damaged line followed by records is
an error naming it, as in a complete file, never a torn tail). The executors read the files
(``mapInArrow`` over one row per file): each opens its file with the archive's opener,
decompresses it a chunk at a time and hands back its lines in Arrow batches, never the whole
file, each line with the time and gid of the ``begin`` before it (only those lines are parsed
there); Spark parses every line with an explicit schema (:func:`line_schema`, never
inferred). Each change takes the time of its transaction (the ``commit_time`` of its
``begin``, the ``prepare_time`` of its ``begin_prepare``: a transaction never spans two
files), and the changes of a prepared transaction later rolled back (``rollback_prepared``)
are left out. Written: the
``changes_per_hour`` table (log, hour, schema, table, inserts, updates, deletes, truncates,
change_bytes: the bytes of the change lines, newline included; a TRUNCATE of several tables
counts once in each) and ``change_files`` (one row per file), then the report.
"""

# ruff: noqa: PLC0415 - pyspark is the optional spark extra: lazy
from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from receivewal.archive.compression import open_local
from receivewal.archive.location import is_uri
from receivewal.archive.storedform import Unsealing, plain_chunks
from receivewal.check.analyze import list_archive, opener_for, parallelism
from receivewal.errors import ArchiveError, ReceivewalError
from receivewal.logical.scan import scan_file
from receivewal.logical.store import parse_file_name
from receivewal.wal.names import ENCRYPTED_SUFFIX

TASK_SCHEMA = ("log string, base string, file string, compression string, partial boolean, "
               "file_bytes long, identity string")
LINES_SCHEMA = ("log string, file string, n long, line string, tx_time string, "
                "tx_gid string, error string")
BATCH_LINES = 8192
TRANSACTION_OPENS = ("begin", "begin_prepare")
CHANGE_OPS = ("insert", "update", "delete", "truncate")
TIME_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSX"


def line_schema() -> Any:
    """The fields of a change log line that the job reads (the rest are not parsed)."""
    from pyspark.sql import types as st

    text = st.StringType()
    return st.StructType([
        st.StructField("op", text), st.StructField("format", st.LongType()),
        st.StructField("lsn", text), st.StructField("xid", st.LongType()),
        st.StructField("schema", text), st.StructField("table", text),
        st.StructField("tables", st.ArrayType(st.ArrayType(text))),
        st.StructField("gid", text), st.StructField("commit_time", text),
        st.StructField("prepare_time", text)])


@dataclass
class ChangesResult:
    """What the job wrote and found."""

    output: Path
    logs: dict[str, dict[str, Any]]
    """Per log: files, partial files, lines, line_bytes, transactions, changes per op,
    change_bytes, first and last transaction time (Unix seconds, None without one)."""
    seconds: float
    tables: dict[str, str]
    report_files: list[Path]


# -- executors ---------------------------------------------------------------------------------
def _chunks(row: dict[str, Any]) -> Iterator[bytes]:
    """The decompressed content of one file, a chunk at a time (a sealed one, ``.age``,
    decrypted as it is read, through the row's identity file)."""
    opener = opener_for(row["base"]) or open_local
    path = _path(row)
    with opener(path) as fh:
        if not path.endswith(ENCRYPTED_SUFFIX):
            yield from plain_chunks(fh, row["compression"])
            return
        from receivewal.archive.sealed import NoIdentity, Unsealer, recipients_of

        recipients = recipients_of(path, opener)
        unsealer = Unsealer(row.get("identity"))
        if unsealer.key_file is None:
            raise NoIdentity(path, recipients)
        keys = unsealer.keys()
        if recipients is not None:
            keys.require(recipients, file=path)
        yield from plain_chunks(fh, row["compression"], Unsealing(keys, path, recipients))


def _path(row: dict[str, Any]) -> str:
    return str(row["base"]).rstrip("/") + "/" + str(row["file"])


def file_lines(row: dict[str, Any]) -> Iterator[bytes]:
    """The lines of one file without their newlines, read in chunks (a ``.partial`` up to the
    end of its last complete run: read once to find it, then again). A ``.partial`` with a
    damaged line followed by records is an ArchiveError naming the line: damage inside the
    file, not a torn tail (a complete file's damaged line is found by Spark's parse)."""
    left = None
    if row["partial"]:
        found = scan_file(_chunks(row))
        if found.corrupt:
            raise ArchiveError(found.corrupt)
        left = found.good_size
    tail = b""
    for whole in _chunks(row):
        chunk = whole if left is None else whole[:left]
        if left is not None:
            left = max(0, left - len(whole))
        lines = (tail + chunk).split(b"\n")
        tail = lines.pop()
        yield from lines
        if left == 0:
            break
    if tail:
        yield tail


def _batches(row: dict[str, Any]) -> Iterator[Any]:
    """Arrow batches of :data:`LINES_SCHEMA` for one file: its lines, each with the commit
    (or prepare) time and gid of the ``begin`` (``begin_prepare``) before it; a last row with
    the error that stopped reading it, if one did."""
    import pyarrow as pa

    schema = lines_arrow_schema()
    columns: dict[str, list[Any]] = {name: [] for name in schema.names}
    when = gid = error = None

    def batch() -> Any:
        size = len(columns["n"])
        out = pa.RecordBatch.from_pydict(
            {**columns, "log": [row["log"]] * size, "file": [row["file"]] * size}, schema)
        for values in columns.values():
            values.clear()
        return out

    try:
        for n, raw in enumerate(file_lines(row)):
            if b'"begin' in raw:  # only such lines are parsed here; Spark parses every line
                with contextlib.suppress(ValueError):
                    record = json.loads(raw)
                    if isinstance(record, dict) and record.get("op") in TRANSACTION_OPENS:
                        when = record.get("commit_time") or record.get("prepare_time")
                        gid = str(record.get("gid") or "")
            for name, value in (("n", n), ("line", raw.decode("utf-8")), ("tx_time", when),
                                ("tx_gid", gid), ("error", None)):
                columns[name].append(value)
            if len(columns["n"]) >= BATCH_LINES:
                yield batch()
    except (OSError, ReceivewalError, UnicodeDecodeError) as exc:
        error = str(exc) if f'"{_path(row)}"' in str(exc) else f"{_path(row)}: {exc}"
    if error is not None:
        for name, value in (("n", None), ("line", None), ("tx_time", None), ("tx_gid", None),
                            ("error", error)):
            columns[name].append(value)
    yield batch()


def read_files(batches: Iterable[Any]) -> Iterator[Any]:
    """Executor side (``mapInArrow``): the lines of every file named by the task rows, in
    batches of at most :data:`BATCH_LINES`: a file is never held whole."""
    for tasks in batches:
        for row in tasks.to_pylist():
            yield from _batches(row)


def lines_arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("log", pa.string()), ("file", pa.string()), ("n", pa.int64()),
                      ("line", pa.string()), ("tx_time", pa.string()), ("tx_gid", pa.string()),
                      ("error", pa.string())])


# -- the job -----------------------------------------------------------------------------------
def plan_log(spark: Any, root: str, identity: str | None = None) -> list[tuple[Any, ...]]:
    """Task rows of one change log: its files, in name order (``identity``: the identity
    file its sealed ones are read with)."""
    files = []
    for name, size in list_archive(spark, root):
        parsed = parse_file_name(name)
        if parsed is not None:
            files.append((parsed[0], name, parsed[1], parsed[2], size))
    if not files:
        raise ArchiveError(f"{root} holds no change log files (<16 hex digits>.jsonl[.zst])")
    return [(root, root.rstrip("/"), name, compression, partial, size, identity)
            for _, name, compression, partial, size in sorted(files)]


def run_changes(spark: Any, roots: Iterable[str], output: Path, *,
                report: bool = True, identity: str | None = None) -> ChangesResult:
    """Read every change log on Spark (sealed files through the identity file
    ``identity``); write the tables and the report."""
    from pyspark.sql import functions as sf

    began = time.perf_counter()
    output = output.resolve()
    output.mkdir(parents=True, exist_ok=True)
    roots = list(dict.fromkeys(roots))
    rows = [row for root in roots for row in plan_log(spark, root, identity)]
    tables = {name: str(output / name) for name in ("changes_per_hour", "change_files")}
    tasks = spark.createDataFrame(rows, TASK_SCHEMA).repartition(
        max(1, min(len(rows), parallelism(spark) * 4)))
    lines = tasks.mapInArrow(read_files, LINES_SCHEMA).select(
        "log", "file", "n", (sf.octet_length("line") + 1).alias("bytes"),
        sf.from_json("line", line_schema()).alias("j"),
        sf.unix_timestamp(sf.to_timestamp("tx_time", TIME_FORMAT)).alias("tx_time"),
        "tx_gid", "error").select("log", "file", "n", "bytes", "j.*", "tx_time", "tx_gid",
                                  "error").persist()
    try:
        per_file = _file_rows(tasks, lines, sf)
        _write_changes(lines, tables["changes_per_hour"], sf)
    finally:
        lines.unpersist()
    spark.createDataFrame([{k: r[k] for k in FILE_COLUMNS} for r in per_file],
                          FILE_SCHEMA).write.mode("overwrite").parquet(tables["change_files"])
    logs = _log_totals(spark, per_file, tables["changes_per_hour"], sf)
    report_files: list[Path] = []
    if report:
        from receivewal.check.changes_report import write_changes_report

        report_files = write_changes_report(spark, tables, logs, output / "report")
    return ChangesResult(output, logs, time.perf_counter() - began, tables, report_files)


FILE_COLUMNS = ("log", "file", "compression", "partial", "file_bytes", "lines", "line_bytes",
                "transactions", "changes", "first_time", "last_time")
FILE_SCHEMA = ("log string, file string, compression string, partial boolean, "
               "file_bytes long, lines long, line_bytes long, transactions long, "
               "changes long, first_time long, last_time long")


def _file_rows(tasks: Any, lines: Any, sf: Any) -> list[dict[str, Any]]:
    """One row per file (collected: they are few), in the order of the logs and their files.
    ArchiveError naming the first file that could not be read, or the first line that is not
    a change log record of format 1."""
    def count(condition: Any) -> Any:
        return sf.sum(sf.when(condition, 1).otherwise(0)).cast("long")

    op = sf.col("op")
    foreign = (op == "header") & (sf.col("format") != 1)
    per_file = lines.groupBy("log", "file").agg(
        sf.max("error").alias("error"), sf.count("bytes").alias("lines"),
        sf.sum("bytes").cast("long").alias("line_bytes"),
        count(op.isin("commit", "prepare")).alias("transactions"),
        count(op.isin(*CHANGE_OPS)).alias("changes"),
        sf.min("tx_time").alias("first_time"), sf.max("tx_time").alias("last_time"),
        sf.min(sf.when(sf.col("bytes").isNotNull() & (op.isNull() | foreign),
                       sf.col("n"))).alias("bad_line"),
        sf.max(sf.when(foreign, sf.col("format"))).alias("bad_format"))
    rows = [r.asDict() for r in tasks.select(
        "log", "file", "compression", "partial", "file_bytes").join(
        per_file, ["log", "file"], "left").collect()]
    order = {root: i for i, root in enumerate(dict.fromkeys(r["log"] for r in rows))}
    rows.sort(key=lambda r: (order[r["log"]], r["file"]))
    for r in rows:
        if r["error"] is not None:
            raise ArchiveError(r["error"])
        if r["bad_line"] is not None:
            what = (f"a change log of format {r['bad_format']}, not 1"
                    if r["bad_format"] is not None else "not a change log record")
            raise ArchiveError(f"{r['log'].rstrip('/')}/{r['file']}: line "
                               f"{r['bad_line'] + 1} is {what}")
        for key in ("lines", "line_bytes", "transactions", "changes"):
            r[key] = r[key] or 0
    return rows


def _write_changes(lines: Any, path: str, sf: Any) -> None:
    """The ``changes_per_hour`` table, without the changes of prepared transactions rolled
    back."""
    rolled_back = lines.where(sf.col("op") == "rollback_prepared").select(
        "log", "xid", sf.col("gid").alias("tx_gid")).distinct()
    changes = lines.where(sf.col("op").isin(*CHANGE_OPS)).join(
        rolled_back, ["log", "xid", "tx_gid"], "left_anti")
    named = changes.withColumn("t", sf.when(
        sf.col("op") == "truncate", sf.col("tables")).otherwise(
        sf.array(sf.array("schema", "table")))).select(
        "log", "op", "bytes", "tx_time", sf.explode("t").alias("t"))
    counts = [sf.sum(sf.when(sf.col("op") == op, 1).otherwise(0)).cast("long").alias(op + "s")
              for op in CHANGE_OPS]
    named.select("log", (sf.floor(sf.col("tx_time") / 3600) * 3600).alias("hour_seconds"),
                 sf.col("t")[0].alias("schema"), sf.col("t")[1].alias("table"), "op", "bytes") \
        .groupBy("log", "hour_seconds", "schema", "table") \
        .agg(*counts, sf.sum("bytes").cast("long").alias("change_bytes")) \
        .withColumn("hour", sf.timestamp_seconds("hour_seconds")) \
        .select("log", "hour", "hour_seconds", "schema", "table", "inserts", "updates",
                "deletes", "truncates", "change_bytes") \
        .write.mode("overwrite").parquet(path)


def _log_totals(spark: Any, per_file: list[dict[str, Any]], changes_path: str,
                sf: Any) -> dict[str, dict[str, Any]]:
    """The per-log totals of the summary: the files' rows added up, and the change counts."""
    totals: dict[str, dict[str, Any]] = {}
    for r in per_file:
        log = totals.setdefault(r["log"], dict.fromkeys(
            ("files", "partial_files", "file_bytes", "lines", "line_bytes", "transactions",
             *(op + "s" for op in CHANGE_OPS), "change_bytes"), 0)
            | {"first_time": None, "last_time": None})
        log["files"] += 1
        log["partial_files"] += bool(r["partial"])
        for key in ("file_bytes", "lines", "line_bytes", "transactions"):
            log[key] += r[key]
        for key, pick in (("first_time", min), ("last_time", max)):
            if r[key] is not None:
                log[key] = r[key] if log[key] is None else pick(log[key], r[key])
    for r in spark.read.parquet(changes_path).groupBy("log").agg(
            *(sf.sum(op + "s").alias(op + "s") for op in CHANGE_OPS),
            sf.sum("change_bytes").alias("change_bytes")).collect():
        totals[r["log"]].update({k: int(v or 0) for k, v in r.asDict().items() if k != "log"})
    return totals


def summary_lines(result: ChangesResult) -> list[str]:
    """What ``analyze --changes`` prints: a line per log, then where the tables and report are."""
    from receivewal.check.sizes import human_bytes

    lines = []
    for root, log in result.logs.items():
        lines.append(f"{root}: {log['files']} files, {log['transactions']:,} transactions, "
                     f"{log['inserts']:,} inserts, {log['updates']:,} updates, "
                     f"{log['deletes']:,} deletes, {log['truncates']:,} truncates, "
                     f"{human_bytes(log['change_bytes'])} of changes")
    lines.append(f"tables: {', '.join(result.tables.values())}")
    lines += [f"report: {path}" for path in result.report_files if path.suffix != ".png"]
    lines.append(f"{sum(log['files'] for log in result.logs.values())} files in "
                 f"{result.seconds:.1f} s")
    return lines


def resolved(inputs: Iterable[str]) -> list[str]:
    """Local paths made absolute (a Connect server resolves a relative one elsewhere)."""
    return [i if is_uri(i) else str(Path(i).resolve()) for i in inputs]
