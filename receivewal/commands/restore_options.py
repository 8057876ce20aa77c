"""``receivewal restore``'s command line, declared once, and read without click for a call.

Each option of ``restore`` is one :class:`~receivewal.commands.plain.Option` in
:data:`OPTIONS` (its spellings, kind, ``RECEIVEWAL_*`` variable and help), and its two names
are :data:`ARGUMENTS`. Two
readers are built from them: :func:`parse`, which reads the command line PostgreSQL's
restore_command gives without importing click (a call's start-up is recovery's time: see
:mod:`receivewal.restore`), and the click command of :mod:`receivewal.commands.restore`, which
owns ``--help`` and the usage errors and takes every command line :func:`parse` leaves to it
(``--help``, an unknown option, a missing argument, a value click would refuse).

This module is on a call's lean path: see :mod:`receivewal.restore` for what it may import.
"""

from __future__ import annotations

import os

from receivewal.commands.plain import FLAG, Option, read_options
from receivewal.restore.call import Call

DIRECTORY = "directory"  # a path, which click must not find to be a file
COUNT = "count"  # a number from 0 to the option's maximum
KEYFILE = "keyfile"  # a file's path (an identity file: missing or unreadable, it is the call's
# error, 126, never click's)
__all__ = ["ARGUMENTS", "COUNT", "DIRECTORY", "FLAG", "KEYFILE", "OPTIONS", "parse"]

OPTIONS = (
    Option(
        "directory", ("-D", "--directory"), DIRECTORY, env="RECEIVEWAL_DIRECTORY",
        required=True,
        help="The archive: a directory (receivewal stream's -D) or s3://BUCKET/PREFIX (env "
        "RECEIVEWAL_DIRECTORY)."),
    Option(
        "partial", ("--partial",), FLAG,
        help="Serve the .partial holding the longest valid WAL of a segment that has no "
        "complete file (recovery to the last byte received)."),
    Option(
        "prefetch", ("--prefetch",), COUNT, env="RECEIVEWAL_PREFETCH", maximum=64,
        metavar="N",
        help="Fetch the next N segments into pg_wal/.receivewal/prefetch in the background, "
        "so that later calls are a rename (default 8; env RECEIVEWAL_PREFETCH)."),
    Option(
        "identity", ("--identity",), KEYFILE, env="RECEIVEWAL_IDENTITY", metavar="FILE",
        help="age identity file (age-keygen's) that decrypts the archive's encrypted files "
        "(.age); without it, an encrypted file exits 126 naming who can read it (env "
        "RECEIVEWAL_IDENTITY)."),
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
    read = read_options(args, OPTIONS, {DIRECTORY: str, COUNT: _count, KEYFILE: str},
                        os.environ)
    if read is None or len(read[1]) != len(ARGUMENTS):
        return None
    values, names = read
    return Call(*names, **values)  # type: ignore[arg-type]  # typed by OPTIONS' kinds
