"""``receivewal cleanup``: retention (issue 28), in two forms.

``cleanup -D ARCHIVE --keep-backups N | --recovery-window D [--dry-run]`` removes the backups
the policy no longer needs, then the WAL no kept backup and no timeline needs
(:func:`~receivewal.retention.removal.apply_policy`, :mod:`receivewal.retention.plan`), and
prints what it removed and kept and why. What the daemon streaming into the archive holds on
to is read from its state file: the slot's restart position (the WAL from there stays), its
timeline and where it uploads (the files waiting for their upload stay).

``cleanup [-n] [-d] [-x EXT] -D DIR OLDESTKEPTWALFILE`` (or ``cleanup DIR OLDESTKEPTWALFILE``)
is pg_archivecleanup's, for ``archive_cleanup_command``
(:mod:`receivewal.retention.archivecleanup`): silent but for ``-n``'s file paths on standard
output and ``-d``'s lines on standard error, as pg_archivecleanup prints them.

Both refuse a directory that holds no WAL archive (:func:`~receivewal.archive.view.
is_wal_archive`: neither its identity file nor a WAL file), a logical change log's for one, as
a usage error: cleanup would do nothing there and say nothing.

Exit codes: 0 done, 1 an error while reading or removing, 2 a usage error (as
pg_archivecleanup).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import click

from receivewal.archive.identity import IDENTITY_FILE
from receivewal.archive.location import is_bucket_url
from receivewal.archive.view import is_wal_archive
from receivewal.check.sizes import human_bytes
from receivewal.commands import catalog
from receivewal.commands.clickoptions import click_option
from receivewal.commands.retention_options import KEEP_BACKUPS, RECOVERY_WINDOW, policy_of
from receivewal.daemon.settings import SLOT_NAME_RE
from receivewal.daemon.state import State, read_state
from receivewal.errors import ConfigurationError, ForeignArchive, ReceivewalError
from receivewal.logical.store import parse_file_name
from receivewal.retention.archivecleanup import plan_archive_cleanup
from receivewal.retention.plan import Policy, Verdict
from receivewal.retention.policy import policy_from_environment
from receivewal.retention.removal import (
    CleanupReport,
    Holds,
    apply_policy,
    read_server_slot,
    remove_files,
)
from receivewal.wal.lsn import format_lsn
from receivewal.wal.names import RECIPIENTS_SUFFIX

EXIT_CODES = """\b
Exit codes: 0 done; 1 an error while reading or removing; 2 a usage error."""


def daemon_holds(directory: Path) -> Holds:
    """What the daemon streaming into ``directory`` holds on to, as its state file says
    (nothing when there is none); ArchiveError when the state file cannot be read."""
    return _holds_of(read_state(directory))


def _holds_of(state: State | None) -> Holds:
    if state is None:
        return Holds()
    return Holds(state.slot_restart_lsn if state.slot is not None else None, state.timeline,
                 state.upload_to)


def slot_holds(directory: Path, conninfo: str | None, slot: str | None = None,
               say: Callable[[str], None] = lambda _: None) -> Holds:
    """:func:`daemon_holds`, with the slot's restart position as its server reports it now
    when ``conninfo`` is given: the state file has the position the daemon last reported, as
    of its last write, and never learns where the slot went after the daemon stopped (moved
    on, dropped). ``slot`` names it when the state file does not. What the server said, or why
    it was not asked, goes to ``say``; without an answer, the state file's position stays (it
    keeps more WAL, never less). ForeignArchive when the server is another cluster's."""
    state = read_state(directory)
    holds = _holds_of(state)
    name = slot or (state.slot if state is not None else None)
    if conninfo is None and slot is not None:
        say(f'replication slot "{slot}": no connection to ask its server where it restarts '
            "(--dbname)")
    if conninfo is None or name is None:
        return holds
    if not SLOT_NAME_RE.match(name):
        raise ConfigurationError(f'replication slot name "{name}" is invalid: use at most 63 '
                                 "lower case letters, numbers and underscores")
    try:
        found = read_server_slot(conninfo, name, directory)
    except ForeignArchive:
        raise
    except ReceivewalError as exc:
        kept = "the daemon's state file's" if holds.slot_restart is not None else "no"
        say(f'could not read replication slot "{name}" from the server ({exc}): {kept} '
            "position holds WAL")
        return holds
    if not found.exists:
        say(f'replication slot "{name}" does not exist on the server: it holds no WAL')
    elif found.restart is None:
        say(f'replication slot "{name}" reserves no WAL on the server')
    else:
        say(f'replication slot "{name}" restarts at {format_lsn(found.restart)} on the server')
    return replace(holds, slot_restart=found.restart, slot=name)


