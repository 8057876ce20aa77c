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
from typing import TYPE_CHECKING, TextIO

from receivewal.commands import catalog
from receivewal.commands.plain import COUNT, FLAG, KEYFILE, PATH, Option, Plain, read_options
from receivewal.secrets import is_private_key, key_given_as_file, redacted

if TYPE_CHECKING:
    from receivewal.check.backupcheck import BackupCheck

LSN = "lsn"  # an LSN as text, or empty: no start (start_lsn reads it)

#: verify's options, in the order of its --help; the click command is built from them (a
#: count here is a number of workers: from 1).
OPTIONS = (
    catalog.DIRECTORY.but(
        help="The archive: a directory or s3://BUCKET/PREFIX, as for every command (env "
        f"{catalog.DIRECTORY.env}); scripts may still give it as the argument instead "
        "(both: the same archive, or a usage error)."),
    catalog.JSON,
    Option("jobs", ("-j", "--jobs"), COUNT,
           help="At most this many worker processes (default: one per CPU); one per GiB of "
           "segments, so a small archive is scanned in this process."),
    Option("start", ("--start",), LSN, metavar="LSN",
           help="Check the WAL range recovery reaches from this LSN (default: the first "
           "segment's start)."),
    Option("compressibility", ("--compressibility",), FLAG,
           help="Also measure each segment's size after zstd level 1 and lz4."),
    catalog.IDENTITY.but(
        help="age identity file that decrypts the archive's encrypted segments (.age); "
        f"without it they are reported as not checked (env {catalog.IDENTITY.env})."),
)


class Call(Plain):
    """One verify command line (a plain class: ``dataclasses`` costs start-up)."""

    __slots__ = ("archive", "as_json", "compressibility", "directory", "identity", "jobs",
                 "start")

    def __init__(self, archive: str | None = None, *, directory: str | None = None,
                 as_json: bool = False, jobs: int | None = None, start: str | None = None,
                 compressibility: bool = False, identity: str | None = None) -> None:
        self.archive, self.directory = archive, directory
        self.as_json, self.jobs = as_json, jobs
        self.start, self.compressibility = start, compressibility
        self.identity = identity or None

    @property
    def where(self) -> str:
        """The archive to verify: the argument, else ``-D`` (or its variable)."""
        return self.archive or self.directory or ""


def parse(args: list[str]) -> Call | None:
    """The call ``args`` (after ``verify``) asks for, or None for click to handle (also no
    archive, or ``-D`` and the argument naming two)."""
    import os  # noqa: PLC0415 - loaded by the interpreter's start anyway

    # -D's variable only when the command line names no archive (the argument wins over it)
    environ = {k: v for k, v in os.environ.items() if k != catalog.DIRECTORY.env}
    read = read_options(args, OPTIONS, {COUNT: _count, LSN: _lsn, KEYFILE: str, PATH: _named},
                        environ)
    if read is None or len(read[1]) > 1:
        return None
    values, arguments = read
    archive = arguments[0] if arguments else None
    directory = values.pop("directory", None)
    if archive is None and directory is None:
        directory = os.environ.get(catalog.DIRECTORY.env or "") or None
    if (archive is None and directory is None) or (archive and directory
                                                   and archive != directory):
        return None  # click says what is wrong
    return Call(archive, directory=directory, **values)  # type: ignore[arg-type]


def _named(text: str) -> str | None:
    """An archive named (an empty name is click's usage error)."""
    return text or None


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
        verdict_line,
        verdict_of,
        verify_archive,
    )
    from receivewal.commands.output import VERDICT_STATUS  # noqa: PLC0415

    report, results = verify_archive(archive, jobs=jobs, start_lsn=start_lsn(start),
                                     compressibility=compressibility, identity_file=identity)
    backups = check_backups(archive, identity) if _may_hold_backups(archive) else []
    failed = sum(1 for check in backups if check.failed)
    interrupted = [check for check in backups if check.interrupted]
    unchecked = sum(1 for check in backups if check.state == "sealed")
    verdict = verdict_of(report, failed_backups=failed, unchecked_backups=unchecked)
    if as_json:
        import json  # noqa: PLC0415 - only for --json

        document = report_json(report, results)
        if backups:
            document["backups"] = [{"backup_id": c.backup_id, "state": c.state,
                                    "detail": c.detail,
                                    **({} if c.bytes is None else {"bytes": c.bytes})}
                                   for c in backups]
            document["interrupted_backups"] = len(interrupted)
        document["verdict"] = verdict
        text = json.dumps(document, indent=2)
    else:
        lines = report_lines(report, archive, results)
        if backups:
            lines[-1:-1] = [f"backups: {len(backups)}, {failed} FAILED"
                            + _interrupted_words(interrupted),
                            *("  " + check.line() for check in backups)]
        lines[-1] = verdict_line(verdict)
        text = "\n".join(lines)
    return text, VERDICT_STATUS[verdict]


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
    from receivewal.check.backupcheck import check_backups as check  # noqa: PLC0415

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
        _echo(f"receivewal: error: {key_given_as_file(catalog.IDENTITY.named())}", sys.stderr)
        return 1
    try:
        try:
            text, status = verify_text(call.where, as_json=call.as_json, jobs=call.jobs,
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
