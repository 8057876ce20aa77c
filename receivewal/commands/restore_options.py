"""``receivewal restore``'s command line, declared once, and read without click for a call.

Each option of ``restore`` is one :class:`RestoreOption` in :data:`OPTIONS` (its spellings,
kind, ``RECEIVEWAL_*`` variable and help), and its two names are :data:`ARGUMENTS`. Two
readers are built from them: :func:`parse`, which reads the command line PostgreSQL's
restore_command gives without importing click (a call's start-up is recovery's time: see
:mod:`receivewal.restore`), and the click command of :mod:`receivewal.commands.restore`, which
owns ``--help`` and the usage errors and takes every command line :func:`parse` leaves to it
(``--help``, an unknown option, a missing argument, a value click would refuse).

This module is on a call's lean path: see :mod:`receivewal.restore` for what it may import.
"""

from __future__ import annotations

import os

from receivewal.restore.call import Call

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

DIRECTORY = "directory"  # a path, which click must not find to be a file
FLAG = "flag"  # no value: present or not
COUNT = "count"  # a number from 0 to the option's maximum


class RestoreOption:
    """One option of ``restore``: ``dest`` is the parameter it fills, ``names`` its
    spellings (the short one first), ``kind`` one of DIRECTORY, FLAG and COUNT, ``env`` the
    variable that gives it when the command line does not."""

    __slots__ = ("dest", "env", "help", "kind", "maximum", "metavar", "names", "required")

    def __init__(self, dest: str, names: tuple[str, ...], kind: str, *, help: str,
                 env: str | None = None, required: bool = False, maximum: int = 0,
                 metavar: str | None = None) -> None:
        self.dest, self.names, self.kind, self.help = dest, names, kind, help
        self.env, self.required, self.maximum, self.metavar = env, required, maximum, metavar


OPTIONS = (
    RestoreOption(
        "directory", ("-D", "--directory"), DIRECTORY, env="RECEIVEWAL_DIRECTORY",
        required=True,
        help="The archive: a directory (receivewal stream's -D) or s3://BUCKET/PREFIX (env "
        "RECEIVEWAL_DIRECTORY)."),
    RestoreOption(
        "partial", ("--partial",), FLAG,
        help="Serve the .partial holding the longest valid WAL of a segment that has no "
        "complete file (recovery to the last byte received)."),
    RestoreOption(
        "prefetch", ("--prefetch",), COUNT, env="RECEIVEWAL_PREFETCH", maximum=64,
        metavar="N",
        help="Fetch the next N segments into pg_wal/.receivewal/prefetch in the background, "
        "so that later calls are a rename (default 8; env RECEIVEWAL_PREFETCH)."),
)
#: The two names PostgreSQL gives: %f and %p.
ARGUMENTS = ("wal_name", "target")

_BY_NAME = {name: option for option in OPTIONS for name in option.names}


def parse(args: list[str]) -> Call | None:
    """The call ``args`` (after ``restore``) asks for, or None for click to handle: each
    option as click reads it (``-D DIR``, ``-DDIR``, ``--directory DIR``, ``--directory=DIR``;
    the variable when the command line does not give it and it is not empty), the two names in
    their order."""
    values: dict[str, str | bool] = {}
    for declared in OPTIONS:
        if declared.env is not None and os.environ.get(declared.env):  # empty: unset, as click
            values[declared.dest] = os.environ[declared.env]
    names: list[str] = []
    i = 0
    while i < len(args):
        arg, i = args[i], i + 1
        option = _BY_NAME.get(arg)
        if option is not None and option.kind == FLAG:
            values[option.dest] = True
        elif option is not None:
            if i >= len(args):
                return None  # click says what is missing
            values[option.dest], i = args[i], i + 1
        elif (inline := _inline(arg)) is not None:
            values[inline[0].dest] = inline[1]
        elif arg.startswith("-"):
            return None
        else:
            names.append(arg)
    if len(names) != len(ARGUMENTS):
        return None
    checked = _checked(values)
    return None if checked is None else Call(*names, **checked)  # type: ignore[arg-type]


def _inline(arg: str) -> tuple[RestoreOption, str] | None:
    """The option and value of ``--long=VALUE`` or ``-SVALUE`` (options that take a value)."""
    if arg.startswith("--"):
        name, equals, value = arg.partition("=")
    else:
        name, equals, value = arg[:2], arg[2:] and "=", arg[2:]
    option = _BY_NAME.get(name)
    if option is None or option.kind == FLAG or not equals:
        return None
    return option, value


def _checked(values: Mapping[str, str | bool]) -> dict[str, object] | None:
    """The parameters of the call, typed; None when a value is missing or not one click
    takes (click then says why)."""
    checked: dict[str, object] = {}
    for option in OPTIONS:
        value = values.get(option.dest)
        if value is None:
            if option.required:
                return None
        elif option.kind == COUNT:
            assert isinstance(value, str)
            if not (value.isascii() and value.isdigit() and int(value) <= option.maximum):
                return None
            checked[option.dest] = int(value)
        else:
            checked[option.dest] = value
    return checked
