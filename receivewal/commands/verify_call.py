"""``receivewal verify ARCHIVE`` without click: the lean path.

pg_waldump reads two segments in ~12 ms; click and the command group alone cost a Python
``verify`` ~20-25 ms of start-up, so a plain verify command line is read here and run without
them (nor structlog or psycopg). verify's options are declared once, in :data:`OPTIONS`:
:func:`parse` reads ``ARCHIVE``, ``--json``, ``-j N`` (also ``-jN``, ``--jobs N``,
``--jobs=N``), ``--start LSN`` (``--start=LSN``) and ``--compressibility`` from them, in any
order, and the click command in :mod:`receivewal.commands.verify` is built from them. Anything
:func:`parse` does not take (``--help``, an unknown option, a missing or extra argument, a
value click would reject or might read otherwise) is left to that command, which owns the
help and the usage errors.

Both paths print the same bytes and exit with the same status: :func:`verify_text` is the
command's work for both, and :func:`run` writes it and reports errors as the click group does
(``receivewal: error: ...``): exit 1 when the archive cannot be read, 2
(:data:`~receivewal.commands.output.NOT_A_VERDICT`) when the report cannot be written, as for
click's usage errors; a reader that leaves early ends the output quietly with the verdict's
status (:func:`~receivewal.commands.output.deliver`).
"""

from __future__ import annotations

import sys

from receivewal.commands.plain import FLAG, Option, Plain, read_options
from receivewal.secrets import is_private_key, key_given_as_file, redacted

TYPE_CHECKING = False  # typing itself costs the call a few ms
if TYPE_CHECKING:
    from typing import TextIO

    from receivewal.backup.audit import BackupCheck

COUNT = "count"  # a worker count: a whole number from 1 (click.IntRange(min=1))
LSN = "lsn"  # an LSN as text, or empty: no start (start_lsn reads it)
KEYFILE = "keyfile"  # a file's path (an identity file)
IDENTITY_ENV = "RECEIVEWAL_IDENTITY"

#: verify's options, in the order of its --help; the click command is built from them.
OPTIONS = (
    Option("as_json", ("--json",), FLAG, help="Print the report as JSON."),
    Option("jobs", ("-j", "--jobs"), COUNT,
           help="At most this many worker processes (default: one per CPU); one per GiB of "
           "segments, so a small archive is scanned in this process."),
    Option("start", ("--start",), LSN, metavar="LSN",
           help="Check the WAL range recovery reaches from this LSN (default: the first "
           "segment's start)."),
    Option("compressibility", ("--compressibility",), FLAG,
           help="Also measure each segment's size after zstd level 1 and lz4."),
    Option("identity", ("--identity",), KEYFILE, metavar="FILE", env=IDENTITY_ENV,
           help="age identity file that decrypts the archive's encrypted segments (.age); "
           "without it they are reported as not checked (env RECEIVEWAL_IDENTITY)."),
)


class Call(Plain):
    """One verify command line (a plain class: ``dataclasses`` costs start-up)."""

    __slots__ = ("archive", "as_json", "compressibility", "identity", "jobs", "start")

    def __init__(self, archive: str, *, as_json: bool = False, jobs: int | None = None,
                 start: str | None = None, compressibility: bool = False,
                 identity: str | None = None) -> None:
        self.archive, self.as_json, self.jobs = archive, as_json, jobs
        self.start, self.compressibility = start, compressibility
        self.identity = identity or None


def parse(args: list[str]) -> Call | None:
    """The call ``args`` (after ``verify``) asks for, or None for click to handle."""
    import os  # noqa: PLC0415 - loaded by the interpreter's start anyway

    read = read_options(args, OPTIONS, {COUNT: _count, LSN: _lsn, KEYFILE: str}, os.environ)
    if read is None or len(read[1]) != 1:
        return None
    values, (archive,) = read
    return Call(archive, **values)  # type: ignore[arg-type]  # typed by OPTIONS' kinds


def _count(text: str) -> int | None:
    """A worker count (ASCII digits, at least 1), or None: click says why not."""
    return int(text) if text.isascii() and text.isdigit() and int(text) >= 1 else None


def _lsn(text: str) -> str | None:
    """``text`` when it is an LSN (or empty: no start), else None: click says why not."""
    from receivewal.errors import ConfigurationError  # noqa: PLC0415

    try:
        start_lsn(text)
    except ConfigurationError:
        return None
    return text


def start_lsn(start: str | None) -> int | None:
    """``--start`` as an LSN (None when not given); ConfigurationError saying why it is not
    one."""
    from receivewal.wal.lsn import parse_lsn  # noqa: PLC0415 - after the command line is read

    return parse_lsn(start) if start else None


