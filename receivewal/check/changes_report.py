"""The ``analyze --changes`` report: a summary, changes per hour and per table, and charts.

The aggregation runs on Spark over the ``changes_per_hour`` table; only its small results are
collected. Pages and number formats are the WAL report's (:mod:`receivewal.check.report`).
Imported only by ``analyze --changes``.
"""

# ruff: noqa: PLC0415 - pyspark and matplotlib are the optional spark extra: lazy
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from receivewal.check import changecharts
from receivewal.check.report import (
    MAX_HOURS_LISTED,
    Table,
    duration,
    html_page,
    markdown,
    short_name,
    utc,
)
from receivewal.check.sizes import human_bytes
from receivewal.check.walclock import HOUR

TITLE = "Change log analysis"
OPS = ("inserts", "updates", "deletes", "truncates")
MAX_TABLES_LISTED = 50


def write_changes_report(spark: Any, tables: Mapping[str, str],
                         logs: Mapping[str, Mapping[str, Any]], out: Path) -> list[Path]:
    """Write the charts, ``report.md`` and ``report.html``; return their paths."""
    from pyspark.sql import functions as sf

    out.mkdir(parents=True, exist_ok=True)
    per_hour = spark.read.parquet(tables["changes_per_hour"])
    sums = [*(sf.sum(op).alias(op) for op in OPS), sf.sum("change_bytes").alias("change_bytes")]
    hours = [r.asDict() for r in per_hour.groupBy("log", "hour_seconds").agg(*sums)
             .orderBy("hour_seconds", "log").collect()]
    by_table = [r.asDict() for r in per_hour.groupBy("log", "schema", "table").agg(*sums)
                .orderBy(sf.desc("change_bytes"), "log", "schema", "table").collect()]
    names = sorted(logs)
    pngs = [changecharts.changes_over_time(out / "changes_over_time.png", hours),
            changecharts.changes_by_table(out / "changes_by_table.png", names, by_table)]
    sections = [
        ("Summary", summary_paragraphs(logs), []),
        ("Change logs", [], log_table(names, logs)),
        ("Changes per hour", ["Changes per hour (UTC) of their transaction's commit (or "
                              "prepare), every table together; per table in the "
                              "`changes_per_hour` table."], hourly_table(hours)),
        ("Tables", ["Tables by change volume (the bytes of their change lines)."],
         table_table(by_table)),
    ]
    (out / "report.md").write_text(markdown(sections, pngs, TITLE))
    (out / "report.html").write_text(html_page(sections, pngs, TITLE))
    return [*pngs, out / "report.md", out / "report.html"]


def summary_paragraphs(logs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What a reader wants first: how many logs, the time span, the changes and their volume."""
    firsts = [v["first_time"] for v in logs.values() if v["first_time"] is not None]
    lasts = [v["last_time"] for v in logs.values() if v["last_time"] is not None]

    def total(key: str) -> int:
        return sum(int(v[key] or 0) for v in logs.values())

    return [
        f"- **Change logs:** {len(logs):,} ({total('files'):,} files, "
        f"{total('partial_files'):,} partial)",
        "- **Time span:** " + (f"{utc(min(firsts))} to {utc(max(lasts))} "
                               f"({duration(max(lasts) - min(firsts))})"
                               if firsts else "unknown (no transaction)"),
        f"- **Transactions:** {total('transactions'):,}",
        "- **Changes:** " + ", ".join(f"{total(op):,} {op}" for op in OPS),
        f"- **Volume:** {human_bytes(total('change_bytes'))} of change lines, "
        f"{human_bytes(total('line_bytes'))} of lines in all, "
        f"{human_bytes(total('file_bytes'))} on disk",
    ]


def log_table(names: list[str], logs: Mapping[str, Mapping[str, Any]]) -> Table:
    rows = [["change log", "files", "first transaction", "last transaction", "transactions",
             *OPS, "change volume", "on disk"]]
    for name in names:
        log = logs[name]
        rows.append([name, f"{log['files']:,}",
                     utc(log["first_time"]) if log["first_time"] is not None else "-",
                     utc(log["last_time"]) if log["last_time"] is not None else "-",
                     f"{int(log['transactions'] or 0):,}",
                     *(f"{log[op]:,}" for op in OPS), human_bytes(log["change_bytes"]),
                     human_bytes(int(log["file_bytes"] or 0))])
    return rows


def hourly_table(hours: list[dict[str, Any]]) -> Table:
    rows = [["hour (UTC)", "change log", *OPS, "change volume"]]
    listed = sorted({h["hour_seconds"] for h in hours})[:MAX_HOURS_LISTED]
    for h in hours:
        if h["hour_seconds"] in listed:
            start = h["hour_seconds"]
            rows.append([utc(start)[:-7] + ":00 - " + utc(start + HOUR)[11:-7] + ":00",
                         short_name(h["log"]), *(f"{int(h[op]):,}" for op in OPS),
                         human_bytes(int(h["change_bytes"]))])
    more = len({h["hour_seconds"] for h in hours}) - len(listed)
    if more > 0:
        rows.append([f"... {more:,} more hours in changes_per_hour", "", "", "", "", "", ""])
    return rows


def table_table(by_table: list[dict[str, Any]]) -> Table:
    rows = [["table", "change log", *OPS, "change volume"]]
    rows += [[f"{t['schema']}.{t['table']}", short_name(t["log"]),
              *(f"{int(t[op]):,}" for op in OPS), human_bytes(int(t["change_bytes"]))]
             for t in by_table[:MAX_TABLES_LISTED]]
    if len(by_table) > MAX_TABLES_LISTED:
        rows.append([f"... {len(by_table) - MAX_TABLES_LISTED:,} more in changes_per_hour",
                     "", "", "", "", "", ""])
    return rows
