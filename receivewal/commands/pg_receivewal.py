"""``pg_receivewal-streampack``: pg_receivewal 15's command line in front of receivewal.

Installed (or symlinked) as ``pg_receivewal`` in a directory of its own, it stands in for the
real program: the same options parsed the way getopt_long parses them, the same checks in the
same order with the same messages and exit codes, the same verbose lines
(``starting log streaming at X/X (timeline N)``, ``finished segment at ...``), the same files.
Underneath it builds the Settings that ``receivewal stream`` builds and runs the same
Supervisor, requesting pg_streampack compression by default.

``--version`` says ``pg_receivewal (PostgreSQL) 15.18 (receivewal X with pg_streampack)``: tools
such as Barman drop the parenthesised parts and read the second word as the version of the
pg_receivewal they run, and this is pg_receivewal 15's behaviour (tested against 15.18).
"""

from __future__ import annotations

import getopt
import os
import re
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, NoReturn

import structlog

from receivewal import __version__
from receivewal.commands.options import (
    Lsn,
    StreamOptions,
    declared_options,
    options_from,
    prompt_password,
    setting_values,
    takes_value,
    with_connection,
)
from receivewal.daemon.events import (
    EndposReached,
    Event,
    SegmentCompleted,
    StopNoticed,
    StreamingStarted,
    TimelineSwitched,
)
from receivewal.daemon.lifecycle import (
    Disconnected,
    DiskFull,
    Failed,
    GapDetected,
    Reconnecting,
    SlotCreating,
    SlotDropping,
    SlotExisted,
    Stopped,
)
from receivewal.daemon.proctitle import scrub_passwords
from receivewal.daemon.settings import Settings
from receivewal.daemon.supervisor import Supervisor
from receivewal.errors import CommandLineError, ReceivewalError
from receivewal.secrets import redacted
from receivewal.wal.lsn import format_lsn, scan_lsn
from receivewal.walreceiver.receiver import WalReceiver
from receivewal.walreceiver.startpoint import SegmentFileRejected

PROGNAME = "pg_receivewal"
PG_VERSION = "15.18"  # the pg_receivewal whose behaviour this reproduces
VERSION_LINE = f"{PROGNAME} (PostgreSQL) {PG_VERSION} (receivewal {__version__} with pg_streampack)"
RECONNECT_SLEEP_TIME = 5  # seconds, as pg_receivewal
INT_MAX = 2**31 - 1

#: pg_receivewal's options, declared in commands/options.py, in pg_receivewal's long_options[]
#: order (which glibc follows when it lists possibilities): (spec, field, value type)
_PG_OPTIONS = sorted(((spec, f.name, kind) for f, spec, kind in declared_options()
                      if spec.pg_receivewal), key=lambda option: option[0].pg_receivewal)
SHORT_OPTIONS = "".join(spec.short[1:] + ":" * takes_value(kind)
                        for spec, _, kind in _PG_OPTIONS if spec.short)
LONG_OPTIONS = ["help", "version",
                *(spec.long[2:] + "=" * takes_value(kind) for spec, _, kind in _PG_OPTIONS)]
_FIELDS = {flag: name for spec, name, _ in _PG_OPTIONS for flag in spec.names}
_KINDS = {name: kind for _, name, kind in _PG_OPTIONS}
_SPELLINGS = {name: "/".join(spec.names) for spec, name, _ in _PG_OPTIONS}  # "-s/--status-interval"

