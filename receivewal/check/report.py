"""The ``analyze`` report: charts (PNG) and a Markdown and an HTML page over the Parquet tables.

Aggregation runs on Spark (group-bys over the tables the job wrote); only the small results are
collected and drawn with matplotlib's Agg backend. Imported only by ``analyze``.
"""

# ruff: noqa: PLC0415 - pyspark, pyarrow and matplotlib are the optional spark extra: lazy
from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from receivewal.check.crosscheck import ArchiveReport
from receivewal.wal.lsn import format_lsn

MAX_PROBLEMS_LISTED = 50


def _short(archive: str) -> str:
    return archive.rstrip("/").rsplit("/", 1)[-1] or archive


def write_report(spark: Any, tables: Mapping[str, str], reports: Mapping[str, ArchiveReport],
                 out: Path) -> list[Path]:
    """Write the charts, ``report.md`` and ``report.html``; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    from pyspark.sql import functions as sf

    out.mkdir(parents=True, exist_ok=True)
    segments = spark.read.parquet(tables["segments"])
    rmgr_rows = spark.read.parquet(tables["segment_rmgr"]).groupBy("archive", "rmgr").agg(
        sf.sum("records").alias("records"), sf.sum("record_bytes").alias("record_bytes"),
        sf.sum("fpi_bytes").alias("fpi_bytes")).collect()
    size_rows = segments.groupBy("archive").agg(
        sf.count("*").alias("segments"), sf.sum("data_bytes").alias("data_bytes"),
        sf.sum("zstd_bytes").alias("zstd_bytes"), sf.sum("lz4_bytes").alias("lz4_bytes"),
        sf.sum("record_bytes").alias("record_bytes"),
        sf.sum("fpi_bytes").alias("fpi_bytes")).collect()
    placement = segments.select("archive", "timeline", "segno", "partial").collect()

    rmgr: dict[str, dict[str, tuple[int, int, int]]] = defaultdict(dict)
    for r in rmgr_rows:
        rmgr[r["archive"]][r["rmgr"]] = (r["records"], r["record_bytes"], r["fpi_bytes"])
    sizes = {r["archive"]: r.asDict() for r in size_rows}
    archives = sorted(reports)
    charts = [
        _chart_volume(out / "wal_volume_per_rmgr.png", archives, rmgr),
        _chart_fpi_share(out / "fpi_share.png", archives, sizes),
        _chart_compressibility(out / "compressibility.png", archives, sizes),
        _chart_gaps(out / "timeline_gaps.png", archives, placement, reports),
    ]
    md, page = _pages(archives, reports, rmgr, sizes, charts)
    (out / "report.md").write_text(md)
    (out / "report.html").write_text(page)
    return [*charts, out / "report.md", out / "report.html"]


def _figure(rows: int = 1, height: float = 4.0) -> tuple[Any, Any]:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, 1, figsize=(9, height * rows), squeeze=False)
    return fig, axes[:, 0]


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _chart_volume(path: Path, archives: list[str],
                  rmgr: Mapping[str, Mapping[str, tuple[int, int, int]]]) -> Path:
    fig, axes = _figure(len(archives), 3.2)
    for ax, archive in zip(axes, archives, strict=True):
        items = sorted(rmgr.get(archive, {}).items(), key=lambda kv: -(kv[1][1] + kv[1][2]))
        names = [k for k, _ in items]
        ax.barh(names, [v[1] / 1e6 for _, v in items], label="record bytes")
        ax.barh(names, [v[2] / 1e6 for _, v in items], left=[v[1] / 1e6 for _, v in items],
                label="full-page images")
        ax.invert_yaxis()
        ax.set_xlabel("MB of WAL")
        ax.set_title(f"WAL volume per resource manager: {_short(archive)}")
        ax.legend(loc="lower right")
    return _save(fig, path)


def _chart_fpi_share(path: Path, archives: list[str], sizes: Mapping[str, Any]) -> Path:
    fig, (ax,) = _figure()
    shares = [_ratio(sizes[a]["fpi_bytes"], (sizes[a]["fpi_bytes"] or 0)
                     + (sizes[a]["record_bytes"] or 0)) * 100 if a in sizes else 0
              for a in archives]
    ax.bar([_short(a) for a in archives], shares)
    ax.set_ylabel("% of WAL bytes in full-page images")
    ax.set_title("FPI share")
    return _save(fig, path)


def _chart_compressibility(path: Path, archives: list[str], sizes: Mapping[str, Any]) -> Path:
    fig, (ax,) = _figure()
    width = 0.38
    xs = range(len(archives))
    for i, (key, label) in enumerate((("zstd_bytes", "zstd level 1"), ("lz4_bytes", "lz4"))):
        ax.bar([x + (i - 0.5) * width for x in xs],
               [_ratio(sizes.get(a, {}).get(key), sizes.get(a, {}).get("data_bytes")) * 100
                for a in archives], width, label=label)
    ax.set_xticks(list(xs), [_short(a) for a in archives])
    ax.set_ylabel("% of raw size after compression")
    ax.set_title("Compressibility per algorithm (what pg_streampack would send)")
    ax.legend()
    return _save(fig, path)


def _chart_gaps(path: Path, archives: list[str], placement: list[Any],
                reports: Mapping[str, ArchiveReport]) -> Path:
    fig, axes = _figure(len(archives), 2.4)
    for ax, archive in zip(axes, archives, strict=True):
        rows = [r for r in placement if r["archive"] == archive]
        for partial, colour, label in ((False, "tab:blue", "segment"),
                                       (True, "tab:orange", ".partial")):
            pts = [(r["segno"], r["timeline"]) for r in rows if r["partial"] == partial]
            if pts:
                ax.scatter(*zip(*pts, strict=True), s=14, c=colour, marker="s", label=label)
        size = reports[archive].segment_size
        missing = [(p.lsn // size, int(p.file[:8], 16)) for p in reports[archive].problems
                   if p.kind == "missing_segment"]
        if missing:
            ax.scatter(*zip(*missing, strict=True), s=40, c="tab:red", marker="x",
                       label="missing")
        ax.set_ylabel("timeline")
        ax.set_xlabel("segment number")
        ax.set_title(f"Segments on each timeline: {_short(archive)}")
        ax.legend(loc="upper left", fontsize="small")
    return _save(fig, path)


def _ratio(part: Any, whole: Any) -> float:
    return float(part) / float(whole) if part is not None and whole else 0.0


def _pages(archives: list[str], reports: Mapping[str, ArchiveReport],
           rmgr: Mapping[str, Mapping[str, tuple[int, int, int]]], sizes: Mapping[str, Any],
           charts: list[Path]) -> tuple[str, str]:
    md = ["# WAL archive analysis", ""]
    summary = [["archive", "segments", "WAL MB", "recoverable", "recovery range", "errors",
                "zstd-1", "lz4"]]
    for a in archives:
        rep, size = reports[a], sizes.get(a, {})
        rec = rep.recovery
        summary.append([
            a, str(len(rep.scans)), f"{(size.get('data_bytes') or 0) / 1e6:.1f}",
            "yes" if rep.recoverable else "NO",
            f"TL{rec.timeline} {format_lsn(rec.start_lsn)} - {format_lsn(rec.end_lsn)}"
            if rec else "-",
            str(sum(p.severity == "error" for p in rep.problems)),
            f"{_ratio(size.get('zstd_bytes'), size.get('data_bytes')):.1%}",
            f"{_ratio(size.get('lz4_bytes'), size.get('data_bytes')):.1%}"])
    tables = [("Archives", summary)]
    for a in archives:
        rows = [["rmgr", "records", "record bytes", "FPI bytes"]]
        rows += [[k, str(v[0]), str(v[1]), str(v[2])]
                 for k, v in sorted(rmgr.get(a, {}).items(), key=lambda kv: -kv[1][1])]
        tables.append((f"Resource managers: {a}", rows))
    probs = [["archive", "severity", "kind", "file", "LSN", "detail"]]
    probs += [[_short(a), p.severity, p.kind, p.file, format_lsn(p.lsn), p.detail]
              for a in archives for p in reports[a].problems][:MAX_PROBLEMS_LISTED]
    tables.append(("Problems", probs))
    page = ["<!doctype html><html><head><meta charset='utf-8'><title>WAL archive analysis"
            "</title><style>table{border-collapse:collapse}td,th{border:1px solid #999;"
            "padding:2px 6px}</style></head><body><h1>WAL archive analysis</h1>"]
    for title, rows in tables:
        md += [f"## {title}", "", "| " + " | ".join(rows[0]) + " |",
               "|" + "---|" * len(rows[0])]
        md += ["| " + " | ".join(r) + " |" for r in rows[1:]] + [""]
        page.append(f"<h2>{html.escape(title)}</h2><table><tr>"
                    + "".join(f"<th>{html.escape(c)}</th>" for c in rows[0]) + "</tr>")
        page += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                 for r in rows[1:]]
        page.append("</table>")
    md += ["## Charts", ""] + [f"![{c.stem}]({c.name})" for c in charts]
    page += ["<h2>Charts</h2>"] + [f"<p><img src='{c.name}' alt='{c.stem}'></p>"
                                   for c in charts] + ["</body></html>"]
    return "\n".join(md) + "\n", "\n".join(page) + "\n"
