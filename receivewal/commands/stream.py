"""``receivewal stream``: the pg_receivewal-compatible command line of the daemon.

Every option can also come from a ``RECEIVEWAL_*`` environment variable (named after the long
option, e.g. ``RECEIVEWAL_DIRECTORY``, ``RECEIVEWAL_SLOT``), so that a systemd unit needs no long
argv and no secret ever appears in one.
"""

from __future__ import annotations

import getpass
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from receivewal.addresses import parse_address
from receivewal.archive.compression import parse_compress_option
from receivewal.commands.options import StreamOptions, declared_options, options_from
from receivewal.daemon.proctitle import scrub_passwords
from receivewal.daemon.settings import Settings
from receivewal.daemon.supervisor import Supervisor, prompt_password
from receivewal.daemon.walreceiver import WalReceiver
from receivewal.errors import ReceivewalError
from receivewal.logs import configure_logging
from receivewal.replication.connection import build_conninfo, conninfo_options
from receivewal.replication.negotiation import parse_compression_list, with_streampack_option
from receivewal.wal.lsn import parse_lsn


def declared_click_options(command: Callable[..., int]) -> Callable[..., int]:
    """Decorate ``command`` with one click option per declared option, in declaration order:
    a bool is a flag (or an on/off pair), an int a count, a float seconds from 0 up."""
    for fld, spec, kind in reversed(declared_options()):
        command = click.option(
            *filter(None, (spec.short, spec.long)), fld.name, help=spec.help,
            is_flag=(kind is bool and "/" not in spec.long) or None, count=kind is int,
            default=fld.default, show_default=spec.show_default or None, envvar=spec.env_var,
            type=click.FloatRange(min=0) if kind is float
            else click.Path(path_type=Path, file_okay=True) if kind is Path
            else click.Choice(spec.choices) if spec.choices else None)(command)
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
    configure_logging(options.verbose, json=_json_logs(options))
    try:
        settings = build_settings(options)
    except ReceivewalError as exc:
        raise click.UsageError(str(exc)) from exc
    scrub_passwords()  # parsed: ps need not show a password for the daemon's whole life
    prompt = None if options.no_password else prompt_password
    return Supervisor(settings, WalReceiver(settings), prompt=prompt).run()


def _json_logs(opts: StreamOptions) -> bool:
    """--log-format, with auto meaning JSON unless stderr is a terminal."""
    return opts.log_format == "json" or (opts.log_format == "auto" and not sys.stderr.isatty())


def build_settings(opts: StreamOptions) -> Settings:
    """Turn parsed options into validated Settings (raises ConfigurationError)."""
    compression = parse_compression_list(opts.compression)
    at_rest = parse_compress_option(opts.compress)
    password = None
    if opts.force_password and not opts.no_password:
        password = getpass.getpass("Password: ")
    base = build_conninfo(opts.dbname, host=opts.host, port=opts.port, user=opts.username,
                          password=password)
    options = with_streampack_option(conninfo_options(base), compression)
    endpos = parse_lsn(opts.endpos) if opts.endpos else None
    if opts.metrics_address:
        parse_address(opts.metrics_address)  # a bad address fails before connecting
    return Settings(
        directory=opts.directory,
        conninfo=build_conninfo(base, options=options) if options else base,
        slot=opts.slot,
        create_slot=opts.create_slot,
        drop_slot=opts.drop_slot,
        if_not_exists=opts.if_not_exists,
        reserve_wal=opts.reserve_wal,
        create_slot_if_missing=opts.create_slot_if_missing,
        status_interval=float(opts.status_interval),
        synchronous=opts.synchronous,
        sync=not opts.no_sync,
        endpos=endpos,
        no_loop=opts.no_loop,
        wait_for_server=opts.wait_for_server,
        compression=compression,
        at_rest=at_rest,
        hot_standby_feedback=opts.hot_standby_feedback,
        receive_timeout=float(opts.receive_timeout),
        reconnect_delay=float(opts.reconnect_delay),
        reconnect_delay_max=float(opts.reconnect_delay_max),
        metrics_address=opts.metrics_address,
        progress=opts.progress and sys.stderr.isatty() and not _json_logs(opts),
        upload_to=opts.upload_to or None,
        confirm_after=opts.confirm_after,
        upload_wait=float(opts.upload_wait),
    ).validate()
