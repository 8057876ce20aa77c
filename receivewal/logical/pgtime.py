"""PostgreSQL's dates and times as text, from the numbers it sends (pure).

PostgreSQL counts dates in days and timestamps in microseconds from 2000-01-01 (UTC for
timestamptz), on the proleptic Gregorian calendar, far beyond Python's ``datetime`` range
(4713 BC to 294276 AD). The functions here print them as its output functions do with
``DateStyle = ISO`` and ``TimeZone = UTC`` (the settings a logical receiver's connection uses,
so that text and binary transfer give the same strings): ``2026-11-26``, ``10:00:00.5``,
``2026-11-26 10:00:00.123456+00``, ``0044-03-15 BC``, ``infinity``. :func:`iso_utc` writes
the change log's own commit times, ``2026-11-26T10:00:00.123456Z``.
"""

from __future__ import annotations

DAYS_1970_TO_2000 = 10_957
USECS_PER_DAY = 86_400_000_000
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def civil_from_days(days: int) -> tuple[int, int, int]:
    """(year, month, day) of the day ``days`` after 1970-01-01 on the proleptic Gregorian
    calendar (year 0 is 1 BC), for any integer (the well-known era/day-of-era method)."""
    shifted = days + 719_468  # days since 0000-03-01
    era = shifted // 146_097
    day_of_era = shifted - era * 146_097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36_524
                   - day_of_era // 146_096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    month_index = (5 * day_of_year + 2) // 153  # March is 0
    day = day_of_year - (153 * month_index + 2) // 5 + 1
    month = month_index + 3 if month_index < 10 else month_index - 9
    year = year_of_era + era * 400 + (month <= 2)
    return year, month, day


def _date_text(days_since_2000: int) -> tuple[str, bool]:
    """``YYYY-MM-DD`` and whether the date is BC."""
    year, month, day = civil_from_days(days_since_2000 + DAYS_1970_TO_2000)
    bc = year <= 0
    return f"{1 - year if bc else year:04d}-{month:02d}-{day:02d}", bc


def _seconds_text(microseconds: int) -> str:
    """``SS`` with the fraction PostgreSQL prints: up to six digits, trailing zeros cut."""
    seconds, fraction = divmod(microseconds, 1_000_000)
    text = f"{seconds:02d}"
    if fraction:
        text += "." + f"{fraction:06d}".rstrip("0")
    return text


def format_time(microseconds: int) -> str:
    """A ``time`` (microseconds since midnight, 24:00:00 included) as time_out prints it."""
    hours, rest = divmod(microseconds, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    return f"{hours:02d}:{minutes:02d}:{_seconds_text(rest)}"


def format_date(days_since_2000: int) -> str:
    """A ``date`` as date_out prints it with DateStyle ISO."""
    if days_since_2000 == _INT32_MIN:
        return "-infinity"
    if days_since_2000 == _INT32_MAX:
        return "infinity"
    text, bc = _date_text(days_since_2000)
    return text + " BC" if bc else text


def format_timestamp(microseconds: int, *, utc_offset: bool) -> str:
    """A ``timestamp`` (or, with ``utc_offset``, a ``timestamptz`` shown in UTC) as
    timestamp_out prints it with DateStyle ISO."""
    if microseconds == _INT64_MIN:
        return "-infinity"
    if microseconds == _INT64_MAX:
        return "infinity"
    days, in_day = divmod(microseconds, USECS_PER_DAY)
    date, bc = _date_text(days)
    text = f"{date} {format_time(in_day)}" + ("+00" if utc_offset else "")
    return text + " BC" if bc else text


def iso_utc(microseconds: int) -> str:
    """A PostgreSQL timestamp as the change log writes times: ISO 8601 in UTC with six
    fractional digits (``2026-11-26T10:00:00.123456Z``)."""
    days, in_day = divmod(microseconds, USECS_PER_DAY)
    year, month, day = civil_from_days(days + DAYS_1970_TO_2000)
    hours, rest = divmod(in_day, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds, fraction = divmod(rest, 1_000_000)
    return (f"{year:04d}-{month:02d}-{day:02d}T{hours:02d}:{minutes:02d}:{seconds:02d}"
            f".{fraction:06d}Z")
