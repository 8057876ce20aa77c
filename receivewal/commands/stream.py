"""``receivewal stream``: the pg_receivewal-compatible command line of the daemon.

Every option can also come from a ``RECEIVEWAL_*`` environment variable (named after the long
option, e.g. ``RECEIVEWAL_DIRECTORY``, ``RECEIVEWAL_SLOT``), so that a systemd unit needs no long
argv and no secret ever appears in one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from receivewal.commands.clickoptions import naming_variables
from receivewal.commands.options import (
    Lsn,
    Repeated,
    StreamOptions,
    build_settings,
    declared_options,
    json_logs,
    options_from,
    prompt_password,
)
from receivewal.daemon.proctitle import scrub_passwords
from receivewal.daemon.supervisor import Supervisor
from receivewal.errors import ConfigurationError, ReceivewalError
from receivewal.logs import configure_logging
from receivewal.wal.lsn import parse_lsn
from receivewal.walreceiver.receiver import WalReceiver


def parsed_lsn(ctx: click.Context, param: click.Parameter, value: str | None) -> Lsn | None:
    """An LSN option (``X/X``) parsed once, here; an empty one is none. A bad one is the
    usage error ``receivewal stream`` has always given for it, in parse_lsn's words."""
    if not value:
        return None
    try:
        return Lsn(parse_lsn(value))
    except ConfigurationError as exc:
        raise click.UsageError(str(exc), ctx) from exc


def declared_click_options(command: Callable[..., int]) -> Callable[..., int]:
    """Decorate ``command`` with one click option per option of ``stream``."""
    return click_options_of(StreamOptions)(command)


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


@click.command("stream")
@declared_click_options
def stream_command(**opts: Any) -> int:
    """Stream WAL from a server into DIRECTORY, as pg_receivewal does.

    Every option can also come from the environment as RECEIVEWAL_<LONG_OPTION>, e.g.
    RECEIVEWAL_DIRECTORY, RECEIVEWAL_DBNAME, RECEIVEWAL_SLOT, RECEIVEWAL_SYNCHRONOUS=1 (the
    command line wins); libpq's PGHOST, PGPASSFILE... work as usual. Help is --help or -?:
    -h is the host, as in pg_receivewal.
    """
    options = options_from(opts)
    if options.verbose:  # -v asks for the progress line too (the drop-in's -v does not)
        options = replace(options, progress=True)
    configure_logging(options.verbose, json=json_logs(options))
    try:
        settings = build_settings(options)
    except ReceivewalError as exc:
        raise click.UsageError(str(exc)) from exc
    scrub_passwords()  # parsed: ps need not show a password for the daemon's whole life
    prompt = None if options.no_password else prompt_password
    return Supervisor(settings, WalReceiver(settings), prompt=prompt).run()
