"""``receivewal stream``: the pg_receivewal-compatible command line of the daemon.

Every option can also come from a ``RECEIVEWAL_*`` environment variable (named after the long
option, e.g. ``RECEIVEWAL_DIRECTORY``, ``RECEIVEWAL_SLOT``), so that a systemd unit needs no long
argv and no secret ever appears in one.
"""

from __future__ import annotations

import getpass
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from receivewal.addresses import parse_address
from receivewal.archive.compression import parse_compress_option
from receivewal.daemon.proctitle import scrub_passwords
from receivewal.daemon.settings import Settings
from receivewal.daemon.supervisor import Supervisor, prompt_password
from receivewal.errors import ReceivewalError
from receivewal.logs import configure_logging
from receivewal.replication.connection import build_conninfo, conninfo_options
from receivewal.replication.negotiation import parse_compression_list, with_streampack_option
from receivewal.wal.lsn import parse_lsn


@dataclass(frozen=True)
class StreamOptions:
    """The stream command line as parsed (by click here, by getopt in the drop-in).

    Values are as typed (LSNs, compression lists and -Z still text); :func:`build_settings`
    turns them into :class:`Settings`. Defaults come from Settings, stated once there.
    """

    directory: Path | None = None
    dbname: str | None = None
    host: str | None = None
    port: str | None = None
    username: str | None = None
    no_password: bool = False
    force_password: bool = False
    slot: str | None = None
    create_slot: bool = False
    drop_slot: bool = False
    if_not_exists: bool = False
    reserve_wal: bool = False
    create_slot_if_missing: bool = False
    status_interval: float = Settings.status_interval
    synchronous: bool = False
    no_sync: bool = not Settings.sync
    endpos: str | None = None
    no_loop: bool = Settings.no_loop
    wait_for_server: bool = Settings.wait_for_server
    verbose: int = 0
    compress: str = "none"
    compression: str = ",".join(Settings.compression)
    hot_standby_feedback: bool = Settings.hot_standby_feedback
    receive_timeout: float = Settings.receive_timeout
    reconnect_delay: float = Settings.reconnect_delay
    reconnect_delay_max: float = Settings.reconnect_delay_max
    metrics_address: str | None = None
    log_format: str = "auto"
    progress: bool = False


_DEFAULTS = StreamOptions()


def _env(name: str) -> str:
    return f"RECEIVEWAL_{name}"


@click.command("stream")
@click.option("-D", "--directory", type=click.Path(path_type=Path, file_okay=True),
              envvar=_env("DIRECTORY"),
              help="Receive WAL files into this directory (it must exist).")
@click.option("-d", "--dbname", envvar=_env("DBNAME"), help="Connection string or URI.")
@click.option("-h", "--host", envvar=_env("HOST"), help="Database server host or socket dir.")
@click.option("-p", "--port", envvar=_env("PORT"), help="Database server port.")
@click.option("-U", "--username", envvar=_env("USERNAME"), help="Connect as this user.")
@click.option("-w", "--no-password", is_flag=True, envvar=_env("NO_PASSWORD"),
              help="Never prompt for a password.")
@click.option("-W", "--password", "force_password", is_flag=True,
              help="Prompt for a password before connecting.")
@click.option("-S", "--slot", envvar=_env("SLOT"), help="Replication slot to use.")
@click.option("--create-slot", is_flag=True, help="Create the slot and exit.")
@click.option("--drop-slot", is_flag=True, help="Drop the slot and exit.")
@click.option("--if-not-exists", is_flag=True,
              help="With --create-slot: no error when the slot exists.")
@click.option("--reserve-wal", is_flag=True, envvar=_env("RESERVE_WAL"),
              help="Slots created here reserve WAL at once (restart_lsn is set).")
@click.option("--create-slot-if-missing", is_flag=True, envvar=_env("CREATE_SLOT_IF_MISSING"),
              help="Create the slot (reserving WAL) when the server lacks it.")
@click.option("-s", "--status-interval", type=click.FloatRange(min=0),
              default=_DEFAULTS.status_interval,
              show_default=True, envvar=_env("STATUS_INTERVAL"),
              help="Seconds between status packets to the server (0: only when asked).")
@click.option("--synchronous", is_flag=True, envvar=_env("SYNCHRONOUS"),
              help="Flush WAL to disk and report it after every batch received.")
