"""The click twin of a declared :class:`~receivewal.commands.plain.Option` (a row of
:mod:`receivewal.commands.catalog`, or of a lean command's ``OPTIONS``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from receivewal.commands.plain import FLAG, Option

F = TypeVar("F", bound=Callable[..., Any])


def click_option(option: Option, **click_settings: Any) -> Callable[[F], F]:
    """The click option of ``option``: its spellings, destination, help, metavar, variable
    and whether it is required, a flag for a :data:`~receivewal.commands.plain.FLAG`;
    ``click_settings`` are the command's own (its type, default, callback, ``multiple``; an
    ``envvar`` list that reads a variable of its own first)."""
    if option.kind == FLAG:
        click_settings.setdefault("is_flag", True)
    click_settings.setdefault("envvar", option.env)
    return click.option(*option.names, option.dest, help=option.help,
                        metavar=option.metavar or None, required=option.required,
                        **click_settings)
