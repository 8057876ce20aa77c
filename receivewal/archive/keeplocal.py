"""--keep-local's value: the window of segments the archive directory of a daemon that uploads
keeps (:mod:`receivewal.retention.localrule` applies it), parsed (pure, light: the settings of
``stream`` import it)."""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from receivewal.errors import ConfigurationError

KEEP_ALL = "all"  # --keep-local's value that turns the rule off (the default)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400,
          "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40}
_AGE_UNITS = ("s", "m", "h", "d")
_VALUE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)")
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class KeepLocal:
    """The window of segments the local copy keeps: the last ``seconds`` or ``size`` bytes;
    ``text`` as the operator gave it."""

    text: str
    seconds: float | None = None
    size: int | None = None

    def describe(self) -> str:
        """The window in words (``status``)."""
        return f"segments of the last {self.text}"


def parse_keep_local(text: str | None) -> KeepLocal | None:
    """--keep-local's value: ``all`` (or nothing: None, the rule off), an age (``36h``,
    ``90m``, ``7d``, ``30s``) or a size (``10GB``, ``500MB``, ``1TB``, ``64kB``).
    ConfigurationError in one line for anything else."""
    if text is None or not text.strip() or text.strip().lower() == KEEP_ALL:
        return None
    match = _VALUE.fullmatch(text.strip().lower())
    if match is None or match.group(2) not in _UNITS or float(match.group(1)) <= 0:
        raise ConfigurationError(
            f'invalid --keep-local "{text[:40]}": "all", an age (36h, 90m, 7d) or a size '
            "(10GB, 500MB) greater than 0")
    number, unit = float(match.group(1)), match.group(2)
    if unit in _AGE_UNITS:
        return KeepLocal(text.strip(), seconds=number * _UNITS[unit])
    return KeepLocal(text.strip(), size=int(number * _UNITS[unit]))


def inside_window(rule: KeepLocal, weighed: Mapping[K, tuple[int, float]], now: float) -> set[K]:
    """The keys of ``weighed`` (each with its bytes and completion time, seconds since the
    epoch; sortable, newest greatest) inside ``rule``'s window at ``now``: completed within
    its age, or the newest whose bytes together fit its size."""
    if rule.seconds is not None:
        return {key for key, (_, done) in weighed.items() if done >= now - rule.seconds}
    inside: set[K] = set()
    total = 0
    for key in sorted(weighed, reverse=True):  # type: ignore[type-var]
        total += weighed[key][0]
        if rule.size is None or total > rule.size:
            break
        inside.add(key)
    return inside


#: How often the daemon applies the rule when no upload wakes it (seconds), and the variable
#: the tests shorten it with: the WAL archive's local copy and the change log's alike.
INTERVAL_ENV = "RECEIVEWAL_TEST_LOCAL_INTERVAL"
INTERVAL = 60.0
