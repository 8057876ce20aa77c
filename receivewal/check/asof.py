"""``analyze --changes DIR --as-of TIME|LSN --tables OUT``: a change log's tables as they were
at a point, built on Spark (issue 37, section 3).

The single-machine path, ``receivewal apply``, is the reference for the semantics; this is its
distributed twin, written as DataFrame operations so that nothing but a few rows per table is
collected to the driver. The executors read the snapshot's files and the log's files as
``analyze --changes`` reads change files (:func:`receivewal.check.changes.read_files`). Then:

- each line of a change file is tagged with the ``begin`` (``begin_prepare``) before it in its
  file (a window per file: a transaction never spans two files); a transaction is committed by
  its ``commit`` line, a prepared one by the ``commit_prepared`` with its gid and xid that
  follows its ``prepare`` (never by a ``rollback_prepared``); it is in when its commit LSN (or
  commit time) is at or before the point;
- its changes are ordered by (commit LSN, position in the file): commit order, then the
  change's place in its transaction, never by the per-change LSN alone; the snapshot's rows
  come before all of them; a ``truncate`` drops every row of its tables ordered before it;
- a table whose relation line marks some columns as the replica identity's key is resolved
  per key (a window per key): after the key's last delete, each column takes the value of the
  last change that sent it (an unchanged TOAST column keeps the value before); a table
  without a key, or whose every column is the identity (REPLICA IDENTITY FULL), is a multiset
  of whole rows: inserts counted up, deletes (the whole old row) counted down;
- each table is written as Parquet to ``OUT/<schema>.<table>/``, every value the log's text,
  the columns as the last relation line at or before the point names them.

Refused (:class:`~receivewal.errors.ConfigurationError` or
:class:`~receivewal.errors.ArchiveError`, one line): a point before the snapshot's consistent
point (a time before the snapshot was taken), a ``gap`` line before the point, a COMMIT
PREPARED whose PREPARE the log does not hold, an update that changed a key and left a TOAST
column unchanged (its value is the old key's row's), a log without a snapshot unless asked
(``without_snapshot``: the tables then lack every row from before the slot).
"""

# ruff: noqa: PLC0415 - pyspark is the optional spark extra: lazy
from __future__ import annotations

import datetime
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from receivewal.archive.location import is_bucket_url, is_uri
from receivewal.archive.view import locate
from receivewal.check.analyze import opener_for, parallelism
from receivewal.check.asoftables import check_new, write_table
from receivewal.check.changes import LINES_SCHEMA, TASK_SCHEMA, TIME_FORMAT, plan_log, read_files
from receivewal.errors import ArchiveError, ConfigurationError
from receivewal.logical.snapshot import (
    MANIFEST,
    SNAPSHOT_DIRECTORY,
    SNAPSHOT_MANIFEST_CAP,
    SnapshotManifest,
    parse_snapshot_manifest,
)
from receivewal.wal.lsn import LSN_PATTERN, format_lsn, join_lsn, parse_lsn

_CHANGES = ("insert", "update", "delete")
_OPENS = ("begin", "begin_prepare")


@dataclass(frozen=True)
class AsOf:
    """The point the tables are built at: a commit LSN, or a commit time (aware)."""

    lsn: int | None = None
    time: datetime.datetime | None = None

    def __str__(self) -> str:
        if self.lsn is not None:
            return format_lsn(self.lsn)
        assert self.time is not None
        return _utc(self.time)


def parse_as_of(text: str) -> AsOf:
    """``--as-of``'s value: an LSN (``X/X``) or an ISO 8601 time with its zone;
    ConfigurationError otherwise."""
    if re.match(LSN_PATTERN, text.strip()):
        return AsOf(lsn=parse_lsn(text))
    try:
        when = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigurationError(
            f"--as-of {text!r} is neither an LSN (X/X, e.g. 0/3000000) nor a time "
            "(ISO 8601 with its zone, e.g. 2026-11-29T15:00:00+00:00)") from None
    if when.tzinfo is None:
        raise ConfigurationError(f"--as-of {text!r} has no time zone: give one "
                                 "(2026-11-29T15:00:00Z, +01:00...)")
    return AsOf(time=when.astimezone(datetime.UTC))


def _utc(when: datetime.datetime) -> str:
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _micros(when: datetime.datetime) -> int:
    delta = when - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


@dataclass
class AsOfResult:
    """What was built: per table (``schema.table``) its folder and rows, and the last
    transaction in."""

    root: str
    as_of: AsOf
    tables: dict[str, tuple[str, int]]
    last_commit: tuple[int, str] | None
    seconds: float


