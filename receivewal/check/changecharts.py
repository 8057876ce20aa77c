"""The ``analyze --changes`` report's charts (matplotlib, Agg backend): changes per hour by
kind, and the tables with the most change volume. Sizes and axes as the WAL report's charts
(:mod:`receivewal.check.charts`)."""

# ruff: noqa: PLC0415 - matplotlib is the optional spark extra: lazy
from __future__ import annotations

import datetime
from collections import defaultdict
from pathlib import Path
from typing import Any

from receivewal.check.charts import figure, save
from receivewal.check.report import short_name
from receivewal.check.sizes import size_unit

OPS = ("inserts", "updates", "deletes", "truncates")
TOP_TABLES = 10


def changes_over_time(path: Path, hours: list[dict[str, Any]]) -> Path:
    """Changes per hour (UTC), every log together, stacked by kind."""
    from matplotlib import dates, ticker

    fig, axes = figure(1, 4.0)
    ax = axes[0, 0]
    totals: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(OPS, 0))
    for h in hours:
        if h["hour_seconds"] is not None:
            for op in OPS:
                totals[int(h["hour_seconds"])][op] += int(h[op] or 0)
    if not totals:
        ax.text(0.5, 0.5, "no change with a transaction time", ha="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return save(fig, path)
    starts = sorted(totals)
    when = [datetime.datetime.fromtimestamp(s, datetime.UTC) for s in starts]
    bottom = [0] * len(starts)
    for op in OPS:
        values = [totals[s][op] for s in starts]
        ax.bar(when, values, width=1 / 24 * 0.9, align="edge", bottom=bottom, label=op)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    locator = dates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(dates.ConciseDateFormatter(locator, tz=datetime.UTC))
    ax.set_xlim(when[0] - datetime.timedelta(hours=1), when[-1] + datetime.timedelta(hours=2))
    ax.set_ylabel("changes per hour")
    ax.set_xlabel("time (UTC)")
    ax.set_title("Changes per hour, by kind")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save(fig, path)


def changes_by_table(path: Path, logs: list[str], by_table: list[dict[str, Any]]) -> Path:
    """Per log: the tables with the most change volume (the largest ten)."""
    from matplotlib import ticker

    fig, axes = figure(len(logs), 3.0)
    largest = max((int(t["change_bytes"] or 0) for t in by_table), default=0)
    divisor, unit = size_unit(largest)
    for ax, log in zip(axes[:, 0], logs, strict=True):
        top = sorted((t for t in by_table if t["log"] == log),
                     key=lambda t: -int(t["change_bytes"] or 0))[:TOP_TABLES]
        ax.barh([f"{t['schema']}.{t['table']}" for t in top],
                [int(t["change_bytes"] or 0) / divisor for t in top])
        ax.invert_yaxis()
        ax.set_xlim(0, largest / divisor * 1.05 or 1)
        ax.xaxis.set_major_locator(ticker.MaxNLocator(steps=[1, 2, 2.5, 5, 10]))
        ax.set_xlabel(f"{unit} of change lines (the same scale for every log)")
        ax.set_title(f"Change volume per table: {short_name(log)}")
    return save(fig, path)
