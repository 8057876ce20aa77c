"""The ``analyze`` report: a summary first, then tables and charts, as Markdown and HTML pages.

Aggregation runs on Spark (group-bys over the tables the job wrote); only the small results are
collected and drawn with matplotlib's Agg backend. Sizes are printed as pg_size_pretty does
(1 MB = 1024 kB) with one decimal; counts with thousands separators; times in UTC.
Imported only by ``analyze``.
"""

# ruff: noqa: PLC0415 - pyspark, pyarrow and matplotlib are the optional spark extra: lazy
from __future__ import annotations

import datetime
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from receivewal.check import charts
from receivewal.check.crosscheck import ArchiveReport
from receivewal.check.sizes import human_bytes
from receivewal.check.walclock import HOUR, WalClock
from receivewal.wal.lsn import format_lsn

MAX_PROBLEMS_LISTED = 50
MAX_HOURS_LISTED = 72

Table = list[list[str]]


def utc(seconds: float) -> str:
    """A Unix time as ``2026-11-23 01:02:03 UTC``."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime(
        "%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float) -> str:
    """``2 d 3 h``, ``1 h 5 min``, ``4 min 2 s`` or ``12 s``."""
    s = round(seconds)
    days, hours, minutes = s // 86400, s % 86400 // 3600, s % 3600 // 60
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {s % 60} s" if minutes else f"{s} s"


def short_name(archive: str) -> str:
    """The last path element of an archive, as charts label it."""
    return archive.rstrip("/").rsplit("/", 1)[-1] or archive


def write_report(spark: Any, tables: Mapping[str, str], reports: Mapping[str, ArchiveReport],
                 clocks: Mapping[str, WalClock], out: Path) -> list[Path]:
    """Write the charts, ``report.md`` and ``report.html``; return their paths."""
    from pyspark.sql import functions as sf

    out.mkdir(parents=True, exist_ok=True)
    rmgr_rows = spark.read.parquet(tables["segment_rmgr"]).groupBy("archive", "rmgr").agg(
        sf.sum("records").alias("records"), sf.sum("record_bytes").alias("record_bytes"),
        sf.sum("fpi_bytes").alias("fpi_bytes")).collect()
    segments = spark.read.parquet(tables["segments"])
    size_rows = segments.groupBy("archive").agg(
        sf.sum("data_bytes").alias("data_bytes"), sf.sum("file_bytes").alias("file_bytes"),
        sf.sum("zstd_bytes").alias("zstd_bytes"), sf.sum("lz4_bytes").alias("lz4_bytes"),
        sf.sum("record_bytes").alias("record_bytes"),
        sf.sum("fpi_bytes").alias("fpi_bytes")).collect()
    placement = [r.asDict() for r in
                 segments.select("archive", "timeline", "segno", "partial").collect()]
    rmgr: dict[str, dict[str, tuple[int, int, int]]] = defaultdict(dict)
    for r in rmgr_rows:
        rmgr[r["archive"]][r["rmgr"]] = (r["records"], r["record_bytes"], r["fpi_bytes"])
    sizes = {r["archive"]: r.asDict() for r in size_rows}
    archives = sorted(reports)
    drawn = [
        charts.wal_over_time(out / "wal_over_time.png", archives, clocks),
        charts.wal_by_rmgr(out / "wal_by_rmgr.png", archives, rmgr),
        charts.segment_map(out / "segments.png", archives, placement, reports),
        charts.archives_compared(out / "archives_compared.png", archives, sizes)
        if len(archives) > 1 else None,
    ]
    pngs = [p for p in drawn if p is not None]
    sections = report_sections(archives, reports, clocks, rmgr, sizes)
    (out / "report.md").write_text(markdown(sections, pngs))
    (out / "report.html").write_text(html_page(sections, pngs))
    return [*pngs, out / "report.md", out / "report.html"]


def report_sections(archives: list[str], reports: Mapping[str, ArchiveReport],
                    clocks: Mapping[str, WalClock],
                    rmgr: Mapping[str, Mapping[str, tuple[int, int, int]]],
                    sizes: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, list[str], Table]]:
    """(title, paragraphs, table) of each section, summary first; a table may be empty."""
    return [
        ("Summary", summary_paragraphs(archives, reports, clocks), []),
        ("Archives", [], archive_table(archives, reports, clocks, sizes)),
        ("WAL over time", ["WAL bytes per hour (UTC), from the timestamps of commit, abort "
                           "and checkpoint records; the full table is `wal_per_hour`."],
         hourly_table(archives, clocks)),
        *((f"Resource managers: {short_name(a)}", [], rmgr_table(rmgr.get(a, {})))
          for a in archives),
        problems_section(archives, reports),
    ]


def summary_paragraphs(archives: list[str], reports: Mapping[str, ArchiveReport],
                       clocks: Mapping[str, WalClock]) -> list[str]:
    """The summary a DBA reads first: archives, time span, WAL volume, recoverable, problems."""
    spans = [c.span for c in clocks.values() if c.span]
    problems = [p for a in archives for p in reports[a].problems]
    errors = sum(p.severity == "error" for p in problems)
    broken = [short_name(a) for a in archives if not reports[a].recoverable]
    return [
        f"- **Archives:** {len(archives):,}",
        "- **Time span:** " + (
            f"{utc(min(s[0] for s in spans))} to {utc(max(s[1] for s in spans))} "
            f"({duration(max(s[1] for s in spans) - min(s[0] for s in spans))})"
            if spans else "unknown (no commit or checkpoint record found)"),
        f"- **WAL volume:** {human_bytes(sum(c.wal_bytes for c in clocks.values()))} in "
        f"{sum(len(reports[a].scans) for a in archives):,} segment files",
        "- **Recoverable:** " + ("yes, every archive" if not broken else
                                 f"NO: {', '.join(broken)} "
                                 f"({len(archives) - len(broken):,} of {len(archives):,} yes)"),
        "- **Problems:** " + ("No problems found." if not problems else
                              f"{errors:,} error(s), {len(problems) - errors:,} warning(s)"),
    ]


def archive_table(archives: list[str], reports: Mapping[str, ArchiveReport],
                  clocks: Mapping[str, WalClock], sizes: Mapping[str, Mapping[str, Any]]
                  ) -> Table:
    """One row per archive: volume, time span, verdict, recovery range, ratios."""
    rows = [["archive", "segments", "WAL", "first record", "last record", "recoverable",
             "recovery range", "errors", "warnings", "FPI share", "zstd-1", "lz4"]]
    for a in archives:
        rep, size, clock, rec = reports[a], sizes.get(a, {}), clocks[a], reports[a].recovery
        errors = sum(p.severity == "error" for p in rep.problems)
        rows.append([
            a, f"{len(rep.scans):,}", human_bytes(clock.wal_bytes),
            utc(clock.span[0]) if clock.span else "-", utc(clock.span[1]) if clock.span else "-",
            "yes" if rep.recoverable else "NO",
            f"TL{rec.timeline} {format_lsn(rec.start_lsn)} - {format_lsn(rec.end_lsn)}"
            if rec else "-",
            f"{errors:,}", f"{len(rep.problems) - errors:,}",
            percent(size.get("fpi_bytes"),
                    (size.get("fpi_bytes") or 0) + (size.get("record_bytes") or 0)),
            percent(size.get("zstd_bytes"), size.get("data_bytes")),
            percent(size.get("lz4_bytes"), size.get("data_bytes"))])
    return rows


def hourly_table(archives: list[str], clocks: Mapping[str, WalClock]) -> Table:
    """Hours as rows, archives as columns (the first MAX_HOURS_LISTED hours)."""
    hours = sorted({h for a in archives for h in clocks[a].hourly})
    rows = [["hour (UTC)", *(short_name(a) for a in archives)]]
    for h in hours[:MAX_HOURS_LISTED]:
        rows.append([utc(h)[:-7] + ":00 - " + utc(h + HOUR)[11:-7] + ":00",
                     *(human_bytes(clocks[a].hourly[h]) if h in clocks[a].hourly else "-"
                       for a in archives)])
    if len(hours) > MAX_HOURS_LISTED:
        rows.append([f"... {len(hours) - MAX_HOURS_LISTED:,} more hours in wal_per_hour",
                     *("" for _ in archives)])
    return rows


def rmgr_table(totals: Mapping[str, tuple[int, int, int]]) -> Table:
    """Resource managers by WAL bytes, largest first."""
    rows = [["resource manager", "records", "record bytes", "full-page images", "share"]]
    whole = sum(v[1] + v[2] for v in totals.values())
    for name, (records, rec_bytes, fpi) in sorted(totals.items(),
                                                  key=lambda kv: -(kv[1][1] + kv[1][2])):
        rows.append([name, f"{records:,}", human_bytes(rec_bytes), human_bytes(fpi),
                     percent(rec_bytes + fpi, whole)])
    return rows


def problems_section(archives: list[str], reports: Mapping[str, ArchiveReport]
                     ) -> tuple[str, list[str], Table]:
    """The problems, or a sentence saying there are none."""
    found = [(a, p) for a in archives for p in reports[a].problems]
    if not found:
        return ("Problems", ["No problems found."], [])
    rows = [["archive", "severity", "kind", "file", "LSN", "detail"]]
    rows += [[short_name(a), p.severity, p.kind, p.file, format_lsn(p.lsn), p.detail]
             for a, p in found[:MAX_PROBLEMS_LISTED]]
    more = [f"{len(found) - MAX_PROBLEMS_LISTED:,} more in the problems table."] \
        if len(found) > MAX_PROBLEMS_LISTED else []
    return ("Problems", [f"{len(found):,} problem(s):", *more], rows)


def percent(part: Any, whole: Any) -> str:
    """``12.3%``, or ``-`` when unknown."""
    return f"{float(part) / float(whole):.1%}" if part is not None and whole else "-"


def markdown(sections: list[tuple[str, list[str], Table]], pngs: list[Path],
             title: str = "WAL archive analysis") -> str:
    """The report as Markdown."""
    md = [f"# {title}", ""]
    for heading, paragraphs, rows in sections:
        md += [f"## {heading}", ""] + ([*paragraphs, ""] if paragraphs else [])
        if rows:
            md += ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
            md += ["| " + " | ".join(r) + " |" for r in rows[1:]] + [""]
    md += ["## Charts", ""] + [f"![{p.stem}]({p.name})" for p in pngs]
    return "\n".join(md) + "\n"


def html_page(sections: list[tuple[str, list[str], Table]], pngs: list[Path],
              title: str = "WAL archive analysis") -> str:
    """The report as one HTML page (the charts next to it)."""
    import html

    def inline(text: str) -> str:
        text = html.escape(text.removeprefix("- "))
        while "**" in text:
            text = text.replace("**", "<b>", 1).replace("**", "</b>", 1)
        while "`" in text:
            text = text.replace("`", "<code>", 1).replace("`", "</code>", 1)
        return text

    page = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            "</title><style>body{font-family:sans-serif}table{border-collapse:collapse}"
            "td,th{border:1px solid #999;padding:2px 6px}td{text-align:right}"
            "td:first-child{text-align:left}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>"]
    for heading, paragraphs, rows in sections:
        page.append(f"<h2>{html.escape(heading)}</h2>")
        page += [f"<p>{inline(p)}</p>" for p in paragraphs]
        if rows:
            page.append("<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
                        + "</tr>")
            page += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                     for r in rows[1:]]
            page.append("</table>")
    page += ["<h2>Charts</h2>"] + [f"<p><img src='{p.name}' alt='{p.stem}'></p>"
                                   for p in pngs] + ["</body></html>"]
    return "\n".join(page) + "\n"
