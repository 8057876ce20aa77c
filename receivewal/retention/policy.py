"""A retention policy as the command line and the environment give it (pure).

``--keep-backups N`` (``RECEIVEWAL_KEEP_BACKUPS``) or ``--recovery-window D``
(``RECEIVEWAL_RECOVERY_WINDOW``), exactly one of them. A window is a whole number and a unit:
``s``, ``min`` (or ``m``), ``h``, ``d`` or ``w`` (``14d``, ``36h``, ``2w``); a number alone
means days. The plan's policies are imported when one is made: ``backup`` reads its options
and their variables here without the rest of retention.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from receivewal.errors import ConfigurationError

if TYPE_CHECKING:
    from receivewal.retention.plan import Policy

KEEP_BACKUPS_ENV = "RECEIVEWAL_KEEP_BACKUPS"
RECOVERY_WINDOW_ENV = "RECEIVEWAL_RECOVERY_WINDOW"

_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_WINDOW = re.compile(r"\s*(\d{1,9})\s*([a-z]*)\s*")


def parse_window(text: str) -> timedelta:
    """The length ``text`` (``14d``...) says; ConfigurationError naming it otherwise."""
    match = _WINDOW.fullmatch(text.lower())
    unit = None if match is None else _UNITS.get(match.group(2) or "d")
    if match is None or unit is None or int(match.group(1)) == 0:
        raise ConfigurationError(f'invalid recovery window "{text}": give a whole number and '
                                 "a unit, s, min, h, d or w (e.g. 14d)")
    try:
        return timedelta(seconds=int(match.group(1)) * unit)
    except OverflowError:
        raise ConfigurationError(f'recovery window "{text}" is too long') from None


def parse_keep(text: str) -> int:
    """The count of backups ``text`` says (at least 1); ConfigurationError otherwise."""
    if not text.strip().isdigit() or int(text) < 1:
        raise ConfigurationError(f'invalid number of backups to keep "{text}": give a whole '
                                 "number, at least 1")
    return int(text)


def make_policy(keep_backups: int | None, recovery_window: timedelta | None,
                now: datetime) -> Policy:
    """The one policy given; ConfigurationError when both or none are."""
    from receivewal.retention.plan import KeepBackups, RecoveryWindow  # noqa: PLC0415 - lean

    if keep_backups is not None and recovery_window is not None:
        raise ConfigurationError("give either --keep-backups or --recovery-window, not both")
    if keep_backups is not None:
        if keep_backups < 1:
            raise ConfigurationError("--keep-backups must keep at least 1 backup")
        return KeepBackups(keep_backups)
    if recovery_window is not None:
        return RecoveryWindow(recovery_window, now)
    raise ConfigurationError("give a retention policy: --keep-backups N or "
                             "--recovery-window D (e.g. 14d)")


def policy_from_environment(environ: Mapping[str, str], now: datetime) -> Policy | None:
    """The policy ``RECEIVEWAL_KEEP_BACKUPS`` or ``RECEIVEWAL_RECOVERY_WINDOW`` sets (None
    when neither is set or both are empty); ConfigurationError naming the variable when its
    value is not one or both are set."""
    from receivewal.retention.plan import KeepBackups, RecoveryWindow  # noqa: PLC0415 - lean

    keep = environ.get(KEEP_BACKUPS_ENV, "").strip()
    window = environ.get(RECOVERY_WINDOW_ENV, "").strip()
    if not keep and not window:
        return None
    if keep and window:
        raise ConfigurationError(f"set either {KEEP_BACKUPS_ENV} or {RECOVERY_WINDOW_ENV}, "
                                 "not both")
    try:
        if keep:
            return KeepBackups(parse_keep(keep))
        return RecoveryWindow(parse_window(window), now)
    except ConfigurationError as exc:
        name = KEEP_BACKUPS_ENV if keep else RECOVERY_WINDOW_ENV
        raise ConfigurationError(f"{name}: {exc}") from exc
