"""``receivewal restore %f %p``: a restore_command that reads the archive (the click command).

A call as PostgreSQL makes it never reaches this module: :mod:`receivewal.commands.cli` hands
it to :func:`receivewal.commands.restore_options.parse` before click is imported, and
:mod:`receivewal.restore.call` holds the behaviour (exit statuses, the bucket, the prefetch
spool). This command is built from the same declaration of the options
(:data:`~receivewal.commands.restore_options.OPTIONS`): it owns their help and every command
line the lean path does not take, and a usage error exits 126, never 1 (which would tell
PostgreSQL the file is absent and end recovery early).

With ``--partial`` the ``.partial`` of the asked segment that holds the longest valid WAL is
served when no complete file exists, padded with zeros to the segment size as PostgreSQL
expects: recovery then replays to the last byte received. Two ``.partial`` forms that hold
different WAL where both hold some are damage (126), naming both files.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from receivewal.commands.clickoptions import click_option
from receivewal.commands.plain import COUNT, FLAG, KEYFILE, PATH, Option
from receivewal.commands.restore_options import ARGUMENTS, OPTIONS
from receivewal.restore.call import DAMAGED, Call, run


class _RestoreCommand(click.Command):
    """A usage error must not read as "not in the archive" (exit 1): it exits 126."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            click.echo(f"receivewal restore: error: {exc.format_message()}", err=True)
            raise click.exceptions.Exit(DAMAGED) from exc


def _click_option(option: Option) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """The click option of a declared one."""
    kinds: dict[str, dict[str, Any]] = {
        PATH: {"type": click.Path(file_okay=False)},
        FLAG: {},
        COUNT: {"type": click.IntRange(0, option.maximum), "default": None},
        KEYFILE: {"type": click.Path(dir_okay=False)},
    }
    return click_option(option, **kinds[option.kind])


def declared(command: Callable[..., int]) -> Callable[..., int]:
    """``command`` with restore's arguments and options, in their declared order."""
    for option in reversed(OPTIONS):
        command = _click_option(option)(command)
    for argument in reversed(ARGUMENTS):
        command = click.argument(argument)(command)
    return command


@click.command("restore", cls=_RestoreCommand)
@declared
def restore_command(**params: Any) -> int:
    """restore_command helper: copy WAL_NAME (%f) from the archive to TARGET (%p).

    Decompresses .gz, .lz4 and .zst files. Exits 1 only when the archive lacks the file, 126
    when the archive's file is damaged, the store cannot be reached, or anything else is wrong
    (PostgreSQL then stops recovery rather than end it early).
    """
    return run(Call(**params))
