"""What ``--help`` tells a newcomer: all commands, environment variables, extras, exit codes.

Run through click's CliRunner on the real command group; no server needed.
"""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from receivewal.commands.cli import LAZY_COMMANDS, cli


def help_of(*args: str) -> str:
    """The help text of ``receivewal ARGS --help`` (exit 0)."""
    result = CliRunner().invoke(cli, [*args, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.output


def test_command_list_is_not_cut() -> None:
    """Every command's first sentence appears whole in ``receivewal --help``; no "..."."""
    text = help_of()
    assert "..." not in text.split("Commands:", 1)[1]
    flat = "".join(text.split())  # lines may wrap inside a word ("Nagios-" "style")
    ctx = click.Context(cli)
    for name in LAZY_COMMANDS:
        cmd = cli.get_command(ctx, name)
        assert cmd is not None
        assert "".join(f"{name} {cmd.get_short_help_str(limit=200)}".split()) in flat


@pytest.mark.parametrize("name", sorted(LAZY_COMMANDS))
def test_every_option_is_described(name: str) -> None:
    """Each option of each command has a help text, and ``-?`` is help as well (``-h`` is
    the host for stream, as in pg_receivewal)."""
    cmd = cli.get_command(click.Context(cli), name)
    assert cmd is not None
    missing = [p.name for p in cmd.params if isinstance(p, click.Option) and not p.help]
    assert not missing
    assert CliRunner().invoke(cli, [name, "-?"]).output == help_of(name)


def test_stream_help_names_the_environment_and_the_directory_rule() -> None:
    """stream: RECEIVEWAL_* variables, -D must exist, help is --help/-? and -h the host."""
    flat = " ".join(help_of("stream").split())
    assert "RECEIVEWAL_<LONG_OPTION>" in flat
    assert "RECEIVEWAL_DIRECTORY" in flat
    assert "(it must exist)" in flat
    assert "Help is --help or -?: -h is the host, as in pg_receivewal." in flat
    assert "Longest pause between reconnect attempts, in seconds." in flat


def test_restore_help_names_its_environment_variable() -> None:
    """restore -D can come from RECEIVEWAL_DIRECTORY, as the systemd environment file sets."""
    assert "env RECEIVEWAL_DIRECTORY" in " ".join(help_of("restore").split())


def test_analyze_help_names_the_extra_and_exit_codes() -> None:
    """analyze: the spark extra to install, and what its exit codes mean."""
    flat = " ".join(help_of("analyze").split())
    assert "pip install 'receivewal[spark]'" in flat
    assert "Exit codes: 0 every archive is recoverable; 1 one is not, or the job failed; 2 a " \
        "usage error, or the summary could not be written." in flat


def test_verify_help_names_its_exit_codes() -> None:
    """verify: 0, 1 and 3 (unknown) are the verdict, 2 is no verdict."""
    flat = " ".join(help_of("verify").split())
    assert "Exit codes: 0 recoverable end to end; 1 NOT recoverable, or the archive cannot be " \
        "read; 2 a usage error, or the report could not be written; 3 unknown: files sealed " \
        "at rest could not be checked without --identity." in flat