# -- the driver's inputs -----------------------------------------------------------------------
def read_root_manifest(root: str) -> SnapshotManifest | None:
    """The complete snapshot of the change log at ``root`` (a directory, ``s3://`` or another
    URI), None when it has none."""
    name = f"{SNAPSHOT_DIRECTORY}/{MANIFEST}"
    if is_bucket_url(root) or not is_uri(root):
        location = locate(root)
        if not location.exists(name):
            return None
        return parse_snapshot_manifest(location.read_small(name, SNAPSHOT_MANIFEST_CAP),
                                       location.where(name))
    opener = opener_for(root)
    assert opener is not None
    path = root.rstrip("/") + "/" + name
    try:
        with opener(path) as fh:
            data = fh.read(SNAPSHOT_MANIFEST_CAP)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ArchiveError(f"snapshot manifest {path}: {exc}") from exc
    return parse_snapshot_manifest(data, path)


def check_point(root: str, manifest: SnapshotManifest | None, as_of: AsOf, *,
                without_snapshot: bool) -> None:
    """Refuse a point the snapshot cannot start: before its consistent point, or a log
    without a snapshot (unless ``without_snapshot``)."""
    if manifest is None:
        if without_snapshot:
            return
        raise ConfigurationError(
            f"{root} has no snapshot (receivewal logical --create-slot --snapshot takes one): "
            "the tables would lack every row from before the slot was created; "
            "--without-snapshot builds them from the changes alone")
    if as_of.lsn is not None and as_of.lsn < manifest.consistent_point:
        raise ConfigurationError(
            f"--as-of {as_of} is before the snapshot's consistent point "
            f"{format_lsn(manifest.consistent_point)}: the log cannot build the tables there")
    if as_of.time is not None and manifest.taken_at:
        taken = datetime.datetime.fromisoformat(manifest.taken_at)
        if as_of.time < taken:
            raise ConfigurationError(
                f"--as-of {as_of} is before the snapshot was taken ({_utc(taken)}), so "
                "possibly before its consistent point: give a later time, or an LSN at or "
                f"after {format_lsn(manifest.consistent_point)}")


def _line_schema() -> Any:
    """The fields of a line this job reads (rows as maps of column name to text)."""
    from pyspark.sql import types as st

    text = st.StringType()
    values = st.MapType(text, text, valueContainsNull=True)
    column = st.StructType([st.StructField("name", text), st.StructField("key", st.BooleanType())])
    return st.StructType([
        st.StructField("op", text), st.StructField("lsn", text),
        st.StructField("xid", st.LongType()), st.StructField("gid", text),
        st.StructField("schema", text), st.StructField("table", text),
        st.StructField("tables", st.ArrayType(st.ArrayType(text))),
        st.StructField("commit_lsn", text), st.StructField("commit_time", text),
        st.StructField("from_lsn", text),
        st.StructField("new", values), st.StructField("old", values),
        st.StructField("unchanged_toast", st.ArrayType(text)),
        st.StructField("columns", st.ArrayType(column)), st.StructField("rows", st.LongType())])


def _lines(spark: Any, rows: list[tuple[Any, ...]]) -> Any:
    """The files' lines on the executors, parsed: file, n, the line's fields; an unreadable
    file or a line that is no record is an ArchiveError naming it."""
    from pyspark.sql import functions as sf

    tasks = spark.createDataFrame(rows, TASK_SCHEMA).repartition(
        max(1, min(len(rows), parallelism(spark) * 4)))
    lines = tasks.mapInArrow(read_files, LINES_SCHEMA).select(
        "log", "file", "n", "error", sf.from_json("line", _line_schema()).alias("j")).select(
        "log", "file", "n", "error", "j.*").persist()
    bad = lines.where(sf.col("error").isNotNull() | sf.col("op").isNull()).orderBy(
        "file", "n").limit(1).collect()
    if bad:
        lines.unpersist()
        row = bad[0]
        if row["error"] is not None:
            raise ArchiveError(row["error"])
        raise ArchiveError(f"{row['log'].rstrip('/')}/{row['file']}: line {row['n'] + 1} is "
                           "not a change log record")
    return lines


def _lsn_number(column: Any) -> Any:
    from pyspark.sql import functions as sf

    halves = sf.split(column, "/")
    return (sf.conv(halves[0], 16, 10).cast("long") * sf.lit(join_lsn(1, 0))
            + sf.conv(halves[1], 16, 10).cast("long"))


def _time_micros(column: Any) -> Any:
    from pyspark.sql import functions as sf

    return sf.unix_micros(sf.to_timestamp(column, TIME_FORMAT))


