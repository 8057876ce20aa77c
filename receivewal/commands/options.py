"""The options of ``receivewal stream`` and the pg_receivewal drop-in, each declared once, and
the Settings they make.

One field of :class:`StreamOptions` per option: the field's name is the option's destination,
its annotation the type of the parsed value, its default the default (Settings' own where the
value reaches Settings unchanged), and :func:`option` states the rest: spellings, help, the
``RECEIVEWAL_*`` environment variable, the :class:`Settings` field it reaches (and how, when
not as it is) and its place in pg_receivewal's command line. ``stream``'s click options and
the drop-in's getopt tables are built from these fields, :func:`build_settings` turns the
parsed values into Settings from them, and the tests walk them. Adding an option is one field
here (and its Settings field).

No click here: ``stream`` builds the click options, the drop-in its getopt tables.
"""

from __future__ import annotations

import getpass
import operator
import sys
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, get_type_hints

from receivewal.addresses import parse_address
from receivewal.archive.compression import parse_compress_option
from receivewal.archive.keeplocal import KEEP_ALL, parse_keep_local
from receivewal.commands import catalog
from receivewal.commands.plain import Option
from receivewal.daemon.settings import CONFIRM_AFTER, Settings
from receivewal.errors import ConfigurationError
from receivewal.replication.connection import build_conninfo, conninfo_options
from receivewal.replication.negotiation import parse_compression_list, with_streampack_option

if TYPE_CHECKING:
    from receivewal.archive.recipients import RecipientSet

T = TypeVar("T")
CONNECTION = "conninfo"  # the Settings field several options make together (with_connection)


class Lsn(int):
    """An LSN the command line gave, parsed (a type of its own for the parsers: an ``int``
    option is a count)."""


class Repeated(tuple[str, ...]):
    """The values of an option given any number of times (``--encrypt-to``); its variable
    holds them separated by whitespace."""


def encrypt_to_recipients(values: tuple[str, ...]) -> RecipientSet | None:
    """--encrypt-to's recipients as a set (None: not given), each checked before connecting
    (KeyFileError, a ConfigurationError, naming a bad one): stream's, logical's and
    backup's."""
    if not values:
        return None
    from receivewal.archive.encryption import recipients_of  # noqa: PLC0415 - pyrage, if used

    return recipients_of(values)


def _checked_address(text: str | None) -> str | None:
    """--metrics-address as given, once it parses: a bad address fails before connecting."""
    if text:
        parse_address(text)
    return text


def _none_if_empty(text: str | None) -> str | None:
    return text or None


@dataclass(frozen=True)
class OptionSpec:
    """What the command lines say about one option (its type and default are the field's)."""

    long: str  # "--slot"; an on/off pair is "--on/--off"
    short: str  # "-S", or ""
    help: str  # stream's --help text
    env: bool  # stream also reads it from RECEIVEWAL_<LONG_OPTION>
    setting: str | None  # the Settings field it reaches; None: the command itself uses it
    show_default: bool  # stream's --help shows the default
    choices: tuple[str, ...]  # the only values accepted (a str option)
    example: str  # a text value it accepts, for the tests built from this table
    goes_with: tuple[str, ...]  # argv words it is refused without, e.g. ("--create-slot",)
    pg_receivewal: int  # its place in pg_receivewal 15's long_options[]; 0: not a pg option
    to_setting: Callable[[Any], object] | None  # the value as its Settings field's; None: as is

    @property
    def names(self) -> tuple[str, ...]:
        """Every spelling: the short one, then the long one(s)."""
        return tuple(name for name in (self.short, *self.long.split("/")) if name)

    @property
    def env_var(self) -> str | None:
        """RECEIVEWAL_<LONG_OPTION>, e.g. RECEIVEWAL_SLOT; None when the option has none."""
        long = self.long.split("/")[0].removeprefix("--")
        return "RECEIVEWAL_" + long.replace("-", "_").upper() if self.env else None


def option(default: T, long: str, short: str = "", *, help: str, setting: str | None,
           env: bool = True, show_default: bool = False,
           choices: tuple[str, ...] = (), example: str = "", goes_with: tuple[str, ...] = (),
           pg_receivewal: int = 0, to_setting: Callable[[Any], object] | None = None) -> T:
    """A :class:`StreamOptions` field: its default, and its :class:`OptionSpec` as metadata
    (``setting`` is always stated: the tests check that the option reaches it;
    ``to_setting`` turns the value into the field's, raising ConfigurationError for a value
    that does not parse)."""
    spec = OptionSpec(long, short, help, env, setting, show_default, choices, example, goes_with,
                      pg_receivewal, to_setting)
    return field(default=default, metadata={"option": spec})


