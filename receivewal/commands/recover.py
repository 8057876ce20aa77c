"""``receivewal recover``: click parses, :mod:`receivewal.recovery.recovering` does the work."""

from __future__ import annotations

import os
import shlex
import shutil
import site
import sys
from pathlib import Path

import click

import receivewal
from receivewal.commands import catalog
from receivewal.commands.clickoptions import click_option
from receivewal.commands.verify import named_archive
from receivewal.commands.watching import Watch
from receivewal.errors import ConfigurationError, ReceivewalError
from receivewal.recovery.choice import (
    RecoveryTarget,
    TargetKind,
    lsn_target,
    name_target,
    time_target,
    xid_target,
)
from receivewal.recovery.owner import choose_owner
from receivewal.recovery.recovering import LATEST, RecoverSettings, run_recover
from receivewal.recovery.recoveryconf import ACTIONS, parse_extra_setting, quote_setting
from receivewal.wal.lsn import format_lsn


def default_restore_prefix() -> str:
    """How the server runs the receivewal that is running now, not whichever ``receivewal``
    comes first on PATH (another installation, another version): the program itself when it
    was started as one (a console script, the .deb's ``/usr/bin/receivewal``: ``sys.argv[0]``
    resolved), else, under ``python -m receivewal``, this Python with ``-m receivewal`` and,
    when the package does not come from that Python's own site directories (a checkout, a
    ``PYTHONPATH``), ``PYTHONPATH`` naming where it does come from."""
    program = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if program is not None and program.name != "__main__.py" and program.suffix != ".py":
        found = shutil.which(str(program)) if program.parent == Path() else str(program)
        if found is not None and os.access(found, os.X_OK):
            return f"{shlex.quote(str(Path(found).resolve()))} restore"
    command = f"{shlex.quote(str(Path(sys.executable).absolute()))} -m receivewal restore"
    root = Path(receivewal.__file__).resolve().parent.parent
    own = {Path(p).resolve() for p in (*site.getsitepackages(), site.getusersitepackages())}
    if root not in own:
        command = f"PYTHONPATH={shlex.quote(str(root))} {command}"
    return command


def _mapping(ctx: click.Context, param: click.Parameter, values: tuple[str, ...],
             ) -> dict[str, str]:
    found = {}
    for value in values:
        old, sep, new = value.partition("=")
        if not sep or not old or not new or not Path(old).is_absolute() \
                or not Path(new).is_absolute():
            raise click.BadParameter(f"{value!r} is not OLDDIR=NEWDIR with both absolute",
                                     ctx=ctx, param=param)
        found[old] = new
    return found


def _extra_settings(ctx: click.Context, param: click.Parameter, values: tuple[str, ...],
                    ) -> tuple[tuple[str, str], ...]:
    try:
        return tuple(parse_extra_setting(value) for value in values)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from exc


def read_target(time: str | None, lsn: str | None, xid: str | None, name: str | None, *,
                immediate: bool, timeline: int | None) -> RecoveryTarget:
    """The one target the options name (none: the end of the archive)."""
    given = [(text, parse) for text, parse in ((time, time_target), (lsn, lsn_target),
                                               (xid, xid_target), (name, name_target))
             if text is not None]
    if len(given) + immediate > 1:
        raise click.UsageError("give at most one of --target-time, --target-lsn, "
                               "--target-xid, --target-name and --target-immediate")
    try:
        target = given[0][1](given[0][0]) if given else \
            RecoveryTarget(TargetKind.IMMEDIATE if immediate else TargetKind.LATEST)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    return RecoveryTarget(target.kind, target.time, target.lsn, target.xid, target.name,
                          timeline)


@click.command("recover")
@click.argument("backup_id", metavar="[BACKUP-ID|latest]", default=LATEST)
@click.option("--to", "pgdata", required=True, type=click.Path(path_type=Path),
              metavar="PGDATA", help="The new data directory: missing or empty.")
@click_option(catalog.DIRECTORY.but(dest="archive", required=True), callback=named_archive)
@click.option("--target-time", metavar="TIME",
              help="Recover to this time (ISO 8601 with its zone, e.g. 2026-06-01 10:00:00+00).")
@click.option("--target-lsn", metavar="LSN", help="Recover to this LSN.")
@click.option("--target-xid", metavar="XID", help="Recover to this transaction's commit.")
@click.option("--target-name", metavar="NAME", help="Recover to this restore point.")
@click.option("--target-immediate", is_flag=True,
              help="Stop as soon as the backup is consistent.")
@click.option("--target-timeline", type=click.IntRange(min=1),
              help="Follow this timeline (default: the newest the archive knows).")
