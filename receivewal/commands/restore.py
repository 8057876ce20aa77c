"""``receivewal restore %f %p``: a restore_command that reads the archive (the command only).

:mod:`receivewal.archive.restore` does the work. Exit status is what recovery understands: 0
when the file was restored, 1 only when the archive does not have it (recovery then ends
cleanly, or a standby goes on to streaming), and 126 for anything else: a damaged archive file
(undecodable, larger than a segment, a complete segment of the wrong size, not a regular
file), an identity file that cannot be trusted, a missing or empty archive directory, a bad
``%f``/``%p``, or any error nobody foresaw. PostgreSQL treats a status above 125 as fatal, so
a problem stops recovery instead of silently ending it early.
On SIGTERM the temporary file is removed and the helper dies of the signal, as PostgreSQL
expects of a restore_command during shutdown.

With ``--partial`` the ``.partial`` of the asked segment that holds the longest valid WAL is
served when no complete file exists, padded with zeros to the segment size as PostgreSQL
expects: recovery then replays to the last byte received. Two ``.partial`` forms that hold
different WAL where both hold some are damage (126), naming both files.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import FrameType
from typing import Any

import click

from receivewal.errors import ReceivewalError

NOT_FOUND = 1
DAMAGED = 126


class _Terminated(BaseException):
    """SIGTERM arrived: unwind (removing the temporary file), then die of the signal."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


class _RestoreCommand(click.Command):
    """A usage error must not read as "not in the archive" (exit 1): it exits 126."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            click.echo(f"receivewal restore: error: {exc.format_message()}", err=True)
            raise click.exceptions.Exit(DAMAGED) from exc


@click.command("restore", cls=_RestoreCommand)
@click.argument("wal_name")
@click.argument("target")
@click.option("-D", "--directory", type=click.Path(file_okay=False),
              envvar="RECEIVEWAL_DIRECTORY", required=True,
              help="The archive directory (receivewal stream's -D; "
              "env RECEIVEWAL_DIRECTORY).")
@click.option("--partial", is_flag=True,
              help="Serve the .partial holding the longest valid WAL of a segment that has "
              "no complete file (recovery to the last byte received).")
def restore_command(wal_name: str, target: str, directory: str, partial: bool) -> int:
    """restore_command helper: copy WAL_NAME (%f) from the archive to TARGET (%p).

    Decompresses .gz, .lz4 and .zst files. Exits 1 only when the archive lacks the file, 126
    when the archive's file is damaged or anything else is wrong (PostgreSQL then stops
    recovery rather than end it early).
    """
    if not directory:  # Path("") would be the current directory
        click.echo("receivewal restore: error: the archive directory (-D) is empty", err=True)
        return DAMAGED
    previous: Any = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        # Imported here, so that a broken installation (a codec that fails to load) is
        # exit 126 as well, not a traceback and exit 1.
        from receivewal.archive.restore import (  # noqa: PLC0415
            NotInArchive,
            restore_file,
        )
        source = restore_file(Path(directory), wal_name, target, partial=partial)
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        raise
    except (ReceivewalError, OSError) as exc:
        if isinstance(exc, NotInArchive):
            click.echo(f"receivewal restore: {exc}", err=True)
            return NOT_FOUND
        click.echo(f"receivewal restore: error: cannot restore {_quoted(wal_name)} from "
                   f"{_quoted(directory)}: {_detail(exc)}", err=True)
        return DAMAGED
    except Exception as exc:  # noqa: BLE001 - anything unforeseen stops recovery (126), as
        # damage does: exit 1 would tell PostgreSQL the file is absent and end recovery early
        click.echo(f"receivewal restore: error: cannot restore {_quoted(wal_name)} from "
                   f"{_quoted(directory)}: unexpected {type(exc).__name__}: {_detail(exc)}",
                   err=True)
        return DAMAGED
    finally:
        signal.signal(signal.SIGTERM, previous)
    click.echo(f'receivewal restore: restored "{wal_name}" from "{source.name}"', err=True)
    return 0


def _quoted(text: str) -> str:
    """``text`` in double quotes, control characters escaped: the message stays one line."""
    return json.dumps(text, ensure_ascii=False)


def _detail(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f'"{exc.filename}": {exc.strerror}' if exc.filename else exc.strerror
    return " ".join(str(exc).split())