def after_backup(archive: str | Path, environ: Mapping[str, str] | None = None,
                 policy: Policy | None = None) -> CleanupReport | None:
    """``policy`` (by default the one ``RECEIVEWAL_KEEP_BACKUPS`` or
    ``RECEIVEWAL_RECOVERY_WINDOW`` sets) applied to the archive (a directory, or
    ``s3://BUCKET/PREFIX``): what ``receivewal backup`` runs after a successful backup,
    printing :func:`report_lines`; None when there is no policy. Raises ConfigurationError (a
    bad value, named with its variable) and ArchiveError or StoreError (what could not be read
    or removed)."""
    if policy is None:
        policy = policy_from_environment(os.environ if environ is None else environ,
                                         datetime.now(UTC))
    if policy is None:
        return None
    if is_bucket_url(str(archive)):  # no daemon state: its slot and backlog are elsewhere
        return apply_policy(str(archive), policy)
    directory = Path(archive)
    return apply_policy(directory, policy, daemon_holds(directory))


def report_lines(report: CleanupReport) -> list[str]:
    """What ``cleanup`` prints: each backup, the WAL files in runs of the same verdict, and
    a total."""
    removed = "would remove" if report.dry_run else "removed"
    lines = [f"backup {v.name}: {removed if v.remove else 'kept'}: {v.reason}"
             for v in report.plan.backups]
    lines += [f"{run}: {removed if verdict.remove else 'kept'}: {verdict.reason}"
              for run, verdict in _runs(report.plan.files)]
    backups = len(report.plan.removed_backups)
    total = (f"{removed} {backups} backup{'s' * (backups != 1)} and "
             f"{_wal_files(report.removed_files)} ({human_bytes(report.freed_bytes)})")
    kept_backups = sum(not v.remove for v in report.plan.backups)
    kept_files = _wal_files(v.name for v in report.plan.files if not v.remove)
    lines.append(f"{total}; kept {kept_backups} backup{'s' * (kept_backups != 1)} and "
                 f"{kept_files}" + ("; --dry-run: nothing was removed" if report.dry_run else ""))
    return lines


def _wal_files(names: Iterable[str]) -> str:
    """``N WAL files``, and ``with M recipients files`` when sealed segments' are among
    ``names``."""
    listed = list(names)
    recipients = sum(name.endswith(RECIPIENTS_SUFFIX) for name in listed)
    files = len(listed) - recipients
    return f"{files} WAL file{'s' * (files != 1)}" + (
        f" with {recipients} recipients file{'s' * (recipients != 1)}" if recipients else "")


def _runs(verdicts: Iterable[Verdict]) -> list[tuple[str, Verdict]]:
    """Consecutive verdicts with the same outcome and reason, as ``FIRST .. LAST (N
    files)``."""
    runs: list[list[Verdict]] = []
    for verdict in verdicts:
        if runs and (runs[-1][0].remove, runs[-1][0].reason) == (verdict.remove,
                                                                  verdict.reason):
            runs[-1].append(verdict)
        else:
            runs.append([verdict])
    return [(run[0].name if len(run) == 1 else
             f"{run[0].name} .. {run[-1].name} ({len(run)} files)", run[0]) for run in runs]