def shared(row: Option, default: T, *, help: str | None = None, **spec: Any) -> T:
    """A :class:`StreamOptions` field for the catalog's ``row``
    (:mod:`receivewal.commands.catalog`): its spellings, its variable (``RECEIVEWAL_<LONG>``,
    as the row names it) and its help unless ``help`` is this command's own; ``spec`` as for
    :func:`option`."""
    short = next((name for name in row.names if not name.startswith("--")), "")
    long = next(name for name in row.names if name.startswith("--"))
    return option(default, long, short, help=row.help if help is None else help,
                  env=row.env is not None, **spec)


@dataclass(frozen=True)
class StreamOptions:
    """The stream command line as parsed (by click in ``stream``, by getopt in the drop-in), in
    the order of ``receivewal stream --help``.

    Values are as the command line gave them, an LSN parsed (each command line has its own
    rule for one); :func:`build_settings` turns them into :class:`Settings`.
    """

    directory: Path | None = shared(
        catalog.DIRECTORY, None, setting="directory", pg_receivewal=1,
        help="Receive WAL files into this directory (it must exist).")
    dbname: str | None = shared(
        catalog.DBNAME, None, setting=CONNECTION, example="application_name=probe",
        pg_receivewal=2)
    host: str | None = shared(
        catalog.HOST, None, setting=CONNECTION, example="db1.example", pg_receivewal=4)
    port: str | None = shared(
        catalog.PORT, None, setting=CONNECTION, example="5433", pg_receivewal=5)
    username: str | None = shared(
        catalog.USERNAME, None, setting=CONNECTION, example="probe", pg_receivewal=6)
    no_password: bool = shared(
        catalog.NO_PASSWORD, False, setting=None, pg_receivewal=8)  # the prompt
    force_password: bool = shared(
        catalog.PASSWORD, False, setting=CONNECTION, pg_receivewal=9)
    slot: str | None = shared(
        catalog.SLOT, None, setting="slot", example="probe_slot", pg_receivewal=11)
    create_slot: bool = option(
        False, "--create-slot", env=False, setting="create_slot", pg_receivewal=14,
        help="Create the slot and exit.")
    drop_slot: bool = option(
        False, "--drop-slot", env=False, setting="drop_slot", pg_receivewal=15,
        help="Drop the slot and exit.")
    if_not_exists: bool = option(
        False, "--if-not-exists", env=False, setting="if_not_exists", pg_receivewal=16,
        help="With --create-slot: no error when the slot exists.")
    reserve_wal: bool = option(
        False, "--reserve-wal", setting="reserve_wal", goes_with=("--create-slot",),
        help="Slots created here reserve WAL at once (restart_lsn is set).")
    create_slot_if_missing: bool = option(
        False, "--create-slot-if-missing", setting="create_slot_if_missing",
        help="Create the slot (reserving WAL) when the server lacks it.")
    status_interval: float = option(
        Settings.status_interval, "--status-interval", "-s", setting="status_interval",
        show_default=True, pg_receivewal=10,
        help="Seconds between status packets to the server (0: only when asked).")
    synchronous: bool = option(
        False, "--synchronous", setting="synchronous", pg_receivewal=17,
        help="Flush WAL to disk and report it after every batch received.")
    no_sync: bool = shared(
        catalog.NO_SYNC, not Settings.sync, setting="sync", to_setting=operator.not_,
        pg_receivewal=18)
    endpos: Lsn | None = option(
        None, "--endpos", "-E", setting="endpos", example="0/3000000", pg_receivewal=3,
        help="Exit 0 once WAL up to this LSN is received.")
    no_loop: bool = option(
        Settings.no_loop, "--no-loop", "-n", setting="no_loop", pg_receivewal=7,
        help="Exit 1 on connection loss instead of reconnecting.")
    wait_for_server: bool = option(
        Settings.wait_for_server, "--wait-for-server", setting="wait_for_server",
        help="Keep trying the first connection (with the reconnect backoff) instead of "
        "exiting 1 as pg_receivewal does; for services.")
    verbose: int = shared(
        catalog.VERBOSE, 0, setting=None, pg_receivewal=12)  # the logging
    compress: str = shared(
        catalog.COMPRESS, "none", setting="at_rest", to_setting=parse_compress_option,
        show_default=True, example="lz4", pg_receivewal=13)
    compression: str = shared(
        catalog.COMPRESSION, ",".join(Settings.compression), setting="compression",
        to_setting=parse_compression_list, show_default=True, example="lz4")
    hot_standby_feedback: bool = option(
        Settings.hot_standby_feedback, "--hot-standby-feedback/--no-hot-standby-feedback",
        setting="hot_standby_feedback", show_default=True,
        help="Send hot standby feedback that holds nothing back (clears a slot's xmin).")
    receive_timeout: float = option(
        Settings.receive_timeout, "--receive-timeout", setting="receive_timeout",
        show_default=True,
        help="Drop the connection after this many seconds of silence (0: never).")
    reconnect_delay: float = option(
        Settings.reconnect_delay, "--reconnect-delay", setting="reconnect_delay",
        show_default=True,
        help="First pause before reconnecting; doubles up to --reconnect-delay-max.")
    reconnect_delay_max: float = option(
        Settings.reconnect_delay_max, "--reconnect-delay-max", setting="reconnect_delay_max",
        show_default=True,
        help="Longest pause between reconnect attempts, in seconds.")
    metrics_address: str | None = shared(
        catalog.METRICS_ADDRESS, Settings.metrics_address, setting="metrics_address",
        to_setting=_checked_address, example="127.0.0.1:9187")
    log_format: str = shared(
        catalog.LOG_FORMAT, "auto", setting=None, choices=("auto", "json", "console"))
    progress: bool = shared(
        catalog.PROGRESS.long_only(), Settings.progress, setting="progress",
        help="Keep a progress line on the terminal (also with -v): received LSN, "
        "server WAL end, MB/s, compression ratio, ETA. Never with JSON logs or off a "
        "terminal.")
    upload_to: str | None = option(
        Settings.upload_to, "--upload-to", setting="upload_to", to_setting=_none_if_empty,
        example="s3://example-wal/db1",
        help="Upload each completed segment and history file, as it sits on disk (-Z), to "
        "PREFIX/<file name> in object storage (s3://BUCKET/PREFIX; endpoint and credentials "
        "from boto3's standard AWS_* chain). Nothing local is deleted unless --keep-local "
        "says so.")
    confirm_after: str = option(
        Settings.confirm_after, "--confirm-after", setting="confirm_after", show_default=True,
        choices=CONFIRM_AFTER, goes_with=("--upload-to", "s3://example-wal/db1"),
        help="What the flush position reported to the server waits for: disk (fsynced "
        "locally, as pg_receivewal) or upload (in the bucket too: the slot keeps WAL while "
        "the store is down, so pg_wal grows meanwhile).")
    upload_wait: float = option(
        Settings.upload_wait, "--upload-wait", setting="upload_wait", show_default=True,
        help="At an exit no signal asked for (--endpos, --no-loop), wait at most this many "
        "seconds for the completed files to be uploaded; exit 1 naming what is left.")
    keep_local: str = option(
        KEEP_ALL, "--keep-local", setting="keep_local", to_setting=parse_keep_local,
        show_default=True, example="24h", goes_with=("--upload-to", "s3://example-wal/db1"),
        help="With --upload-to: what the directory keeps of the uploaded segments, the last "
        "AGE (36h, 7d) or SIZE (10GB, 500MB); the daemon removes older ones once the bucket "
        "holds them, never a segment still to upload, nor what a slot or a backup being "
        "written needs. all: nothing is removed, as pg_receivewal.")
    encrypt_to: Repeated = shared(
        catalog.ENCRYPT_TO, Repeated(), setting="encrypt_to", to_setting=encrypt_to_recipients,
        example="age1yhd36h9xfajltu60vfwrg0r98v9529vkn98u4n2vyac40wnjpqwse0zlew")