@click.option("--no-sync", is_flag=True, envvar=_env("NO_SYNC"),
              help="Do not fsync (testing only: a crash can lose or corrupt WAL).")
@click.option("-E", "--endpos", envvar=_env("ENDPOS"), help="Exit 0 once WAL up to this LSN "
              "is received.")
@click.option("-n", "--no-loop", is_flag=True, envvar=_env("NO_LOOP"),
              help="Exit 1 on connection loss instead of reconnecting.")
@click.option("--wait-for-server", is_flag=True, envvar=_env("WAIT_FOR_SERVER"),
              help="Keep trying the first connection (with the reconnect backoff) instead of "
              "exiting 1 as pg_receivewal does; for services.")
@click.option("-v", "--verbose", count=True, help="More log output (debug events).")
@click.option("-Z", "--compress", default=_DEFAULTS.compress, show_default=True,
              envvar=_env("COMPRESS"),
              help="Compress segment files at rest: METHOD[:LEVEL] with METHOD gzip (.gz), "
              "lz4 (.lz4), zstd (.zst) or none; a bare number is a gzip level, as in "
              "pg_receivewal.")
@click.option("--compression", default=_DEFAULTS.compression, show_default=True,
              envvar=_env("COMPRESSION"),
              help="pg_streampack algorithms to request, in order of preference, or none.")
@click.option("--hot-standby-feedback/--no-hot-standby-feedback",
              default=_DEFAULTS.hot_standby_feedback,
              show_default=True, envvar=_env("HOT_STANDBY_FEEDBACK"),
              help="Send hot standby feedback that holds nothing back (clears a slot's xmin).")
@click.option("--receive-timeout", type=click.FloatRange(min=0),
              default=_DEFAULTS.receive_timeout,
              show_default=True, envvar=_env("RECEIVE_TIMEOUT"),
              help="Drop the connection after this many seconds of silence (0: never).")
@click.option("--reconnect-delay", type=click.FloatRange(min=0),
              default=_DEFAULTS.reconnect_delay,
              show_default=True, envvar=_env("RECONNECT_DELAY"),
              help="First pause before reconnecting; doubles up to --reconnect-delay-max.")
@click.option("--reconnect-delay-max", type=click.FloatRange(min=0),
              default=_DEFAULTS.reconnect_delay_max,
              show_default=True, envvar=_env("RECONNECT_DELAY_MAX"),
              help="Longest pause between reconnect attempts, in seconds.")
@click.option("--metrics-address", envvar=_env("METRICS_ADDRESS"),
              help="Serve Prometheus metrics on HOST:PORT.")
@click.option("--log-format", type=click.Choice(["auto", "json", "console"]),
              default=_DEFAULTS.log_format,
              envvar=_env("LOG_FORMAT"), help="auto: JSON unless stderr is a terminal.")
@click.option("--progress", is_flag=True, envvar=_env("PROGRESS"),
              help="Keep a progress line on the terminal (also with -v): received LSN, "
              "server WAL end, MB/s, compression ratio, ETA. Never with JSON logs or off a "
              "terminal.")
def stream_command(**opts: Any) -> int:
    """Stream WAL from a server into DIRECTORY, as pg_receivewal does.

    Every option can also come from the environment as RECEIVEWAL_<LONG_OPTION>, e.g.
    RECEIVEWAL_DIRECTORY, RECEIVEWAL_DBNAME, RECEIVEWAL_SLOT, RECEIVEWAL_SYNCHRONOUS=1 (the
    command line wins); libpq's PGHOST, PGPASSFILE... work as usual. Help is --help or -?:
    -h is the host, as in pg_receivewal.
    """
    options = StreamOptions(**opts)
    if options.verbose:  # -v asks for the progress line too (the drop-in's -v does not)
        options = replace(options, progress=True)
    configure_logging(options.verbose, json=_json_logs(options))
    try:
        settings = build_settings(options)
    except ReceivewalError as exc:
        raise click.UsageError(str(exc)) from exc
    scrub_passwords()  # parsed: ps need not show a password for the daemon's whole life
    prompt = None if options.no_password else prompt_password
    return Supervisor(settings, prompt=prompt).run()


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
    ).validate()