def _usage(message: str) -> click.UsageError:
    return click.UsageError(message)


@click.command("cleanup", short_help="Remove backups and WAL a retention policy no longer "
               "needs, or WAL before a file as pg_archivecleanup does.", epilog=EXIT_CODES)
@click.argument("arguments", nargs=-1, metavar="[ARCHIVELOCATION] [OLDESTKEPTWALFILE]")
@click_option(catalog.DIRECTORY.but(
    metavar="ARCHIVE", help=f"The archive directory (env {catalog.DIRECTORY.env})."))
@click_option(KEEP_BACKUPS)
@click_option(RECOVERY_WINDOW)
@click.option("-n", "--dry-run", is_flag=True,
              help="Remove nothing; print what would be removed.")
@click.option("-d", "debug", is_flag=True,
              help="With OLDESTKEPTWALFILE: say on standard error what is removed, as "
              "pg_archivecleanup -d does.")
@click.option("-x", "extension", metavar="EXT", default="",
              help="With OLDESTKEPTWALFILE: clean up files with this extension too, as "
              "pg_archivecleanup -x does (compressed segments are judged anyway).")
@click_option(catalog.DBNAME.long_only(  # -d is pg_archivecleanup's here
    help="With a policy: ask the archive's server where the daemon's replication "
    f"slot restarts now (the state file has where it was; env {catalog.DBNAME.env}, "
    "as stream's -d)."))
@click_option(catalog.HOST.long_only(
    help=f"The server's host, for --dbname (env {catalog.HOST.env})."))
@click_option(catalog.PORT.long_only(
    help=f"The server's port, for --dbname (env {catalog.PORT.env})."))
@click_option(catalog.USERNAME.long_only(
    help=f"Connect as this user, for --dbname (env {catalog.USERNAME.env})."))
@click_option(catalog.SLOT.long_only(
    metavar="NAME", help="The daemon's replication slot, when its state file does not name "
    f"it (env {catalog.SLOT.env}, as stream's -S)."))
def cleanup_command(  # noqa: PLR0917 - click passes each option by position
        arguments: tuple[str, ...], directory: str | None,
                    keep_backups: str | None, recovery_window: str | None, dry_run: bool,
                    debug: bool, extension: str, dbname: str | None, host: str | None,
                    port: str | None, username: str | None, slot: str | None) -> None:
    """Remove the backups a retention policy (--keep-backups N or --recovery-window D) no
    longer needs and the WAL before the oldest kept backup, following the timeline history;
    never a .partial, a history file, WAL the daemon's slot still needs or a file waiting for
    its upload. With OLDESTKEPTWALFILE instead of a policy, remove every segment before it,
    as pg_archivecleanup does (archive_cleanup_command = 'receivewal cleanup -D DIR %r').

    As a drop-in for pg_archivecleanup, cleanup keeps its options: -d is its debug output and
    -n its dry run (in stream they are --dbname and --no-loop); the server's options are
    therefore long only here (--dbname, --host, --port, --username, --slot)."""
    if directory is None and len(arguments) == 2:
        directory, arguments = arguments[0], arguments[1:]
    if not directory:
        raise _usage("give the archive: -D ARCHIVE")
    if is_bucket_url(directory):
        _bucket_cleanup(directory, arguments, keep_backups, recovery_window, dry_run=dry_run)
        return
    path = Path(directory)
    if not path.is_dir():
        raise _usage(f'archive location "{directory}" does not exist')
    if len(arguments) > 1:
        raise _usage(f'too many command-line arguments (first is "{arguments[1]}")')
    _check_wal_archive(path)
    if arguments:
        if keep_backups is not None or recovery_window is not None:
            raise _usage("give either a retention policy or OLDESTKEPTWALFILE, not both")
        _archive_cleanup(path, arguments[0], dry_run=dry_run, debug=debug, extension=extension)
        return
    if debug or extension:
        raise _usage("-d and -x go with OLDESTKEPTWALFILE (pg_archivecleanup's form)")
    policy = policy_of(keep_backups, recovery_window)
    conninfo = _conninfo(dbname, host, port, username)
    if slot is not None and not SLOT_NAME_RE.match(slot):
        raise _usage(f'replication slot name "{slot}" is invalid: use at most 63 lower case '
                     "letters, numbers and underscores")
    try:
        holds = slot_holds(path, conninfo, slot,
                           lambda line: click.echo(f"receivewal: {line}", err=True))
        report = apply_policy(path, policy, holds, dry_run=dry_run)
    except ReceivewalError as exc:
        raise click.ClickException(f"{exc}; cleanup stopped there") from exc
    click.echo("\n".join(report_lines(report)))