# -- the job -----------------------------------------------------------------------------------
def run_as_of(spark: Any, root: str, out: str, as_of: AsOf, *, identity: str | None = None,
              without_snapshot: bool = False) -> AsOfResult:
    """Build the tables of the change log at ``root`` as of ``as_of`` into ``out``."""
    from pyspark.sql import functions as sf

    began = time.perf_counter()
    manifest = read_root_manifest(root)
    check_point(root, manifest, as_of, without_snapshot=without_snapshot)
    log = _lines(spark, plan_log(spark, root, identity))
    snapshot = None
    held = [log]  # persisted, unpersisted at the end
    try:
        if manifest is not None:
            snapshot = _snapshot_lines(spark, root, manifest, identity)
            held.append(snapshot)
        included, changes = _transactions(log, as_of)
        held.append(included)
        _check_gaps(log, included, as_of)
        point = changes.agg(sf.max(sf.struct("file", "n")).alias("p")).first()["p"]
        relations = _relations(spark, log, snapshot, manifest, point)
        check_new(out, [f"{schema}.{table}" for schema, table in relations])
        events = _events(spark, changes, snapshot, manifest).persist()
        try:
            tables = {}
            for (schema, table), columns in sorted(relations.items()):
                path = out.rstrip("/") + f"/{schema}.{table}"
                rows = events.where((sf.col("schema") == schema) & (sf.col("table") == table))
                tables[f"{schema}.{table}"] = (path, write_table(
                    spark, _resolve(rows, f"{schema}.{table}", columns), path))
        finally:
            events.unpersist()
        last = included.agg(sf.max(sf.struct("commit", "at")).alias("c")).first()["c"]
    finally:
        for frame in held:
            if frame is not None:
                frame.unpersist()
    last_commit = None if last is None else (
        int(last["commit"]), _utc(datetime.datetime.fromtimestamp(last["at"] / 1e6,
                                                                  datetime.UTC)))
    return AsOfResult(root, as_of, tables, last_commit, time.perf_counter() - began)


def _snapshot_lines(spark: Any, root: str, manifest: SnapshotManifest,
                    identity: str | None) -> Any:
    """The snapshot's lines, each table's file checked against its end line and the
    manifest's count (a file cut short is refused, never read as a smaller table)."""
    from pyspark.sql import functions as sf

    base = root.rstrip("/") + "/" + SNAPSHOT_DIRECTORY
    rows = [(root, base, entry.file, "zstd" if ".jsonl.zst" in entry.file else "", False, 0,
             identity) for entry in manifest.tables]
    if not rows:
        return None
    lines = _lines(spark, rows)
    op = sf.col("op")
    counted = {r["file"]: (r["rows"], r["ended"]) for r in lines.groupBy("file").agg(
        sf.count(sf.when(op == "row", 1)).alias("rows"),
        sf.max(sf.when(op == "end", sf.col("rows"))).alias("ended")).collect()}
    for entry in manifest.tables:
        held, ended = counted.get(entry.file, (0, None))
        where = f"snapshot file {base}/{entry.file}"
        if ended is None:
            raise ArchiveError(f"{where} is cut short (no end line)")
        if ended != held or held != entry.rows:
            raise ArchiveError(f"{where} holds {held} rows, its end line says {ended} and "
                               f"its manifest {entry.rows}")
    return lines


