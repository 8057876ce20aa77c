"""The ``analyze`` report's charts (matplotlib, Agg backend), for one archive or many.

Every chart labels sizes as the report does (``1.2 MB``), uses integer ticks for counts,
segment numbers and timelines, and shows time in UTC. Comparisons between archives are drawn
only when there is more than one archive.
"""

# ruff: noqa: PLC0415 - matplotlib is the optional spark extra: lazy
from __future__ import annotations

import datetime
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from receivewal.check.crosscheck import ArchiveReport
from receivewal.check.sizes import size_unit
from receivewal.check.walclock import WalClock, wal_per_bucket
from receivewal.wal.names import parse_segment_file_name

#: Bucket widths for WAL over time (seconds, label), the finest that gives at most MAX_BUCKETS.
BUCKETS = ((1, "second"), (10, "10 seconds"), (60, "minute"), (600, "10 minutes"),
           (3600, "hour"), (86400, "day"))
MAX_BUCKETS = 120
TOP_RMGRS = 10


def _short(archive: str) -> str:
    return archive.rstrip("/").rsplit("/", 1)[-1] or archive


def figure(rows: int, height: float, width: float = 9.0, cols: int = 1) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, cols, figsize=(width, height * rows), squeeze=False)
    return fig, axes


def save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def pick_bucket(span_seconds: float) -> tuple[int, str]:
    """The finest bucket width that cuts ``span_seconds`` into at most MAX_BUCKETS."""
    for width, label in BUCKETS:
        if span_seconds / width <= MAX_BUCKETS:
            return width, label
    return BUCKETS[-1]


def wal_over_time(path: Path, archives: list[str], clocks: Mapping[str, WalClock]) -> Path:
    """WAL written per time bucket: bars for one archive, one line per archive for many."""
    from matplotlib import dates, ticker

    fig, axes = figure(1, 4.0)
    ax = axes[0, 0]
    spans = [s for s in (clocks[a].span for a in archives) if s is not None]
    if not spans:
        ax.text(0.5, 0.5, "no commit or checkpoint record with a timestamp", ha="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return save(fig, path)
    width, label = pick_bucket(max(s[1] for s in spans) - min(s[0] for s in spans))
    series = {a: wal_per_bucket(clocks[a].ranges, clocks[a].marks, width) for a in archives}
    divisor, unit = size_unit(max((n for v in series.values() for n in v.values()), default=0))
    for archive, values in series.items():
        if not values:
            continue
        when = [datetime.datetime.fromtimestamp(t, datetime.UTC)
                for t in [*values, max(values) + width]]
        sizes = [n / divisor for n in values.values()]
        if len(archives) == 1:
            ax.bar(when[:-1], sizes, width=width / 86400 * 0.9, align="edge")
        else:  # one line per archive; the last bucket drawn to its end
            ax.step(when, [*sizes, sizes[-1]], where="post", label=_short(archive))
    ax.yaxis.set_major_locator(ticker.MaxNLocator(steps=[1, 2, 2.5, 5, 10]))
    first = min(min(v) for v in series.values() if v)
    last = max(max(v) for v in series.values() if v) + width
    ax.set_xlim(datetime.datetime.fromtimestamp(first - width, datetime.UTC),  # a bucket of
                datetime.datetime.fromtimestamp(last + width, datetime.UTC))  # room each side
    locator = dates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(dates.ConciseDateFormatter(locator, tz=datetime.UTC))
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"{unit} of WAL per {label}")
    ax.set_xlabel("time (UTC)")
    ax.set_title(f"WAL written per {label}")
    if len(archives) > 1:  # beside the plot, where it hides no line
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save(fig, path)


