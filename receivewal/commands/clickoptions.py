"""The click twin of a declared :class:`~receivewal.commands.plain.Option` (a row of
:mod:`receivewal.commands.catalog`, or of a lean command's ``OPTIONS``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from receivewal.commands.plain import FLAG, Option

F = TypeVar("F", bound=Callable[..., Any])


def naming_variables(help_text: str, variables: Sequence[str]) -> str:
    """``help_text`` naming each of ``variables`` the one way every command's help does,
    ``(env NAME)`` after it (as click puts ``[default: ...]``), unless it names it already
    (``env NAME``)."""
    for name in variables:
        if f"env {name}" not in help_text:
            help_text = f"{help_text} (env {name})"
    return help_text


def click_option(option: Option, **click_settings: Any) -> Callable[[F], F]:
    """The click option of ``option``: its spellings, destination, help, metavar, variable
    and whether it is required, a flag for a :data:`~receivewal.commands.plain.FLAG`;
    ``click_settings`` are the command's own (its type, default, callback, ``multiple``; an
    ``envvar`` list that reads a variable of its own first)."""
    if option.kind == FLAG:
        click_settings.setdefault("is_flag", True)
    click_settings.setdefault("envvar", option.env)
    variables = click_settings["envvar"]
    help_text = naming_variables(option.help, [variables] if isinstance(variables, str)
                                 else variables or [])
    return click.option(*option.names, option.dest, help=help_text,
                        metavar=option.metavar or None, required=option.required,
                        **click_settings)