@click.option("--target-action", type=click.Choice(ACTIONS), default="promote",
              show_default=True, help="What the server does at the target.")
@click.option("-T", "--tablespace-mapping", "mapping", multiple=True, callback=_mapping,
              metavar="OLDDIR=NEWDIR", help="Unpack the tablespace at OLDDIR into NEWDIR.")
@click.option("--restore-command-prefix", envvar="RECEIVEWAL_RESTORE_COMMAND_PREFIX",
              metavar="COMMAND",
              help="How the server runs 'receivewal restore' (default: this receivewal's "
              "path; env RECEIVEWAL_RESTORE_COMMAND_PREFIX).")
@click_option(catalog.IDENTITY.but(
    help="age identity file (age-keygen's) that decrypts a backup sealed with "
    "backup --encrypt-to; the restore_command written passes it on (absolute), so "
    f"an encrypted WAL archive is read too (env {catalog.IDENTITY.env})."))
@click.option("--target-beyond-archive", "beyond_archive", is_flag=True,
              help="Accept a --target-time after the archive's last commit (the WAL up to it "
              "will reach the archive before the server replays it); refused otherwise, as "
              "PostgreSQL would end with FATAL at the archive's end.")
@click.option("--owner", metavar="USER", envvar="RECEIVEWAL_RECOVER_OWNER",
              help="The server's user, who gets every file written and must be able to read "
              "the archive and run the restore_command (checked before anything is written; "
              "default as root: the owner of PGDATA's parent directory; env "
              "RECEIVEWAL_RECOVER_OWNER).")
@click.option("--setting", "extra", multiple=True, metavar="NAME=VALUE",
              callback=_extra_settings,
              help="Add NAME = 'VALUE' to the recovery settings in postgresql.auto.conf "
              "(e.g. --setting port=5433), as pgBackRest's --recovery-option; repeatable. "
              "restore_command and recovery_target* are recover's own.")
@click_option(catalog.PROGRESS.but(
    help="Show the bytes unpacked of the backup's size and the rate (default: on a "
    "terminal; off one, a line every 10 s)."), default=None)
@click_option(catalog.NO_SYNC.but(help="Do not fsync (tests only)."))
def recover_command(*, backup_id: str, pgdata: Path, archive: str, target_time: str | None,
                    target_lsn: str | None, target_xid: str | None, target_name: str | None,
                    target_immediate: bool, target_timeline: int | None, target_action: str,
                    mapping: dict[str, str], restore_command_prefix: str | None,
                    identity: str | None, beyond_archive: bool, no_sync: bool,
                    progress: bool | None, owner: str | None,
                    extra: tuple[tuple[str, str], ...]) -> None:
    """Unpack a base backup into an empty PGDATA and set it up to recover from the archive
    (to a target, or to the archive's end); prints how to start the server."""
    watch = Watch("recover", "unpacked")
    try:
        files_owner = choose_owner(owner or None, pgdata.absolute())
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    target = read_target(target_time, target_lsn, target_xid, target_name,
                         immediate=target_immediate, timeline=target_timeline)
    settings = RecoverSettings(
        archive, pgdata.absolute(), backup_id, target, target_action, mapping,
        restore_command_prefix or default_restore_prefix(), sync=not no_sync,
        identity=identity or None, beyond_archive=beyond_archive,
        on_progress=watch.update if (watch.terminal if progress is None else progress)
        else None, on_backup=lambda record: watch.estimate(record.database_bytes),
        owner=files_owner, owner_given=bool(owner), extra=extra)
    try:
        done = run_recover(settings)
    except ReceivewalError as exc:
        watch.clear()
        raise click.ClickException(str(exc)) from exc
    watch.done = done.unpacked.bytes
    moved = watch.finish()
    record, unpacked = done.record, done.unpacked
    click.echo(f"backup {record.backup_id} (WAL from {format_lsn(record.start_lsn)} to "
               f"{format_lsn(record.end_lsn)}, ended {record.end_time.isoformat()}) unpacked: "
               f"{unpacked.files} files, {unpacked.bytes} bytes ({moved})")
    click.echo(f"recovery target: {target.describe()}"
               + (f", then {target_action}" if target.kind is not TargetKind.LATEST else ""))
    if files_owner is not None:
        click.echo(f"owned by {files_owner.name}: every file and directory written")
    for name, value in extra:
        click.echo(f"added to the recovery settings: {name} = {quote_setting(value)}")
    for line in done.config.removed:
        click.echo(f"removed from postgresql.auto.conf (the backup's): {line}")
    for line in done.config.overridden:
        click.echo(f"overridden by recover's settings in postgresql.auto.conf: {line}")
    click.echo(done.text)