HELP = f"""\
{PROGNAME} receives PostgreSQL streaming write-ahead logs.

Usage:
  {PROGNAME} [OPTION]...

Options:
  -D, --directory=DIR    receive write-ahead log files into this directory
  -E, --endpos=LSN       exit after receiving the specified LSN
      --if-not-exists    do not error if slot already exists when creating a slot
  -n, --no-loop          do not loop on connection lost
      --no-sync          do not wait for changes to be written safely to disk
  -s, --status-interval=SECS
                         time between status packets sent to server (default: 10)
  -S, --slot=SLOTNAME    replication slot to use
      --synchronous      flush write-ahead log immediately after writing
  -v, --verbose          output verbose messages
  -V, --version          output version information, then exit
  -Z, --compress=METHOD[:DETAIL]
                         compress as specified (gzip, lz4, zstd or none)
  -?, --help             show this help, then exit

Connection options:
  -d, --dbname=CONNSTR   connection string
  -h, --host=HOSTNAME    database server host or socket directory
  -p, --port=PORT        database server port number
  -U, --username=NAME    connect as specified database user
  -w, --no-password      never prompt for password
  -W, --password         force password prompt (should happen automatically)

Optional actions:
      --create-slot      create a new replication slot (for the slot's name see --slot)
      --drop-slot        drop the replication slot (for the slot's name see --slot)

This is receivewal {__version__}: WAL arrives pg_streampack-compressed when the server offers it
(RECEIVEWAL_COMPRESSION=none turns that off). See "receivewal stream --help" for more options.
"""


class UsageError(ReceivewalError):
    """A command line pg_receivewal refuses; ``try_help`` adds the "Try --help" line."""

    def __init__(self, message: str, *, try_help: bool = True) -> None:
        super().__init__(message)
        self.try_help = try_help


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pg_receivewal-streampack`` console script."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("--help", "-?"):
        sys.stdout.write(HELP)
        return 0
    if args and args[0] in ("--version", "-V"):
        sys.stdout.write(VERSION_LINE + "\n")
        return 0
    try:
        opts, directory = parse_args(args)
        settings = check_args(opts, directory)
    except getopt.GetoptError as exc:
        sys.stderr.write(redacted(f"{sys.argv[0]}: {getopt_message(exc)}\n"))
        _hint()
        return 1
    except UsageError as exc:
        if str(exc):
            _error(str(exc))
        if exc.try_help:
            _hint()
        return 1
    messages = configure_messages(opts.verbose)
    os.environ.setdefault("PGAPPNAME", PROGNAME)  # libpq's fallback_application_name, in effect
    try:
        settings = with_connection(settings, opts).validate()
    except ReceivewalError as exc:
        _error(str(exc).removeprefix("invalid connection string: "))  # libpq's words only
        return 1
    scrub_passwords()  # parsed: ps need not show a password for the daemon's whole life
    prompt = None if opts.no_password else prompt_password
    return Supervisor(settings, WalReceiver(settings), prompt=prompt,
                      listeners=(messages.on_event,), log_events=False).run()


def parse_args(args: list[str]) -> tuple[StreamOptions, str | None]:
    """pg_receivewal's options as ``receivewal stream``'s options, and -D as typed (for the
    messages).

    Raises getopt.GetoptError for what getopt_long refuses and UsageError (with PostgreSQL's
    message) for a value pg_receivewal refuses as it reads it, or an argument too many.
    """
    parsed, rest = getopt.gnu_getopt(args, SHORT_OPTIONS, LONG_OPTIONS)
    values: dict[str, object] = {}  # field -> its value, the last given
    directory = None  # -D as typed, for the messages
    for flag, value in parsed:
        name = _FIELDS.get(flag)
        if name is None:  # --help, --version: getopt_long knows them; only argv[1] acts on them
            raise UsageError("")
        if name in ("no_password", "force_password"):  # the last of -w / -W wins
            values.pop("no_password", None)
            values.pop("force_password", None)
        if name == "directory":
            directory = value
        values[name] = _value(name, value, values.get(name))
    if rest:
        raise UsageError(f'too many command-line arguments (first is "{rest[0]}")')
    opts = options_from(values, base=StreamOptions(
        compression=os.environ.get("RECEIVEWAL_COMPRESSION", StreamOptions.compression),
        reconnect_delay=float(RECONNECT_SLEEP_TIME),
        reconnect_delay_max=float(RECONNECT_SLEEP_TIME),
    ))
    return opts, directory


