"""``receivewal verify DIR`` (or ``s3://BUCKET/PREFIX``): click parses,
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

from receivewal.commands.clickoptions import click_option
from receivewal.commands.output import deliver
from receivewal.commands.plain import COUNT, FLAG, KEYFILE
from receivewal.commands.verify_call import LSN, OPTIONS, start_lsn, verify_text
from receivewal.errors import ArchiveError, ConfigurationError, StoreError

EXIT_CODES = """\b
Exit codes: 0 recoverable end to end; 1 NOT recoverable, or the archive cannot be read;
2 a usage error, or the report could not be written; 3 unknown: files sealed at rest
could not be checked without --identity."""


def named_archive(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """An archive argument that names something: an empty one would read as the current
    directory."""
    if not value:
        raise click.BadParameter("an empty name names no archive: give a directory (. for the "
                                 "current one) or s3://BUCKET/PREFIX", ctx=ctx, param=param)
    return value


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
}


def declared_click_options(command: Callable[..., None]) -> Callable[..., None]:
    """Decorate ``command`` with verify's options as :data:`verify_call.OPTIONS` declares
    them, in their order."""
    for option in reversed(OPTIONS):
        command = click_option(option, **_CLICK_KINDS[option.kind])(command)
    return command


@click.command("verify", epilog=EXIT_CODES)
@click.argument("archive", metavar="DIR-OR-S3-URL", callback=named_archive)
@declared_click_options
def verify_command(archive: str, *, as_json: bool, jobs: int | None, start: str | None,
                   compressibility: bool, identity: str | None) -> None:
    """Check every page, record and CRC of a WAL archive (a directory, or s3://BUCKET/PREFIX
    listed once and read object by object); exit 0 only if it is recoverable."""
    try:
        text, status = verify_text(archive, as_json=as_json, jobs=jobs, start=start,
                                   compressibility=compressibility, identity=identity)
    except (ArchiveError, ConfigurationError, StoreError) as exc:
        raise click.ClickException(str(exc)) from exc
    status = deliver(lambda: click.echo(text), status)
    if status:
        raise click.exceptions.Exit(status)
