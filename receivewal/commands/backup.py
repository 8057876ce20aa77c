"""``receivewal backup``: click parses, :mod:`receivewal.backup.taking` does the work.

The options a ``stream`` has too read the same ``RECEIVEWAL_*`` variables (the archive, the
connection), so a systemd unit of both shares one environment file. What the backup needs only
after it is complete, ``cleanup``'s retention, is imported then, and only with a policy; the
logging library only with ``--log-format json``.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING

import click

from receivewal.archive.compression import NO_COMPRESSION, CompressSpec, parse_compress_option
from receivewal.archive.objectstore import StoreWaitEnded, stop_store_calls
from receivewal.backup.command import (
    MAX_RATE_LOWER,
    MAX_RATE_UPPER,
    BackupRequest,
    base_backup_command,
)
from receivewal.backup.record import BackupRecord
from receivewal.backup.taking import BackupSettings, run_backup
from receivewal.commands import catalog
from receivewal.commands.clickoptions import click_option
from receivewal.commands.options import encrypt_to_recipients, prompt_password, read_password
from receivewal.commands.retention_options import policy_after_backup, retention_options
from receivewal.commands.verify import named_archive
from receivewal.commands.watching import Watch
from receivewal.errors import ConfigurationError, ReceivewalError
from receivewal.replication.connection import build_conninfo
from receivewal.wal.lsn import format_lsn

if TYPE_CHECKING:
    from receivewal.retention.plan import Policy

_OWN_DIRECTORY_ENV = "RECEIVEWAL_BACKUP_DIRECTORY"  # read before -D's own variable


def _compress(ctx: click.Context, param: click.Parameter, value: str) -> CompressSpec:
    """``--compress METHOD[:LEVEL]``, as -Z takes it, the method named (none: stored as
    sent)."""
    try:
        return parse_compress_option(value, named=True)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from exc


def _max_rate(ctx: click.Context, param: click.Parameter, value: str | None) -> int:
    """``--max-rate``: kB/s, or with a k or M suffix, as pg_basebackup's -r."""
    if not value:
        return 0
    number, factor = value, 1
    if value[-1] in "kM":
        number, factor = value[:-1], 1024 if value[-1] == "M" else 1
    if not number.isdigit() or not MAX_RATE_LOWER <= int(number) * factor <= MAX_RATE_UPPER:
        raise click.BadParameter(f"{value!r}: a transfer rate from {MAX_RATE_LOWER}k to "
                                 f"{MAX_RATE_UPPER // 1024}M (kB/s)", ctx=ctx, param=param)
    return int(number) * factor


def describe(record: BackupRecord, where: str) -> str:
    """What a complete backup says."""
    return (f"backup {record.backup_id} complete: {where}\n"
            f"  WAL from {format_lsn(record.start_lsn)} (timeline {record.timeline}) to "
            f"{format_lsn(record.end_lsn)} (timeline {record.end_timeline}), "
            f"{len(record.wal_segments())} segments, all in the archive\n"
            f"  {record.database_bytes} bytes of database in {record.stored_bytes} bytes "
            f"stored ({', '.join(a.name for a in record.archives)})"
            + (f"\n  sealed to {', '.join(record.encrypted_to)}" if record.encrypted_to else ""))


@click.command("backup")
@click_option(
    catalog.DIRECTORY.but(
        dest="archive", required=True,
        help="The WAL archive the backup goes into: a directory (stream's -D) or "
        f"s3://BUCKET/PREFIX (env {_OWN_DIRECTORY_ENV}, else {catalog.DIRECTORY.env})."),
    envvar=[_OWN_DIRECTORY_ENV, catalog.DIRECTORY.env], callback=named_archive)
@click_option(catalog.DBNAME.but(help=f"Connection string (env {catalog.DBNAME.env})."))
@click_option(catalog.HOST.but(
    help=f"Database server host or socket directory (env {catalog.HOST.env})."))
@click_option(catalog.PORT.but(help=f"Database server port (env {catalog.PORT.env})."))
@click_option(catalog.USERNAME.but(help=f"Connect as this user (env {catalog.USERNAME.env})."))
@click.option("-l", "--label", default="receivewal base backup", show_default=True,
              help="The backup's label.")
@click.option("--fast", is_flag=True, help="Ask for an immediate checkpoint (default: spread).")
@click.option("-r", "--max-rate", callback=_max_rate, metavar="RATE",
              envvar="RECEIVEWAL_BACKUP_MAX_RATE",
              help="The server sends at most this many kB/s (k or M suffix as pg_basebackup; "
              "env RECEIVEWAL_BACKUP_MAX_RATE).")
@click_option(catalog.COMPRESS.long_only(
    env="RECEIVEWAL_BACKUP_COMPRESS",
    help="How the tars are stored: zstd, lz4, gzip or none (by the server with "
    "--server-compress; env RECEIVEWAL_BACKUP_COMPRESS)."),
    default="zstd", show_default=True, callback=_compress)
