"""The click options of the two daemons' commands, ``stream`` and ``logical``, built from the
fields that declare them (:mod:`receivewal.commands.options`).

Its own module so that ``logical`` takes them without ``stream``'s command, which imports the
WAL archive's receiver.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from receivewal.commands.clickoptions import naming_variables
from receivewal.commands.options import Lsn, Repeated, declared_options
from receivewal.errors import ConfigurationError
from receivewal.wal.lsn import parse_lsn


def parsed_lsn(ctx: click.Context, param: click.Parameter, value: str | None) -> Lsn | None:
    """An LSN option (``X/X``) parsed once, here; an empty one is none. A bad one is the
    usage error ``receivewal stream`` has always given for it, in parse_lsn's words."""
    if not value:
        return None
    try:
        return Lsn(parse_lsn(value))
    except ConfigurationError as exc:
        raise click.UsageError(str(exc), ctx) from exc


def click_options_of(cls: type) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """What decorates a command with one click option per option ``cls`` declares, in
    declaration order: a bool is a flag (or an on/off pair), an int a count, a float seconds
    from 0 up, an Lsn parsed by :func:`parsed_lsn`."""
    def decorate(command: Callable[..., int]) -> Callable[..., int]:
        return _decorated(cls, command)
    return decorate


def _decorated(cls: type, command: Callable[..., int]) -> Callable[..., int]:
    for fld, spec, kind in reversed(declared_options(cls)):
        command = click.option(
            *filter(None, (spec.short, spec.long)), fld.name,
            help=naming_variables(spec.help, [spec.env_var] if spec.env_var else []),
            is_flag=(kind is bool and "/" not in spec.long) or None, count=kind is int,
            multiple=kind is Repeated, default=fld.default,
            show_default=spec.show_default or None, envvar=spec.env_var,
            type=click.FloatRange(min=0) if kind is float
            else click.Path(path_type=Path, file_okay=True) if kind is Path
            else click.Choice(spec.choices) if spec.choices else None,
            callback=parsed_lsn if kind is Lsn else None)(command)
    return command