def verify_text(archive: str, *, as_json: bool, jobs: int | None, start: str | None,
                compressibility: bool, identity: str | None = None) -> tuple[str, int]:
    """The report to print and the exit status (0 only when the archive is recoverable end to
    end); the project's ArchiveError, ConfigurationError or StoreError when it cannot be
    checked at all. The command's work, on both paths."""
    from receivewal.check.verify import (  # noqa: PLC0415 - after the command line is read
        report_json,
        report_lines,
        verify_archive,
    )

    report, results = verify_archive(archive, jobs=jobs, start_lsn=start_lsn(start),
                                     compressibility=compressibility, identity_file=identity)
    backups = check_backups(archive, identity) if _may_hold_backups(archive) else []
    failed = sum(1 for check in backups if check.failed)
    interrupted = [check for check in backups if check.interrupted]
    if as_json:
        import json  # noqa: PLC0415 - only for --json

        document = report_json(report, results)
        if backups:
            document["backups"] = [{"backup_id": c.backup_id, "state": c.state,
                                    "detail": c.detail,
                                    **({} if c.bytes is None else {"bytes": c.bytes})}
                                   for c in backups]
            document["interrupted_backups"] = len(interrupted)
        text = json.dumps(document, indent=2)
    else:
        lines = report_lines(report, archive, results)
        if backups:
            lines[-1:-1] = [f"backups: {len(backups)}, {failed} FAILED"
                            + _interrupted_words(interrupted),
                            *("  " + check.line() for check in backups)]
        text = "\n".join(lines)
    return text, 0 if report.recoverable and not failed else 1


def _interrupted_words(interrupted: list[BackupCheck]) -> str:
    """How many backups were interrupted, and the bytes they leave, for the backups' line."""
    if not interrupted:
        return ""
    known = [c.bytes for c in interrupted if c.bytes is not None]
    size = f" ({sum(known)} bytes)" if known else ""
    return f", {len(interrupted)} interrupted{size}: not recoverable from, not an error"


def _may_hold_backups(archive: str) -> bool:
    """Whether ``archive`` may hold base backups (a bucket, a directory with ``backups/``): a
    plain WAL archive's verify loads none of the backups' modules."""
    import os  # noqa: PLC0415 - loaded by the interpreter's start anyway

    from receivewal.archive.location import is_bucket_url  # noqa: PLC0415

    return is_bucket_url(archive) or os.path.isdir(os.path.join(archive, "backups"))


def check_backups(archive: str, identity: str | None = None) -> list[BackupCheck]:
    """Every backup of the archive, checked (a sealed one through ``identity``)."""
    from receivewal.backup.audit import check_backups as check  # noqa: PLC0415

    return check(archive, identity)


def run(call: Call) -> int:
    """Verify the archive and print the report; the exit status, as the click path's."""
    from receivewal.commands.output import deliver  # noqa: PLC0415
    from receivewal.errors import (  # noqa: PLC0415
        ArchiveError,
        ConfigurationError,
        StoreError,
    )

    if call.identity and is_private_key(call.identity):
        _echo(f"receivewal: error: {key_given_as_file('--identity (or RECEIVEWAL_IDENTITY)')}",
              sys.stderr)
        return 1
    try:
        try:
            text, status = verify_text(call.archive, as_json=call.as_json, jobs=call.jobs,
                                       start=call.start, compressibility=call.compressibility,
                                       identity=call.identity)
        except (ArchiveError, ConfigurationError, StoreError) as exc:
            _echo(redacted(f"receivewal: error: {exc}"), sys.stderr)
            return 1
        return deliver(lambda: _echo(text, sys.stdout), status)
    except (EOFError, KeyboardInterrupt):  # click: a new line, then the group's one line
        _echo("", sys.stderr)
        _echo("receivewal: error: aborted", sys.stderr)
        return 1


def _echo(text: str, stream: TextIO) -> None:
    """Write ``text`` and a new line as ``click.echo`` does: where click would change the bytes
    (ANSI escapes it strips off a terminal, an ASCII stream it re-encodes), click writes it."""
    if "\x1b" in text or _ascii(stream):
        import click  # noqa: PLC0415 - only where its output differs from a plain write

        click.echo(text, err=stream is sys.stderr)
        return
    stream.write(text + "\n")
    stream.flush()


def _ascii(stream: TextIO) -> bool:
    import codecs  # noqa: PLC0415 - loaded by the interpreter's start anyway

    try:
        return codecs.lookup(getattr(stream, "encoding", None) or "ascii").name == "ascii"
    except LookupError:
        return False
