"""``receivewal restore``'s command line, declared once, and read without click for a call.

Each option of ``restore`` is one :class:`~receivewal.commands.plain.Option` in
:data:`OPTIONS` (its spellings, kind, ``RECEIVEWAL_*`` variable and help; ``-D`` and
``--identity`` are the rows of :mod:`receivewal.commands.catalog`), and its two names are
:data:`ARGUMENTS`. Two
readers are built from them: :func:`parse`, which reads the command line PostgreSQL's
restore_command gives without importing click (a call's start-up is recovery's time: see
:mod:`receivewal.restore`), and the click command of :mod:`receivewal.commands.restore`, which
owns ``--help`` and the usage errors and takes every command line :func:`parse` leaves to it
(``--help``, an unknown option, a missing argument, a value click would refuse).

This module is on a call's lean path: see :mod:`receivewal.restore` for what it may import.
"""

from __future__ import annotations

import os

from receivewal.commands import catalog
from receivewal.commands.plain import COUNT, FLAG, KEYFILE, PATH, Option, read_options
from receivewal.restore.call import Call

__all__ = ["ARGUMENTS", "OPTIONS", "parse"]

OPTIONS = (
    catalog.DIRECTORY.but(
        required=True, metavar="",
        help="The archive: a directory (receivewal stream's -D) or s3://BUCKET/PREFIX (env "
        f"{catalog.DIRECTORY.env})."),
    Option(
        "partial", ("--partial",), FLAG,
        help="Serve the .partial holding the longest valid WAL of a segment that has no "
        "complete file (recovery to the last byte received)."),
    Option(
        "prefetch", ("--prefetch",), COUNT, env="RECEIVEWAL_PREFETCH", maximum=64,
        metavar="N",
        help="Fetch the next N segments into pg_wal/.receivewal/prefetch in the background, "
        "so that later calls are a rename (default 8; env RECEIVEWAL_PREFETCH)."),
    catalog.IDENTITY,  # a file missing or unreadable is the call's error, 126, never click's
)
#: The two names PostgreSQL gives: %f and %p.
ARGUMENTS = ("wal_name", "target")
_PREFETCH_MAX = OPTIONS[2].maximum


def _count(text: str) -> int | None:
    """A prefetch count as click's IntRange takes it, or None (click then says why)."""
    return int(text) if text.isascii() and text.isdigit() and int(text) <= _PREFETCH_MAX \
        else None


def parse(args: list[str]) -> Call | None:
    """The call ``args`` (after ``restore``) asks for, or None for click to handle: each
    option as click reads it (``-D DIR``, ``-DDIR``, ``--directory DIR``, ``--directory=DIR``;
    the variable when the command line does not give it and it is not empty), the two names in
    their order."""
    read = read_options(args, OPTIONS, {PATH: str, COUNT: _count, KEYFILE: str},
                        os.environ)
    if read is None or len(read[1]) != len(ARGUMENTS):
        return None
    values, names = read
    return Call(*names, **values)  # type: ignore[arg-type]  # typed by OPTIONS' kinds