def _transactions(log: Any, as_of: AsOf) -> tuple[Any, Any]:
    """The transactions in (file, tx_n: where their begin is; commit: their commit LSN as a
    number; at: their commit time in microseconds), and their changes (truncates too) with
    their order (commit, n)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as sf

    op = sf.col("op")
    upto = Window.partitionBy("file").orderBy("n").rowsBetween(Window.unboundedPreceding,
                                                               Window.currentRow)
    tagged = log.withColumn("tx_n", sf.last(sf.when(op.isin(*_OPENS), sf.col("n")),
                                            ignorenulls=True).over(upto))
    commits = tagged.where(op == "commit").select(
        "file", "tx_n", _lsn_number("commit_lsn").alias("commit"),
        _time_micros("commit_time").alias("at"))
    prepares = tagged.where(op == "prepare").select("file", "tx_n", "gid", "xid",
                                                    sf.col("n").alias("pn"))
    decided = tagged.where(op == "commit_prepared").select(
        "gid", "xid", sf.col("file").alias("cfile"), sf.col("n").alias("cn"), "commit_lsn",
        _lsn_number("commit_lsn").alias("commit"), _time_micros("commit_time").alias("at"))
    after = (sf.col("cfile") > sf.col("file")) | (
        (sf.col("cfile") == sf.col("file")) & (sf.col("cn") > sf.col("pn")))
    paired = prepares.join(decided, ["gid", "xid"]).where(after).groupBy("file", "tx_n").agg(
        sf.min(sf.struct("commit", "at")).alias("c")).select("file", "tx_n", "c.commit", "c.at")
    point = (sf.col("commit") <= as_of.lsn) if as_of.lsn is not None else (
        sf.col("at") <= _micros(as_of.time) if as_of.time is not None else sf.lit(True))
    orphan = decided.where(point).join(prepares, ["gid", "xid"], "left_anti").orderBy(
        "commit").limit(1).collect()
    if orphan:
        raise ArchiveError(f"COMMIT PREPARED of {orphan[0]['gid']!r} at "
                           f"{orphan[0]['commit_lsn']}, but the log does not hold its PREPARE "
                           "(removed, or before the log began): its rows cannot be built")
    included = commits.unionByName(paired).where(point).persist()
    changes = tagged.where(op.isin(*_CHANGES, "truncate")).join(included, ["file", "tx_n"])
    return included, changes


def _check_gaps(log: Any, included: Any, as_of: AsOf) -> None:
    """Refuse a ``gap`` line before the point: the log misses transactions there."""
    from pyspark.sql import functions as sf

    for gap in log.where(sf.col("op") == "gap").select("file", "n", "lsn", "from_lsn").collect():
        if as_of.lsn is not None:
            missed = as_of.lsn >= parse_lsn(gap["from_lsn"])
        else:
            before = included.where(
                (sf.col("file") < gap["file"]) |
                ((sf.col("file") == gap["file"]) & (sf.col("tx_n") < gap["n"])))
            latest = before.agg(sf.max("at")).first()[0]
            missed = as_of.time is None or latest is None or _micros(as_of.time) >= latest
        if missed:
            raise ArchiveError(
                f"the change log misses the transactions committed between {gap['from_lsn']} "
                f"and {gap['lsn']} (a gap line), before --as-of {as_of}: the tables there "
                "cannot be built")


def _relations(spark: Any, log: Any, snapshot: Any, manifest: SnapshotManifest | None,
               point: Any) -> dict[tuple[str, str], list[tuple[str, bool]]]:
    """Per table, its columns (name, key) as the last relation line at or before the point
    names them (the snapshot's first); a table the log describes only after it is left out."""
    from pyspark.sql import functions as sf

    op = sf.col("op")
    described = log.where(op == "relation")
    if point is not None:
        described = described.where((sf.col("file") < point["file"]) | (
            (sf.col("file") == point["file"]) & (sf.col("n") <= point["n"])))
    else:
        described = described.limit(0)
    parts = [described.select("schema", "table", "columns", sf.lit(1).alias("part"), "file",
                              "n")]
    if snapshot is not None and manifest is not None:
        parts.append(snapshot.where(op == "relation").select(
            "schema", "table", "columns", sf.lit(0).alias("part"), "file", "n"))
    every = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    chosen = every.groupBy("schema", "table").agg(
        sf.max_by("columns", sf.struct("part", "file", "n")).alias("columns")).collect()
    return {(r["schema"], r["table"]): [(c["name"], bool(c["key"])) for c in r["columns"]]
            for r in chosen}


def _events(spark: Any, changes: Any, snapshot: Any, manifest: SnapshotManifest | None) -> Any:
    """Every row change in order (op, schema, table, new, old, unchanged_toast, commit, n; the
    snapshot's rows as inserts before all), without those a later truncate undid."""
    from pyspark.sql import functions as sf

    fields = ("op", "schema", "table", "new", "old", "unchanged_toast", "commit", "n")
    rows = changes.where(sf.col("op") != "truncate").select(*fields)
    if snapshot is not None and manifest is not None:
        named = spark.createDataFrame([(t.file, t.schema, t.table) for t in manifest.tables],
                                      "file string, schema string, table string")
        rows = snapshot.where(sf.col("op") == "row").select("file", "n", "new").join(
            named, "file").select(
            sf.lit("insert").alias("op"), "schema", "table", "new",
            sf.lit(None).cast("map<string,string>").alias("old"),
            sf.lit(None).cast("array<string>").alias("unchanged_toast"),
            sf.lit(-1).cast("long").alias("commit"), "n").unionByName(rows)
    cuts = changes.where(sf.col("op") == "truncate").select(
        sf.explode("tables").alias("t"), "commit", "n").select(
        sf.col("t")[0].alias("schema"), sf.col("t")[1].alias("table"),
        sf.struct("commit", "n").alias("o")).groupBy("schema", "table").agg(
        sf.max("o").alias("cut"))
    return rows.join(cuts, ["schema", "table"], "left").where(
        sf.col("cut").isNull() | (sf.struct("commit", "n") > sf.col("cut"))).drop("cut")


def _resolve(events: Any, name: str, columns: list[tuple[str, bool]]) -> Any:
    """One table's rows at the point, its columns in order, every value text."""
    names = [column for column, _ in columns]
    keys = [column for column, key in columns if key]
    if keys and len(keys) < len(names):
        return _by_key(events, name, names, keys)
    return _as_multiset(events, names)


def _by_key(events: Any, name: str, names: list[str], keys: list[str]) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as sf

    op, new, old = sf.col("op"), sf.col("new"), sf.col("old")
    new_key = sf.array(*(new[k] for k in keys))
    old_key = sf.when(old.isNotNull(), sf.array(*(old[k] for k in keys))).otherwise(new_key)
    toast = sf.coalesce(sf.col("unchanged_toast"), sf.array().cast("array<string>"))
    moved = (op == "update") & ~old_key.eqNullSafe(new_key)
    carried = events.where(moved & (sf.size(toast) > 0)).select("commit").limit(1).collect()
    if carried:
        raise ArchiveError(
            f"table {name}: an update committed at {format_lsn(carried[0]['commit'])} changed "
            "the key and left a TOAST column unchanged; its value is the old key's row's, "
            "which --as-of does not carry from one key to another")
    put = sf.struct(sf.lit(True).alias("put"), new_key.alias("key"))
    drop = sf.struct(sf.lit(False).alias("put"), old_key.alias("key"))
    keyed = events.select(
        sf.explode(sf.when(op == "delete", sf.array(drop))
                   .when(moved, sf.array(drop, put)).otherwise(sf.array(put))).alias("e"),
        "new", toast.alias("toast"), "commit", "n").select("e.put", "e.key", "new", "toast",
                                                           "commit", "n")
    order = sf.struct("commit", "n")
    latest_drop = sf.max(sf.when(~sf.col("put"), order)).over(Window.partitionBy("key"))
    alive = keyed.withColumn("dropped", latest_drop).where(
        sf.col("put") & (sf.col("dropped").isNull() | (order > sf.col("dropped"))))
    values = [sf.max(sf.when(~sf.array_contains("toast", column), sf.struct(
        "commit", "n", new[column].alias("v")))).alias(f"_{i}")
        for i, column in enumerate(names)]
    return alive.groupBy("key").agg(*values).select(
        *(sf.col(f"_{i}.v").alias(column) for i, column in enumerate(names)))


def _as_multiset(events: Any, names: list[str]) -> Any:
    from pyspark.sql import functions as sf

    op, new, old = sf.col("op"), sf.col("new"), sf.col("old")
    toast = sf.coalesce(sf.col("unchanged_toast"), sf.array().cast("array<string>"))
    was = sf.array(*(old[c] for c in names))
    now = sf.array(*(sf.when(sf.array_contains(toast, c), old[c]).otherwise(new[c])
                     for c in names))
    gone = sf.struct(sf.lit(-1).alias("sign"), was.alias("row"))
    came = sf.struct(sf.lit(1).alias("sign"), now.alias("row"))
    signed = events.select(sf.explode(
        sf.when(op == "delete", sf.array(gone))
        .when((op == "update") & old.isNotNull(), sf.array(gone, came))
        .otherwise(sf.array(came))).alias("e")).select("e.sign", "e.row")
    net = signed.groupBy("row").agg(sf.sum("sign").alias("net")).where(sf.col("net") > 0)
    return net.select(sf.explode(sf.array_repeat("row", sf.col("net").cast("int"))).alias(
        "row")).select(*(sf.col("row")[i].alias(column) for i, column in enumerate(names)))


def summary_lines(result: AsOfResult) -> list[str]:
    """What ``analyze --changes --as-of`` prints: the point, the last transaction in, a line
    per table."""
    if result.last_commit is None:
        through = "no transaction of the log is in (the snapshot's rows)"
    else:
        through = (f"through the transaction committed at {format_lsn(result.last_commit[0])} "
                   f"({result.last_commit[1]})")
    lines = [f"{result.root}: as of {result.as_of}, {through}"]
    lines += [f"{name}: {rows:,} rows in {path}"
              for name, (path, rows) in sorted(result.tables.items())]
    lines.append(f"{len(result.tables)} tables in {result.seconds:.1f} s")
    return lines


def resolved_output(out: str) -> str:
    """``--tables``'s value: a local path made absolute (a URI as given)."""
    return out if is_uri(out) else str(Path(out).resolve())