@cache
def declared_options(cls: type = StreamOptions,
                     ) -> tuple[tuple[Field[object], OptionSpec, type], ...]:
    """Each option of ``cls`` (stream's, or another command's declared the same way) in
    declaration order: its field, its spec and the type of its value (``Path | None`` gives
    Path; a bool is a flag, an int a count, a float seconds)."""
    hints = get_type_hints(cls)
    return tuple((f, f.metadata["option"], _value_type(hints[f.name])) for f in fields(cls))


def same_option(name: str, **changes: Any) -> Any:
    """Another command's field for ``stream``'s option ``name``: the same default and
    declaration, with ``changes`` to its spec (e.g. its help)."""
    declared = {f.name: f for f in fields(StreamOptions)}[name]
    spec = replace(declared.metadata["option"], **changes)
    return field(default=declared.default, metadata={"option": spec})


def _value_type(hint: object) -> type:
    """The non-None member of an annotation (``str | None`` -> str)."""
    members = [m for m in getattr(hint, "__args__", (hint,)) if m is not type(None)]
    assert len(members) == 1, hint
    assert isinstance(members[0], type), hint
    return members[0]


def takes_value(kind: type) -> bool:
    """Whether an option of this value type takes an argument (flags and counts do not)."""
    return kind not in (bool, int)


