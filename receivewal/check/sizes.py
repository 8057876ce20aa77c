"""Sizes as the report and its charts show them: 1024-based units, as pg_size_pretty
(1 MB = 1024 kB)."""

from __future__ import annotations

UNITS = ("bytes", "kB", "MB", "GB", "TB", "PB")


def human_bytes(n: float | None) -> str:
    """``1.2 GB``-style size (1024-based, as pg_size_pretty); ``-`` for unknown."""
    if n is None:
        return "-"
    value, unit = float(n), 0
    while abs(value) >= 1024 and unit < len(UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{int(value):,} bytes" if unit == 0 else f"{value:,.1f} {UNITS[unit]}"


def size_unit(largest: float) -> tuple[int, str]:
    """The divisor and name of the unit that shows ``largest`` bytes as 1-1023 (1 MB =
    1024 kB, as the report's tables), so that axes get round ticks in that unit."""
    unit = 0
    while largest >= 1024 ** (unit + 1) and unit < len(UNITS) - 1:
        unit += 1
    return 1024 ** unit, UNITS[unit]
