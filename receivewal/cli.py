"""Command line: click parses, each command builds a settings object and hands it over.

Each subcommand lives in the module that owns its work and is registered here.
Errors are printed as one line, ``receivewal: error: ...``, with exit code 1, as
pg_receivewal does.
"""

from __future__ import annotations

import sys

import click

from . import __version__
from .analyze import analyze_command
from .relay import relay_command
from .status import status_command
from .stream import stream_command
from .verify import verify_command


@click.group(context_settings={"help_option_names": ["-?", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="receivewal")
def cli() -> None:
    """Stream and archive PostgreSQL WAL, with pg_streampack compression."""


cli.add_command(stream_command)
cli.add_command(status_command)
cli.add_command(relay_command)
cli.add_command(verify_command)
cli.add_command(analyze_command)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``receivewal`` console script."""
    try:
        rv = cli.main(args=argv, prog_name="receivewal", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("receivewal: error: aborted", err=True)
        return 1
    except click.ClickException as exc:
        click.echo(f"receivewal: error: {exc.format_message()}", err=True)
        return 1
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    return int(rv or 0)


if __name__ == "__main__":
    sys.exit(main())
