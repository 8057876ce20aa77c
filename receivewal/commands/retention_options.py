"""The retention policy's two options, declared once: ``cleanup``'s (given on its command line
only) and, with their variables, ``backup``'s (the policy applied after each backup).

Lean on purpose: ``backup`` reads its policy here before it connects and imports ``cleanup``
(the removal, the archive's view, the daemon's state file) only once a backup is complete and
a policy was given.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

from receivewal.commands.clickoptions import click_option
from receivewal.commands.plain import TEXT, Option
from receivewal.errors import ConfigurationError
from receivewal.retention.policy import (
    KEEP_BACKUPS_ENV,
    RECOVERY_WINDOW_ENV,
    make_policy,
    parse_keep,
    parse_window,
)

if TYPE_CHECKING:
    from receivewal.retention.plan import Policy

Command = TypeVar("Command", bound=Callable[..., Any])

KEEP_BACKUPS = Option("keep_backups", ("--keep-backups",), TEXT, metavar="N",
                      help="Keep the N newest complete backups and the WAL they need.")
RECOVERY_WINDOW = Option("recovery_window", ("--recovery-window",), TEXT, metavar="D",
                         help="Keep what recovery to any time of the last D needs (14d, 36h, "
                         "2w).")


def retention_options(command: Command) -> Command:
    """A decorator of a click command's function, under ``@click.command``: ``--keep-backups
    N`` and ``--recovery-window D`` (env ``RECEIVEWAL_KEEP_BACKUPS``,
    ``RECEIVEWAL_RECOVERY_WINDOW``) for ``receivewal backup``, the policy applied after each
    successful backup (the function's parameters ``keep_backups`` and ``recovery_window``;
    check them with :func:`policy_after_backup` before the backup starts)."""
    command = click_option(RECOVERY_WINDOW.but(
        env=RECOVERY_WINDOW_ENV,
        help="After the backup, remove what recovery to any time of the last D no longer "
        f"needs, as cleanup does (env {RECOVERY_WINDOW_ENV})."))(command)
    return click_option(KEEP_BACKUPS.but(
        env=KEEP_BACKUPS_ENV,
        help="After the backup, keep the N newest complete backups and remove the rest and "
        f"the WAL no kept backup needs, as cleanup does (env {KEEP_BACKUPS_ENV})."))(command)


def policy_after_backup(keep_backups: str | None, recovery_window: str | None
                        ) -> Policy | None:
    """The policy of :func:`retention_options`' values (None: none set); click.UsageError
    for a bad value or both."""
    if keep_backups is None and recovery_window is None:
        return None
    return policy_of(keep_backups, recovery_window)


def policy_of(keep_backups: str | None, recovery_window: str | None) -> Policy:
    """The one policy the two options give; click.UsageError for a bad value, both or
    none."""
    try:
        return make_policy(None if keep_backups is None else parse_keep(keep_backups),
                           None if recovery_window is None else parse_window(recovery_window),
                           datetime.now(UTC))
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
