"""``receivewal verify ARCHIVE`` without click: the lean path.

pg_waldump reads two segments in ~12 ms; click and the command group alone cost a Python
``verify`` ~20-25 ms of start-up, so a plain verify command line is read here and run without
them (nor structlog or psycopg). :func:`parse` takes ``ARCHIVE``, ``--json``, ``-j N`` (also
``-jN``, ``--jobs N``, ``--jobs=N``), ``--start LSN`` (``--start=LSN``) and
``--compressibility``, in any order; anything else (``--help``, an unknown option, a missing
or extra argument, a value click would reject or might read otherwise) is left to the click
command in :mod:`receivewal.commands.verify`, which owns the options' help and usage errors.

Both paths print the same bytes and exit with the same status: :func:`verify_text` is the
command's work for both, and :func:`run` writes it and reports errors as the click group does
(``receivewal: error: ...``): exit 1 when the archive cannot be read, 2
(:data:`~receivewal.commands.output.NOT_A_VERDICT`) when the report cannot be written, as for
click's usage errors; a reader that leaves early ends the output quietly with the verdict's
status (:func:`~receivewal.commands.output.deliver`).
"""

from __future__ import annotations

import sys

from receivewal.commands.plain import Plain

TYPE_CHECKING = False  # typing itself costs the call a few ms
if TYPE_CHECKING:
    from typing import TextIO

_FLAGS = {"--json": "as_json", "--compressibility": "compressibility"}
_VALUED = {"-j": "jobs", "--jobs": "jobs", "--start": "start"}


class Call(Plain):
    """One verify command line (a plain class: ``dataclasses`` costs start-up)."""

    __slots__ = ("archive", "as_json", "compressibility", "jobs", "start")

    def __init__(self, archive: str, *, as_json: bool = False, jobs: int | None = None,
                 start: str | None = None, compressibility: bool = False) -> None:
        self.archive, self.as_json, self.jobs = archive, as_json, jobs
        self.start, self.compressibility = start, compressibility


def parse(args: list[str]) -> Call | None:
    """The call ``args`` (after ``verify``) asks for, or None for click to handle."""
    values: dict[str, str] = {}
    flags = {"as_json": False, "compressibility": False}
    archives = []
    i = 0
    while i < len(args):
        arg = args[i]
        name, _, inline = arg.partition("=")
        if arg in _FLAGS:
            flags[_FLAGS[arg]] = True
        elif arg in _VALUED:
            if i + 1 >= len(args) or args[i + 1].startswith("-"):
                return None  # click says what is missing (or reads the value its own way)
            values[_VALUED[arg]] = args[i + 1]
            i += 1
        elif name in {"--jobs", "--start"} and inline and not inline.startswith("-"):
            values[_VALUED[name]] = inline
        elif arg.startswith("-j") and len(arg) > 2:
            values["jobs"] = arg[2:]
        elif arg.startswith("-") or not arg:
            return None
        else:
            archives.append(arg)
        i += 1
    jobs, start = values.get("jobs"), values.get("start")
    if len(archives) != 1 or (jobs is not None and not _is_count(jobs)) \
            or (start is not None and not _is_lsn(start)):
        return None
    return Call(archives[0], as_json=flags["as_json"], jobs=None if jobs is None else int(jobs),
                start=start, compressibility=flags["compressibility"])


def _is_count(text: str) -> bool:
    """Whether ``text`` is a worker count (ASCII digits, at least 1): click says why not."""
    return text.isascii() and text.isdigit() and int(text) >= 1


def _is_lsn(text: str) -> bool:
    """Whether ``text`` is an LSN (or empty: no start): click says why not."""
    from receivewal.errors import ConfigurationError  # noqa: PLC0415

    try:
        start_lsn(text)
    except ConfigurationError:
        return False
    return True


def start_lsn(start: str | None) -> int | None:
    """``--start`` as an LSN (None when not given); ConfigurationError saying why it is not
    one."""
    from receivewal.wal.lsn import parse_lsn  # noqa: PLC0415 - after the command line is read

    return parse_lsn(start) if start else None


def verify_text(archive: str, *, as_json: bool, jobs: int | None, start: str | None,
                compressibility: bool) -> tuple[str, int]:
    """The report to print and the exit status (0 only when the archive is recoverable end to
    end); the project's ArchiveError, ConfigurationError or StoreError when it cannot be
    checked at all. The command's work, on both paths."""
    from receivewal.check.verify import (  # noqa: PLC0415 - after the command line is read
        report_json,
        report_lines,
        verify_archive,
    )

    report, results = verify_archive(archive, jobs=jobs, start_lsn=start_lsn(start),
                                     compressibility=compressibility)
    if as_json:
        import json  # noqa: PLC0415 - only for --json

        text = json.dumps(report_json(report, results), indent=2)
    else:
        text = "\n".join(report_lines(report, archive, results))
    return text, 0 if report.recoverable else 1


def run(call: Call) -> int:
    """Verify the archive and print the report; the exit status, as the click path's."""
    from receivewal.commands.output import deliver  # noqa: PLC0415
    from receivewal.errors import (  # noqa: PLC0415
        ArchiveError,
        ConfigurationError,
        StoreError,
    )

    try:
        try:
            text, status = verify_text(call.archive, as_json=call.as_json, jobs=call.jobs,
                                       start=call.start, compressibility=call.compressibility)
        except (ArchiveError, ConfigurationError, StoreError) as exc:
            _echo(f"receivewal: error: {exc}", sys.stderr)
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