def _check_wal_archive(path: Path) -> None:
    """A usage error when the directory holds no WAL archive (a logical change log's, an
    empty one, anything else), where cleanup would do nothing and say nothing."""
    try:
        names = os.listdir(path)
    except OSError as exc:
        raise click.ClickException(f'could not open archive location "{path}": '
                                   f"{exc.strerror or exc}") from exc
    if is_wal_archive(names):
        return
    if any(parse_file_name(name) is not None for name in names):
        what = ("is a logical change log directory; a change log's retention is the daemon's: "
                "receivewal logical --upload-to s3://BUCKET/PREFIX --keep-local AGE|SIZE")
    else:
        what = f"holds neither the archive's identity file ({IDENTITY_FILE}) nor WAL files"
    raise _usage(f'"{path}" is not a WAL archive: it {what}')


def _conninfo(dbname: str | None, host: str | None, port: str | None,
              username: str | None) -> str | None:
    """The replication connection string the options make; None when none is given."""
    if dbname is None and host is None and port is None and username is None:
        return None
    from receivewal.replication.connection import build_conninfo  # noqa: PLC0415 - psycopg

    try:
        return build_conninfo(dbname, host=host, port=port, user=username)
    except ConfigurationError as exc:
        raise _usage(str(exc)) from exc


def _bucket_cleanup(url: str, arguments: tuple[str, ...], keep_backups: str | None,
                    recovery_window: str | None, *, dry_run: bool) -> None:
    """The policy form on an archive in a bucket."""
    if arguments:
        raise _usage(f"{url}: OLDESTKEPTWALFILE goes with an archive directory; give a bucket "
                     "a retention policy")
    policy = policy_of(keep_backups, recovery_window)
    try:
        report = apply_policy(url, policy, dry_run=dry_run)
    except ReceivewalError as exc:
        raise click.ClickException(f"{exc}; cleanup stopped there") from exc
    click.echo("\n".join(report_lines(report)))


def _archive_cleanup(path: Path, argument: str, *, dry_run: bool, debug: bool,
                     extension: str) -> None:
    """pg_archivecleanup's form: what it removes, how it says so."""
    try:
        names = sorted(os.listdir(path))
        verdicts = plan_archive_cleanup(names, argument, extension)
    except ConfigurationError as exc:
        raise _usage(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(f'could not open archive location "{path}": '
                                   f"{exc.strerror or exc}") from exc
    if debug:
        click.echo(f'receivewal: keeping WAL file "{path / argument}" and later', err=True)
    removed = [verdict.name for verdict in verdicts if verdict.remove]
    for name in removed:
        if dry_run:
            click.echo(str(path / name))
        if debug:
            what = "would be removed" if dry_run else "is removed"
            click.echo(f'receivewal: file "{path / name}" {what}', err=True)
    if not dry_run:
        try:
            remove_files(path, removed)
        except ReceivewalError as exc:
            raise click.ClickException(str(exc)) from exc