def _value(name: str, text: str, previous: object) -> object:
    """One option's value as its field's type, checked as pg_receivewal checks it."""
    kind = _KINDS[name]
    if kind is Lsn:  # sscanf's rule; 0/0 is no end position
        return Lsn(parse_endpos(text)) or None
    if kind is int:  # -v counts
        return (previous if isinstance(previous, int) else 0) + 1
    if kind is bool:
        return True
    if kind is float:  # seconds, as option_parse_int() reads them
        return float(parse_int(text, _SPELLINGS[name], 0, INT_MAX // 1000))
    return Path(text) if kind is Path else text


def check_args(opts: StreamOptions, directory: str | None) -> Settings:
    """pg_receivewal's checks before it connects, in its order: the combination
    (Settings.check_combination, with pg_receivewal's words and hint), -Z, the directory (its
    opendir()). UsageError for what they refuse; else the Settings of the options, to be
    completed with the connection string and validated (:func:`with_connection`).

    ``directory`` is -D as typed, for the messages.
    """
    values, refused = setting_values(opts)
    settings = Settings(conninfo="", **values)
    try:
        settings.check_combination()
    except CommandLineError as exc:
        raise UsageError(exc.words) from exc
    if refused is not None:
        raise UsageError(str(refused), try_help=False)
    if not (opts.drop_slot or opts.create_slot):
        try:  # opendir() in pg_receivewal; the daemon lists the directory itself, once
            os.close(os.open(directory or "", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        except OSError as exc:
            raise UsageError(f'could not open directory "{directory}": '
                             f"{exc.strerror}", try_help=False) from exc
    return settings


_C_INT = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]*)[ \t\n\v\f\r]*")


def parse_int(text: str, name: str, low: int, high: int) -> int:
    """option_parse_int(): an int with optional surrounding white space, in range."""
    match = _C_INT.fullmatch(text)
    if match is None:
        raise UsageError(f'invalid value "{text}" for option {name}', try_help=False)
    digits = match.group(1)
    value = int(digits) if digits.strip("+-") else 0
    if digits and not digits.strip("+-"):
        raise UsageError(f'invalid value "{text}" for option {name}', try_help=False)
    if not low <= value <= high:
        raise UsageError(f"{name} must be in range {low}..{high}", try_help=False)
    return value


def parse_endpos(text: str) -> int:
    """sscanf("%X/%X"): two hexadecimal numbers; anything may follow."""
    lsn = scan_lsn(text)
    if lsn is None:
        raise UsageError(f'could not parse end position "{text}"', try_help=False)
    return lsn


def getopt_message(exc: getopt.GetoptError) -> str:
    """glibc getopt_long's wording for what Python's getopt refused."""
    opt, msg = exc.opt, exc.msg
    if not msg.startswith("option --"):
        if "requires argument" in msg:
            return f"option requires an argument -- '{opt}'"
        return f"invalid option -- '{opt}'"
    if "not a unique prefix" in msg:
        candidates = " ".join(f"'--{o.rstrip('=')}'" for o in LONG_OPTIONS if o.startswith(opt))
        return f"option '--{opt}' is ambiguous; possibilities: {candidates}"
    if "must not have an argument" in msg:
        full = next(o for o in LONG_OPTIONS if o.startswith(opt))
        return f"option '--{full}' doesn't allow an argument"
    if "requires argument" in msg:
        full = next(o for o in LONG_OPTIONS if o.startswith(opt)).rstrip("=")
        return f"option '--{full}' requires an argument"
    return f"unrecognized option '--{opt}'"


def _error(message: str) -> None:
    sys.stderr.write(redacted(f"{PROGNAME}: error: {message}\n"))


def _hint() -> None:
    sys.stderr.write(f'{PROGNAME}: hint: Try "{PROGNAME} --help" for more information.\n')


# -- pg_receivewal's messages from the daemon's events ------------------------------------------
def configure_messages(verbose: int) -> PgReceivewalMessages:
    """Print the daemon's events as pg_receivewal prints its messages, on stderr: the typed
    events through :meth:`PgReceivewalMessages.on_event` (a listener of the Supervisor's
    event stream, which then logs none of them), the log lines of the modules that only log
    (the uploader, the monitor's side channels) through the structlog renderer."""
    messages = PgReceivewalMessages(verbose)
    structlog.configure(
        processors=[messages],
        wrapper_class=structlog.make_filtering_bound_logger(0),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    return messages


class PgReceivewalMessages:
    """One event in, one pg_receivewal line out (or nothing): a typed event from the daemon's
    event stream (:meth:`on_event`), or, as a structlog renderer, a log line, worded by its
    level alone: the facts pg_receivewal has words for all come as typed events.

    Without ``-v`` only errors, warnings and the reconnect notice are printed, as pg_receivewal
    does; with ``-v`` its progress lines too; with ``-vv`` every other event as key=value.
    """

    def __init__(self, verbose: int) -> None:
        self.verbose = verbose

    def __call__(self, logger: object, method: str, event: MutableMapping[str, Any]) -> str:
        line = self.message(method, dict(event))
        if line is None:
            raise structlog.DropEvent
        return redacted(f"{PROGNAME}: {line}")

    def on_event(self, event: Event) -> None:
        """Print the line of a typed event of the daemon, if it has one."""
        line = self.event_line(event)
        if line is not None:
            print(redacted(f"{PROGNAME}: {line}"), file=sys.stderr, flush=True)

    def event_line(self, event: Event) -> str | None:  # noqa: PLR0911
        """pg_receivewal's words for a typed event; its LSNs are the event's numbers."""
        verbose = self.verbose > 0
        match event:
            case Failed() | GapDetected() | DiskFull() | Disconnected():
                return f"error: {event.error}"
            case Reconnecting():  # whole seconds of the delay as the log spells it
                return f"disconnected; waiting {round(round(event.delay, 2))} seconds to try " \
                    "again"
            case StreamingStarted() if verbose:
                return f"starting log streaming at {format_lsn(event.start_lsn)} (timeline " \
                    f"{event.timeline})"
            case SegmentCompleted() if verbose:
                return f"finished segment at {format_lsn(event.end_lsn)} (timeline " \
                    f"{event.timeline})"
            case TimelineSwitched() if verbose:
                return f"switched to timeline {event.timeline} at {format_lsn(event.start_lsn)}"
            case EndposReached() if verbose:
                return f"stopped log streaming at {format_lsn(event.lsn)} (timeline " \
                    f"{event.timeline})"
            case StopNoticed() if verbose:
                return "received interrupt signal, exiting"
            case SegmentFileRejected():
                return f'warning: segment file "{event.file}" {event.reason}, skipping'
            case SlotCreating() if verbose:
                return f'creating replication slot "{event.slot}"'
            case SlotDropping() if verbose:
                return f'dropping replication slot "{event.slot}"'
            case StreamingStarted() | SegmentCompleted() | TimelineSwitched() | \
                    EndposReached() | StopNoticed() | SlotCreating() | SlotDropping() | \
                    Stopped() | SlotExisted():
                return None
        if event.name is None:
            return None
        return self.other(event.level, event.name, event.log_fields())

    def message(self, level: str, ev: dict[str, Any]) -> str | None:
        """A log line, as pg_receivewal would word an event it has no words for (None: not
        printed)."""
        name = ev.pop("event")
        return self.other(level, name, ev)

    def other(self, level: str, name: str, fields: dict[str, Any]) -> str | None:
        """An event pg_receivewal has no words for: warnings and errors, and all with -vv."""
        if level in ("warning", "error", "critical"):
            return f"{level}: {name}: " + " ".join(f"{k}={v}" for k, v in fields.items())
        if self.verbose > 1:
            return f"{name}: " + " ".join(f"{k}={v}" for k, v in fields.items())
        return None


def run() -> NoReturn:
    """The ``pg_receivewal-streampack`` console script (also ``python -m
    receivewal.commands.pg_receivewal``)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
