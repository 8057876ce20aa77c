"""``receivewal verify -D DIR`` (or ``s3://BUCKET/PREFIX``; the archive may also be the
argument, as scripts gave it before ``-D``): click parses,
:mod:`receivewal.check.verify` does the work.

Exit code 0 only when the archive is recoverable end to end; 1 when it is not, or cannot be
read (printed as one line); 2 (:data:`~receivewal.commands.output.NOT_A_VERDICT`) for a usage
error or a report that cannot be written; 3 (:data:`~receivewal.commands.output.VERDICT_UNKNOWN`)
when sealed files could not be checked without a key and nothing else is wrong. A plain
command line does not come here: the console script runs it through
:mod:`receivewal.commands.verify_call` without importing click, and the two paths share
:func:`~receivewal.commands.verify_call.verify_text`; this command owns the options' help and
the usage errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from receivewal.commands import catalog
from receivewal.commands.clickoptions import click_option
from receivewal.commands.output import deliver
from receivewal.commands.plain import COUNT, FLAG, KEYFILE, PATH
from receivewal.commands.verify_call import LSN, OPTIONS, start_lsn, verify_text
from receivewal.errors import ArchiveError, ConfigurationError, StoreError

EXIT_CODES = """\b
Exit codes: 0 recoverable end to end; 1 NOT recoverable, or the archive cannot be read;
2 a usage error, or the report could not be written; 3 unknown: files sealed at rest
could not be checked without --identity."""


#: What the archive argument is called in the usage line and its errors.
ARCHIVE = "DIR-OR-S3-URL"


def named_archive(ctx: click.Context, param: click.Parameter, value: str | None,
                  ) -> str | None:
    """An archive argument that names something: an empty one would read as the current
    directory (not given: None)."""
    if value is not None and not value:
        raise click.BadParameter("an empty name names no archive: give a directory (. for the "
                                 "current one) or s3://BUCKET/PREFIX", ctx=ctx, param=param)
    return value


def archive_named(ctx: click.Context, archive: str | None, directory: str | None) -> str:
    """The archive to verify: ``-D`` (or its variable) or the argument, as scripts give it; a
    usage error when neither names one, or when ``-D`` and the argument name two (the
    argument wins over the variable)."""
    given = ctx.get_parameter_source("directory") is not click.core.ParameterSource.ENVIRONMENT
    if archive and directory and given and archive != directory:
        raise click.UsageError(f"-D {directory!r} and the argument {archive!r} name two "
                               "archives: give one (-D DIR-OR-S3-URL)", ctx)
    where = archive or directory
    if not where:
        raise click.UsageError("give the archive: -D DIR-OR-S3-URL (or "
                               f"{catalog.DIRECTORY.env})", ctx)
    return where


def _archive_argument(ctx: click.Context, param: click.Parameter, value: str | None,
                      ) -> str | None:
    """:func:`named_archive` for the argument, named in an error as it was when it was
    required (``'DIR-OR-S3-URL'``, not its usage line's ``[DIR-OR-S3-URL]``)."""
    try:
        return named_archive(ctx, param, value)
    except click.BadParameter as exc:
        exc.param_hint = f"'{ARCHIVE}'"
        raise


def _lsn_or_nothing(ctx: click.Context, param: click.Parameter, value: str | None,
                    ) -> str | None:
    try:
        start_lsn(value)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from exc
    return value


#: How click reads a value of each kind verify_call.OPTIONS declares.
_CLICK_KINDS: dict[str, dict[str, Any]] = {
    FLAG: {},
    COUNT: {"type": click.IntRange(min=1), "default": None},
    LSN: {"default": None, "callback": _lsn_or_nothing},
    KEYFILE: {"type": click.Path(dir_okay=False), "default": None},
    PATH: {"default": None, "callback": named_archive},
}


def declared_click_options(command: Callable[..., None]) -> Callable[..., None]:
    """Decorate ``command`` with verify's options as :data:`verify_call.OPTIONS` declares
    them, in their order."""
    for option in reversed(OPTIONS):
        command = click_option(option, **_CLICK_KINDS[option.kind])(command)
    return command


@click.command("verify", epilog=EXIT_CODES)
@click.argument("archive", metavar=f"[{ARCHIVE}]", required=False,
                callback=_archive_argument)
@declared_click_options
@click.pass_context
def verify_command(ctx: click.Context, archive: str | None, *, directory: str | None,
                   as_json: bool, jobs: int | None, start: str | None, compressibility: bool,
                   identity: str | None) -> None:
    """Check every page, record and CRC of a WAL archive (a directory, or s3://BUCKET/PREFIX
    listed once and read object by object); exit 0 only if it is recoverable."""
    where = archive_named(ctx, archive, directory)
    try:
        text, status = verify_text(where, as_json=as_json, jobs=jobs, start=start,
                                   compressibility=compressibility, identity=identity)
    except (ArchiveError, ConfigurationError, StoreError) as exc:
        raise click.ClickException(str(exc)) from exc
    status = deliver(lambda: click.echo(text), status)
    if status:
        raise click.exceptions.Exit(status)
