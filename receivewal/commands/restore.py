"""``receivewal restore %f %p``: a restore_command that reads the archive (the click command).

A call as PostgreSQL makes it never reaches this module: :mod:`receivewal.commands.cli` hands
it to :mod:`receivewal.restore.call` before click is imported, and that module holds
the behaviour (exit statuses, the bucket, the prefetch spool). This command owns the options'
help and every command line the lean path does not take: a usage error exits 126, never 1
(which would tell PostgreSQL the file is absent and end recovery early).

With ``--partial`` the ``.partial`` of the asked segment that holds the longest valid WAL is
served when no complete file exists, padded with zeros to the segment size as PostgreSQL
expects: recovery then replays to the last byte received. Two ``.partial`` forms that hold
different WAL where both hold some are damage (126), naming both files.
"""

from __future__ import annotations

import click

from receivewal.restore.call import DAMAGED, Call, run


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
              help="The archive: a directory (receivewal stream's -D) or s3://BUCKET/PREFIX "
              "(env RECEIVEWAL_DIRECTORY).")
@click.option("--partial", is_flag=True,
              help="Serve the .partial holding the longest valid WAL of a segment that has "
              "no complete file (recovery to the last byte received).")
@click.option("--prefetch", type=click.IntRange(0, 64), envvar="RECEIVEWAL_PREFETCH",
              default=None, metavar="N",
              help="Fetch the next N segments into pg_wal/.receivewal/prefetch in the "
              "background, so that later calls are a rename (default 8; env "
              "RECEIVEWAL_PREFETCH).")
def restore_command(wal_name: str, target: str, directory: str, partial: bool,
                    prefetch: int | None) -> int:
    """restore_command helper: copy WAL_NAME (%f) from the archive to TARGET (%p).

    Decompresses .gz, .lz4 and .zst files. Exits 1 only when the archive lacks the file, 126
    when the archive's file is damaged, the store cannot be reached, or anything else is wrong
    (PostgreSQL then stops recovery rather than end it early).
    """
    return run(Call(wal_name, target, directory, partial, prefetch))
