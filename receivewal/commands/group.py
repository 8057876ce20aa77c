"""The click command group: click parses, each command builds a settings object and hands it
over.

Each subcommand lives in the module that owns its work and is registered here.
Errors are printed as one line, ``receivewal: error: ...``, with exit code 1, as
pg_receivewal does; a usage error of ``verify`` or ``analyze``, whose 1 is the verdict "NOT
recoverable", exits 2 (:data:`USAGE_STATUS`). The console script enters through
:mod:`receivewal.commands.cli`, which hands a plain ``restore`` call over before click is
imported.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import click

from receivewal import __version__
from receivewal.commands.output import NOT_A_VERDICT
from receivewal.errors import ConfigurationError
from receivewal.secrets import redacted

# Each command's module is imported when that command runs, not with the group: importing all
# ten loads ~80 modules more than stream's own (the backup, check, relay and logical layers),
# about doubling stream's start-up, which issue 36 holds to 50 ms. The imports are written
# out (inside functions, not as strings) so that mypy and tests/test_layout.py see them.


def _stream() -> click.Command:
    from receivewal.commands.stream import stream_command  # noqa: PLC0415 - see above

    return stream_command


def _logical() -> click.Command:
    from receivewal.commands.logical import logical_command  # noqa: PLC0415

    return logical_command


def _status() -> click.Command:
    from receivewal.commands.status import status_command  # noqa: PLC0415

    return status_command


def _relay() -> click.Command:
    from receivewal.commands.relay import relay_command  # noqa: PLC0415

    return relay_command


def _verify() -> click.Command:
    from receivewal.commands.verify import verify_command  # noqa: PLC0415

    return verify_command


def _analyze() -> click.Command:
    from receivewal.commands.analyze import analyze_command  # noqa: PLC0415

    return analyze_command


def _restore() -> click.Command:
    from receivewal.commands.restore import restore_command  # noqa: PLC0415

    return restore_command


def _backup() -> click.Command:
    from receivewal.commands.backup import backup_command  # noqa: PLC0415

    return backup_command


def _recover() -> click.Command:
    from receivewal.commands.recover import recover_command  # noqa: PLC0415

    return recover_command


def _backups() -> click.Command:
    from receivewal.commands.backups import backups_command  # noqa: PLC0415

    return backups_command


def _apply() -> click.Command:
    from receivewal.commands.apply import apply_command  # noqa: PLC0415

    return apply_command


def _cleanup() -> click.Command:
    from receivewal.commands.cleanup import cleanup_command  # noqa: PLC0415

    return cleanup_command


#: Subcommands and what loads each, on first use.
LAZY_COMMANDS: dict[str, Callable[[], click.Command]] = {
    "stream": _stream, "logical": _logical, "status": _status, "relay": _relay,
    "verify": _verify, "analyze": _analyze, "restore": _restore, "backup": _backup,
    "recover": _recover, "cleanup": _cleanup, "backups": _backups, "apply": _apply,
}


#: The exit status of a usage error (a bad command line), by command: 2 for the commands whose
#: 0 and 1 are verdicts (as grep and diff keep 2 for trouble) and for cleanup (as
#: pg_archivecleanup), 1 for the others.
USAGE_STATUS = {"verify": NOT_A_VERDICT, "analyze": NOT_A_VERDICT, "cleanup": 2}


class LazyGroup(click.Group):
    """A click group that imports a subcommand's module on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS and cmd_name not in self.commands:
            self.add_command(LAZY_COMMANDS[cmd_name](), cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list with each command's whole first sentence (click would cut it
        to the terminal width with "..."); long ones wrap."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=200)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _load_config(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """Read the configuration file into the environment, before the command's options are
    read (the console script has done so already: then this changes nothing)."""
    if not value:
        return
    from receivewal.commands.configfile import load_config  # noqa: PLC0415 - only then

    try:
        load_config(value, os.environ)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from exc


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-?", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="receivewal")
@click.option("--config", metavar="FILE", envvar="RECEIVEWAL_CONFIG", expose_value=False,
              is_eager=True, callback=_load_config,
              help="An instance's configuration file, read before the command's options: "
              "NAME=value lines with the environment's names (RECEIVEWAL_DIRECTORY=..., "
              "PGHOST=...), as a systemd EnvironmentFile; an option given or a variable "
              "already set wins (env RECEIVEWAL_CONFIG).")
def cli() -> None:
    """Stream and archive PostgreSQL WAL, with pg_streampack compression."""


def main(argv: list[str] | None = None) -> int:
    """Run the click group on ``argv`` (the command line without the program name)."""
    try:
        rv = cli.main(args=argv, prog_name="receivewal", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("receivewal: error: aborted", err=True)
        return 1
    except click.UsageError as exc:
        click.echo(redacted(f"receivewal: error: {exc.format_message()}"), err=True)
        return usage_status(exc, sys.argv[1:] if argv is None else argv)
    except click.ClickException as exc:  # 1, unless the command's error says otherwise
        click.echo(redacted(f"receivewal: error: {exc.format_message()}"), err=True)
        return int(exc.exit_code)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    return int(rv or 0)


def usage_status(exc: click.UsageError, args: list[str]) -> int:
    """The :data:`USAGE_STATUS` of the command a usage error is about: its context's, or for
    an error of the option parser (which carries none) the command named first in ``args``."""
    name = (exc.ctx.command.name or "") if exc.ctx is not None else (args[:1] or [""])[0]
    return USAGE_STATUS.get(name, 1)
