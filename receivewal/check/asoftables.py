"""Where ``analyze --changes --as-of`` writes its tables: Parquet, one folder per table, in a
directory (Spark's writer) or under an ``s3://`` prefix (each executor uploads its part
create-only through the bucket's driver: Spark's own writer would need Hadoop's S3
connector, which the spark extra does not bring)."""

# ruff: noqa: PLC0415 - pyspark and pyarrow are the optional spark extra: lazy
from __future__ import annotations

from typing import Any

from receivewal.archive.location import is_bucket_url
from receivewal.archive.view import locate
from receivewal.errors import ConfigurationError


def check_new(out: str, names: list[str]) -> None:
    """Into a bucket, refuse a table's prefix that holds objects (they are written once)."""
    if not is_bucket_url(out):
        return
    location = locate(out)
    for name in names:
        if location.listing(name):
            raise ConfigurationError(f"{location.where(name)} holds objects already: "
                                     "--tables writes a bucket's objects only once "
                                     "(create-only); give a new prefix")


def write_table(spark: Any, frame: Any, path: str) -> int:
    """Write one table's rows as Parquet to ``path``, a directory (Spark's writer, what was
    there replaced) or a bucket's prefix (each executor uploads its part create-only through
    the bucket's driver: Spark itself would need Hadoop's S3 connector); its row count."""
    if not is_bucket_url(path):
        frame.write.mode("overwrite").parquet(path)
        return int(spark.read.parquet(path).count())
    names = list(frame.columns)
    parts = frame.mapInArrow(lambda batches: put_parts(path, names, batches),
                             "part string, rows long").collect()
    return sum(int(part["rows"]) for part in parts)


def put_parts(prefix: str, names: list[str], batches: Any) -> Any:
    """Executor side: one partition's rows as ``part-NNNNN.parquet`` under ``prefix`` (the
    first partition's even when empty, so that an empty table has its columns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark import TaskContext

    context = TaskContext.get()
    index = context.partitionId() if context is not None else 0
    schema = pa.schema([(name, pa.string()) for name in names])
    sink = pa.BufferOutputStream()
    rows = 0
    with pq.ParquetWriter(sink, schema) as writer:
        for batch in batches:
            rows += batch.num_rows
            writer.write_batch(batch)
    if rows or index == 0:
        name = f"part-{index:05d}.parquet"
        locate(prefix).put_new(name, sink.getvalue().to_pybytes())
        yield pa.RecordBatch.from_pydict({"part": [name], "rows": [rows]})
