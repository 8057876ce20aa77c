"""``receivewal stream``: the pg_receivewal-compatible command line of the daemon.

Every option can also come from a ``RECEIVEWAL_*`` environment variable (named after the long
option, e.g. ``RECEIVEWAL_DIRECTORY``, ``RECEIVEWAL_SLOT``), so that a systemd unit needs no long
argv and no secret ever appears in one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import click

from receivewal.commands.daemonclick import click_options_of
from receivewal.commands.options import (
    StreamOptions,
    build_settings,
    json_logs,
    options_from,
    prompt_password,
)
from receivewal.daemon.proctitle import scrub_passwords
from receivewal.daemon.supervisor import Supervisor
from receivewal.errors import ReceivewalError
from receivewal.logs import configure_logging
from receivewal.walreceiver.receiver import WalReceiver


def declared_click_options(command: Callable[..., int]) -> Callable[..., int]:
    """Decorate ``command`` with one click option per option of ``stream``."""
    return click_options_of(StreamOptions)(command)


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
