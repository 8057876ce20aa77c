"""``receivewal logical``: a logical replication slot kept as a change log in OUTDIR.

Every option can also come from a ``RECEIVEWAL_*`` environment variable named after the long
option (``RECEIVEWAL_PUBLICATION``, ``RECEIVEWAL_PLUGIN``...), as for ``stream``, so that the
systemd unit's env file serves both. The daemon is ``stream``'s: the supervisor, reconnects,
status, metrics, systemd and the progress line, running a
:class:`~receivewal.logicalreceiver.receiver.LogicalReceiver`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import click

from receivewal.commands.daemonclick import click_options_of
from receivewal.commands.logical_options import LogicalOptions, build_logical_settings
from receivewal.commands.options import json_logs, prompt_password, typed_values
from receivewal.daemon.proctitle import scrub_passwords
from receivewal.daemon.supervisor import Supervisor
from receivewal.errors import ReceivewalError
from receivewal.logicalreceiver.receiver import LogicalReceiver
from receivewal.logs import configure_logging


@click.command("logical")
@click_options_of(LogicalOptions)
def logical_command(**opts: Any) -> int:
    """Keep a logical replication slot's changes as a change log in DIRECTORY.

    pgoutput (protocol versions 1 to 4) or pglogical_output, written as JSON Lines files,
    every committed transaction exactly once, in commit order, across crashes
    (docs/changelog.md). Every option can also come from the environment as
    RECEIVEWAL_<LONG_OPTION>, e.g. RECEIVEWAL_DBNAME, RECEIVEWAL_SLOT,
    RECEIVEWAL_PUBLICATION (the command line wins). Help is --help or -?: -h is the host.
    """
    options = LogicalOptions(**typed_values(LogicalOptions, opts))
    if options.verbose:  # -v asks for the progress line too, as for stream
        options = replace(options, progress=True)
    configure_logging(options.verbose, json=json_logs(options))
    try:
        settings = build_logical_settings(options)
    except ReceivewalError as exc:
        raise click.UsageError(str(exc)) from exc
    scrub_passwords()
    prompt = None if options.no_password else prompt_password
    return Supervisor(settings.base, LogicalReceiver(settings), prompt=prompt).run()