def options_from(values: Mapping[str, object], base: StreamOptions | None = None,
                 ) -> StreamOptions:
    """``base`` (the defaults) with the parsed ``values``, each checked against its declared
    type: the one place where the command line's untyped values become typed."""
    return replace(base or StreamOptions(), **typed_values(StreamOptions, values))


def typed_values(cls: type, values: Mapping[str, object]) -> dict[str, Any]:
    """The parsed ``values`` of ``cls``'s options, each checked against its declared type:
    the one place where a command line's untyped values become typed."""
    known = {f.name: kind for f, _, kind in declared_options(cls)}
    checked: dict[str, Any] = {}  # Any only once each value is checked against its field
    for name, given in values.items():
        kind = known.get(name)
        value = Repeated(given) if kind is Repeated and isinstance(given, tuple | list) \
            else given
        if kind is None or not (isinstance(value, kind) or value is None):
            raise TypeError(f"option {name}: {value!r} is not a {kind}")
        checked[name] = value
    return checked


class CommonOptions(Protocol):
    """What every daemon command line has, as :class:`StreamOptions` declares it: the
    connection and the log format."""

    @property
    def dbname(self) -> str | None: ...
    @property
    def host(self) -> str | None: ...
    @property
    def port(self) -> str | None: ...
    @property
    def username(self) -> str | None: ...
    @property
    def no_password(self) -> bool: ...
    @property
    def force_password(self) -> bool: ...
    @property
    def log_format(self) -> str: ...


def json_logs(opts: CommonOptions) -> bool:
    """--log-format, with auto meaning JSON unless stderr is a terminal."""
    return opts.log_format == "json" or (opts.log_format == "auto" and not sys.stderr.isatty())


def build_settings(opts: StreamOptions) -> Settings:
    """Turn parsed options into validated Settings (raises ConfigurationError): the values,
    the first that does not parse refused; the connection string; :meth:`Settings.validate`.
    """
    values, refused = setting_values(opts)
    if refused is not None:
        raise refused
    return with_connection(Settings(conninfo="", **values), opts).validate()


def setting_values(opts: CommonOptions) -> tuple[dict[str, Any], ConfigurationError | None]:
    """Each option's value as the Settings field its declaration names (through its
    ``to_setting``), the connection string aside (:func:`with_connection`); and the first
    value, in declaration order, that does not parse (its field then keeps Settings'
    default, so that the drop-in can judge the combination first, as pg_receivewal does)."""
    values: dict[str, Any] = {}  # Settings' fields, each from its option's declared type
    refused: ConfigurationError | None = None
    for fld, spec, _ in declared_options(type(opts)):
        if spec.setting is None or spec.setting == CONNECTION:
            continue
        value = getattr(opts, fld.name)
        if spec.to_setting is not None:
            try:
                value = spec.to_setting(value)
            except ConfigurationError as exc:
                refused = refused or exc
                continue
        values[spec.setting] = value
    values["progress"] = values["progress"] and sys.stderr.isatty() and not json_logs(opts)
    return values, refused


PROMPT = "Password: "


def read_password() -> str:
    """-W's prompt, as pg_receivewal's: on the terminal; without one, on standard error and
    read from standard input; at the end of the input, an empty password (the server then
    says it needs one)."""
    try:
        with open("/dev/tty", "rb"):
            pass
    except OSError:
        sys.stderr.write(PROMPT)
        sys.stderr.flush()
        line = sys.stdin.readline()
        sys.stderr.write("\n")
        return line.removesuffix("\n")
    try:
        return getpass.getpass(PROMPT)
    except EOFError:
        return ""


def prompt_password() -> str | None:
    """The prompt when the server wants a password the connection string lacks (``-w``
    turns it off), as pg_receivewal's: on the terminal only (None without one); what
    stream, logical, the drop-in and backup hand the connection."""
    if not sys.stdin.isatty():
        return None
    return getpass.getpass(PROMPT)


def with_connection(settings: Settings, opts: CommonOptions, *, replication: str = "true",
                    session: str | None = None) -> Settings:
    """``settings`` with the connection string the options make: -d, -h, -p, -U, the
    password -W prompts for, the ``session`` settings (``-c name=value`` words, before the
    user's own options), and pg_streampack's option asking for ``settings.compression``;
    ``replication`` is ``true``, or ``database`` for a logical slot. Raises
    ConfigurationError for a connection string libpq refuses."""
    password = None
    if opts.force_password and not opts.no_password:
        password = read_password()
    base = build_conninfo(opts.dbname, host=opts.host, port=opts.port, user=opts.username,
                          password=password, replication=replication)
    options = conninfo_options(base)
    if session:
        options = f"{session} {options}" if options else session
    options = with_streampack_option(options, settings.compression)
    return replace(settings, conninfo=build_conninfo(base, options=options,
                                                     replication=replication)
                   if options else base)