def wal_by_rmgr(path: Path, archives: list[str],
                rmgr: Mapping[str, Mapping[str, tuple[int, int, int]]]) -> Path:
    """Per archive: WAL bytes per resource manager (the largest ten), records vs FPIs."""
    from matplotlib import ticker

    fig, axes = figure(len(archives), 3.0)
    largest = max((v[1] + v[2] for per in rmgr.values() for v in per.values()), default=0)
    divisor, unit = size_unit(largest)
    for ax, archive in zip(axes[:, 0], archives, strict=True):
        items = sorted(rmgr.get(archive, {}).items(),
                       key=lambda kv: -(kv[1][1] + kv[1][2]))[:TOP_RMGRS]
        names = [k for k, _ in items]
        records = [v[1] / divisor for _, v in items]
        ax.barh(names, records, label="record data")
        ax.barh(names, [v[2] / divisor for _, v in items], left=records,
                label="full-page images")
        ax.invert_yaxis()
        ax.set_xlim(0, largest / divisor * 1.05 or 1)
        ax.xaxis.set_major_locator(ticker.MaxNLocator(steps=[1, 2, 2.5, 5, 10]))
        ax.set_xlabel(f"{unit} of WAL (the same scale for every archive)")
        ax.set_title(f"WAL per resource manager: {_short(archive)}")
        ax.legend(loc="lower right", fontsize="small")
    return save(fig, path)


def segment_map(path: Path, archives: list[str], placement: list[dict[str, Any]],
                reports: Mapping[str, ArchiveReport]) -> Path:
    """Per archive: which segment numbers exist on which timeline; .partial and missing."""
    from matplotlib import ticker

    fig, axes = figure(len(archives), 2.2)
    for ax, archive in zip(axes[:, 0], archives, strict=True):
        rows = [r for r in placement if r["archive"] == archive]
        for partial, colour, label in ((False, "tab:blue", "segment"),
                                       (True, "tab:orange", ".partial")):
            pts = [(r["segno"], r["timeline"]) for r in rows if r["partial"] == partial]
            if pts:
                ax.scatter(*zip(*pts, strict=True), s=16, c=colour, marker="s", label=label)
        size = reports[archive].segment_size
        missing = [(seg.segno, seg.timeline) for p in reports[archive].problems
                   if p.kind == "missing_segment"
                   and (seg := parse_segment_file_name(p.file, size)) is not None]
        if missing:
            ax.scatter(*zip(*missing, strict=True), s=50, c="tab:red", marker="x",
                       label="missing")
        timelines = sorted({r["timeline"] for r in rows} | {t for _, t in missing})
        ax.set_yticks(timelines)
        ax.set_ylim(min(timelines, default=1) - 0.5, max(timelines, default=1) + 0.5)
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
        ax.set_ylabel("timeline")
        ax.set_xlabel("segment number")
        ax.set_title(f"Segments on each timeline: {_short(archive)}")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return save(fig, path)


def archives_compared(path: Path, archives: list[str],
                      sizes: Mapping[str, Mapping[str, Any]]) -> Path:
    """Several archives side by side: FPI share, and size after zstd-1 and lz4."""
    from matplotlib import ticker

    fig, axes = figure(1, 0.5 * len(archives) + 1.5, width=10, cols=2)
    names = [_short(a) for a in archives]
    fpi = [_share(sizes.get(a, {}).get("fpi_bytes"),
                  (sizes.get(a, {}).get("fpi_bytes") or 0)
                  + (sizes.get(a, {}).get("record_bytes") or 0)) for a in archives]
    left, right = axes[0, 0], axes[0, 1]
    left.barh(names, fpi)
    left.set_title("Full-page images, % of WAL")
    height = 0.4
    ys = range(len(archives))
    for i, (key, label) in enumerate((("zstd_bytes", "zstd level 1"), ("lz4_bytes", "lz4"))):
        right.barh([y + (i - 0.5) * height for y in ys],
                   [_share(sizes.get(a, {}).get(key), sizes.get(a, {}).get("data_bytes"))
                    for a in archives], height, label=label)
    right.set_yticks(list(ys), names)
    right.set_title("Size after compression, % of raw WAL")
    right.legend(fontsize="small")
    for ax in (left, right):
        ax.invert_yaxis()
        ax.set_xlim(0, 100)
        ax.xaxis.set_major_formatter(ticker.PercentFormatter())
    return save(fig, path)


def _share(part: Any, whole: Any) -> float:
    return float(part) / float(whole) * 100 if part is not None and whole else 0.0