@click.option("--server-compress", is_flag=True,
              help="The server compresses (BASE_BACKUP's COMPRESSION): less on the network, "
              "more of the server's CPU; stored as sent.")
@click.option("--wal-wait", type=click.FloatRange(min=0), default=60.0, show_default=True,
              envvar="RECEIVEWAL_WAL_WAIT", metavar="SECONDS",
              help="How long to wait for the archive to hold the backup's WAL, which the "
              "stream daemon archives, before giving the backup up (env RECEIVEWAL_WAL_WAIT).")
@click_option(catalog.ENCRYPT_TO.but(
    help="Seal each stored tar and the manifest to this age X25519 recipient "
    "(age1..., age-keygen's public key), as stream's --encrypt-to; repeatable: any "
    f"of the recipients decrypts (env {catalog.ENCRYPT_TO.env}, whitespace between them). "
    "recover and verify then need --identity."), multiple=True)
@click_option(catalog.PROGRESS, default=None)
@click_option(catalog.LOG_FORMAT.but(
    help="json: what backup says on stderr as JSON events, one a line, for a "
    "journal or a log shipper; auto: JSON unless stderr is a terminal (env "
    f"{catalog.LOG_FORMAT.env})."),
    type=click.Choice(["console", "json", "auto"]), default="console", show_default=True)
@click_option(catalog.NO_SYNC.but(help="Do not fsync (tests only)."))
@click_option(catalog.NO_PASSWORD)
@click_option(catalog.PASSWORD)
@retention_options
def backup_command(*, archive: str, dbname: str | None, host: str | None, port: str | None,
                   username: str | None, label: str, fast: bool, max_rate: int,
                   compress: CompressSpec, server_compress: bool, wal_wait: float,
                   encrypt_to: tuple[str, ...], no_sync: bool, keep_backups: str | None,
                   recovery_window: str | None, no_password: bool, force_password: bool,
                   progress: bool | None, log_format: str) -> None:
    """Take a base backup over the replication protocol into the WAL archive (complete only
    once the archive holds its WAL from start to end)."""
    if server_compress and not compress.method:
        raise click.UsageError("--server-compress needs a method: --compress zstd, lz4 or gzip")
    policy = policy_after_backup(keep_backups, recovery_window)  # a bad value: before the backup
    password = read_password() if force_password and not no_password else None
    try:
        conninfo = build_conninfo(dbname, host=host, port=port, user=username,
                                  password=password)
        request = BackupRequest(label=label, fast=fast, max_rate=max_rate,
                                server_compression=compress if server_compress else None)
        base_backup_command(request)  # a label or rate the server would refuse: now
        settings = BackupSettings(archive, conninfo, request,
                                  NO_COMPRESSION if server_compress else compress,
                                  wal_wait=wal_wait, sync=not no_sync,
                                  encrypt_to=encrypt_to_recipients(encrypt_to))
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    stop: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        """The stop is looked at between messages and while the backup waits for its WAL; a
        wait on the object store is ended at once (the store's calls are hurried from now on,
        so that giving the upload up takes seconds, not the store's timeouts)."""
        stop.append(signum)
        waiting = stop_store_calls()
        if waiting is not None:
            raise StoreWaitEnded(f"base backup stopped by {signal.Signals(signum).name} while "
                                 f"it waited for {waiting}")

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    log = None
    if log_format == "json" or (log_format == "auto" and not sys.stderr.isatty()):
        from receivewal.logs import configure_logging, get_logger  # noqa: PLC0415 - structlog

        configure_logging(json=True)
        log = get_logger()
    watch = Watch("backup", "received", log=log)
    if progress is None:
        progress = watch.terminal

    def say(line: str) -> None:
        if log is not None:
            log.info("backup_said", message=line)
        else:
            watch.say(f"receivewal: {line}")

    try:
        record, where = run_backup(settings, stopping=lambda: bool(stop),
                                   prompt=None if no_password else prompt_password,
                                   say=say, watch=watch if progress else None)
    except ReceivewalError as exc:
        watch.clear()
        raise click.ClickException(str(exc)) from exc
    moved = watch.finish()
    if progress:
        say(f"received {moved}")
    click.echo(describe(record, where))
    sys.stdout.flush()
    if policy is not None:
        _retention_after(archive, policy)


def _retention_after(archive: str, policy: Policy) -> None:
    """The policy applied once the backup is complete, and cleanup's lines printed."""
    # cleanup's removal, the archive's view and the daemon's state file: only with a policy
    from receivewal.commands.cleanup import after_backup, report_lines  # noqa: PLC0415

    try:
        report = after_backup(archive, policy=policy)
    except ReceivewalError as exc:
        raise click.ClickException(f"the backup is complete; the retention policy after it "
                                   f"failed: {exc}") from exc
    if report is not None:
        for line in report_lines(report):
            click.echo(line)
