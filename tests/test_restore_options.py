"""restore's options are declared once (commands/restore_options.OPTIONS): the lean reader of a
call's command line and the click command are both built from the declaration, and read every
command line the same way (issue 26, item 5). No server needed."""

from __future__ import annotations

import os
from unittest import mock

import click
import pytest
from hypothesis import given
from hypothesis import strategies as st

from receivewal.commands.restore import restore_command
from receivewal.commands.restore_options import ARGUMENTS, OPTIONS, parse
from receivewal.restore.call import Call

NAME = "000000010000000000000003"
#: Words a command line is made of: each option in each spelling, values good and bad, names.
WORDS = ["-D", "/srv/a", "-D/srv/b", "--directory", "--directory=/srv/c", "--partial",
         "--partial=1", "--prefetch", "0", "3", "64", "65", "x", "--prefetch=7",
         "--prefetch=", "-q", "--no-such", NAME, "pg_wal/RECOVERYXLOG", "", "-"]
VARIABLES = {"RECEIVEWAL_DIRECTORY": ["/srv/env", ""], "RECEIVEWAL_PREFETCH": ["2", "x", "70"]}


def clicks_call(args: list[str]) -> Call | None:
    """The call click's command reads from ``args``; None when it refuses them."""
    try:
        ctx = restore_command.make_context("restore", list(args))
    except (click.exceptions.Exit, click.ClickException):
        return None
    return Call(**ctx.params)


def described(call: Call | None) -> tuple[object, ...] | None:
    return None if call is None else (call.wal_name, call.target, call.directory,
                                      call.partial, call.prefetch)


@given(args=st.lists(st.sampled_from(WORDS), max_size=7),
       env=st.fixed_dictionaries({}, optional={k: st.sampled_from(v)
                                               for k, v in VARIABLES.items()}))
def test_a_command_line_the_lean_reader_takes_reads_as_click_reads_it(
        args: list[str], env: dict[str, str]) -> None:
    """Whatever the words and variables, a call the lean reader makes is the one click makes
    of the same command line (a command line it does not take is click's to read)."""
    with mock.patch.dict(os.environ, env, clear=False):
        for name in VARIABLES.keys() - env.keys():
            os.environ.pop(name, None)
        lean = parse(args)
        if lean is not None:
            assert described(lean) == described(clicks_call(args))


@pytest.mark.parametrize("args", [
    ["-D", "/srv/a", NAME, "pg_wal/RECOVERYXLOG"],
    ["-D/srv/a", "--partial", NAME, "pg_wal/RECOVERYXLOG"],
    ["--directory=/srv/a", "--prefetch", "0", NAME, "pg_wal/RECOVERYXLOG"],
    [NAME, "pg_wal/RECOVERYXLOG", "--directory", "s3://b/p", "--prefetch=64"],
])
def test_the_command_lines_postgresql_runs_are_read_without_click(args: list[str]) -> None:
    """restore_command's usual command lines are the lean reader's, as click reads them."""
    assert parse(args) is not None
    assert described(parse(args)) == described(clicks_call(args))


def test_the_click_command_has_exactly_the_declared_options() -> None:
    """The click command's arguments and options are the declaration's, in its order, with
    its variables; nothing else but --help."""
    params = [p for p in restore_command.params if p.name != "help"]
    assert [p.name for p in params] == [*ARGUMENTS, *(o.dest for o in OPTIONS)]
    options = [p for p in params if isinstance(p, click.Option)]
    assert [tuple(p.opts) for p in options] == [o.names for o in OPTIONS]
    assert [p.envvar for p in options] == [o.env for o in OPTIONS]
