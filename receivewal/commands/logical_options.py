"""The options of ``receivewal logical``, each declared once, and the LogicalSettings they make.

Declared as ``stream``'s are (:mod:`receivewal.commands.options`): one field of
:class:`LogicalOptions` per option, with its spellings, help, ``RECEIVEWAL_*`` environment
variable and the settings field it reaches. The options the two commands share are ``stream``'s
own declarations (:func:`~receivewal.commands.options.same_option`); those that reach a field
of :class:`~receivewal.daemon.settings.Settings` go to the daemon's settings, the others to
:class:`~receivewal.logicalreceiver.logicalsettings.LogicalSettings`.

No click here: ``receivewal logical`` builds its click options from these declarations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from receivewal.archive.compression import CompressSpec, parse_compress_option
from receivewal.commands import catalog
from receivewal.commands.options import (
    Lsn,
    Repeated,
    option,
    same_option,
    setting_values,
    shared,
    with_connection,
)
from receivewal.daemon.settings import Settings
from receivewal.errors import ConfigurationError
from receivewal.logical.consumer import PLUGINS
from receivewal.logical.pgoutput import STREAMING_MODES
from receivewal.logical.store import DEFAULT_FILE_SIZE
from receivewal.logicalreceiver.logicalsettings import ORIGINS, SESSION_OPTIONS, LogicalSettings

_SIZE = re.compile(r"^\s*(\d+)\s*(|B|kB|MB|GB)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30}


def parse_file_size(text: str) -> int:
    """--file-size: bytes, or a number with kB, MB or GB (1024-based, as PostgreSQL's)."""
    match = _SIZE.match(text)
    if match is None:
        raise ConfigurationError(f'invalid --file-size "{text}": a number of bytes, or with '
                                 "kB, MB or GB (e.g. 64MB)")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def parse_files_compression(text: str) -> CompressSpec:
    """-Z for change files: zstd[:LEVEL] or none."""
    return parse_compress_option(text, change_files=True)


def parse_publications(text: str) -> tuple[str, ...]:
    """-P: publication (or replication set) names, comma-separated, each as written."""
    names = tuple(name.strip() for name in text.split(",")) if text else ()
    if any(not name for name in names):
        raise ConfigurationError(f'invalid publication list "{text}": an empty name')
    return names


def parse_proto_version(text: str | None) -> int | None:
    return int(text) if text else None


@dataclass(frozen=True)
class LogicalOptions:
    """The logical command line as parsed, in the order of ``receivewal logical --help``."""

    directory: Path | None = same_option(
        "directory", help="Write the change log into this directory (it must exist).")
    dbname: str | None = same_option(
        "dbname", help="Connection string or URI; it names the database (dbname=...).")
    host: str | None = same_option("host")
    port: str | None = same_option("port")
    username: str | None = same_option("username")
    no_password: bool = same_option("no_password")
    force_password: bool = same_option("force_password")
    slot: str | None = same_option("slot", help="Logical replication slot to stream from.")
    publication: str = option(
        "", "--publication", "-P", setting="publications", to_setting=parse_publications,
        example="app,audit",
        help="Publications to stream (pgoutput), or replication sets (pglogical_output), "
        "comma-separated.")
    plugin: str = option(
        "pgoutput", "--plugin", setting="plugin", choices=PLUGINS, show_default=True,
        help="The slot's output plugin.")
    create_slot: bool = same_option(
        "create_slot", help="Create the logical slot (with --plugin, --two-phase) and exit.")
    drop_slot: bool = same_option("drop_slot")
    if_not_exists: bool = same_option("if_not_exists")
    snapshot: bool = option(
        False, "--snapshot", setting="snapshot", goes_with=("--create-slot",),
        help="With --create-slot: copy every table of the publications, as of the slot's "
        "consistent point, into DIRECTORY/snapshot/ before the first change (the snapshot "
        "and the change log together rebuild the tables).")
    proto_version: str | None = option(
        None, "--proto-version", setting="proto_version", choices=("1", "2", "3", "4"),
        to_setting=parse_proto_version,
        help="pgoutput protocol version (default: the highest the server speaks: 1 before "
        "PostgreSQL 14, 2 on 14, 3 on 15, 4 from 16).")
    streaming: str | None = option(
        None, "--streaming", setting="streaming", choices=STREAMING_MODES,
        help="Stream large transactions while in progress: off, on (protocol 2+), parallel "
        "(4+). Default: on where the protocol version allows it.")
    two_phase: bool = option(
        False, "--two-phase", setting="two_phase",
        help="Decode prepared transactions at PREPARE (protocol 3+; slots created here get "
        "TWO_PHASE).")
    binary: bool = option(
        False, "--binary", setting="binary",
        help="Ask for values in binary; the common types are written as the same text.")
    messages: bool = option(
        False, "--messages", setting="messages",
        help="Keep logical decoding messages (pg_logical_emit_message).")
    origin: str | None = option(
        None, "--origin", setting="origin", choices=ORIGINS,
        help="Changes from any origin, or only those with none (PostgreSQL 16).")
    accept_gap: bool = option(
        False, "--accept-gap", setting="accept_gap",
        help="When the slot was confirmed past the end of the change log (its files damaged "
        "or removed, the slot created again), go on from the slot and record the gap in the "
        "log as a line of its own (op gap) instead of refusing to start. Give it once, for "
        "the start that needs it.")
    status_interval: float = same_option("status_interval")
    no_sync: bool = same_option(
        "no_sync",
        help="Do not fsync (testing only: a crash can lose changes the slot moved past).")
    endpos: Lsn | None = same_option(
        "endpos", help="Exit 0 once a message or keepalive at or past this LSN arrived "
        "(transactions committed by then are written).")
    no_loop: bool = same_option("no_loop")
    wait_for_server: bool = same_option("wait_for_server")
    verbose: int = same_option("verbose")
    compress: str = shared(
        catalog.COMPRESS, "none", setting="files_compression",
        to_setting=parse_files_compression, show_default=True, example="zstd",
        help="Compress completed change files at rest: zstd[:LEVEL] (.jsonl.zst) or none.")
    file_size: str = option(
        "64MB", "--file-size", setting="file_size", to_setting=parse_file_size,
        show_default=True, example="1MB",
        help="Complete a change file once it reaches this size (at a transaction's end).")
    encrypt_to: Repeated = same_option(
        "encrypt_to",
        help="Seal each completed change file to this age X25519 recipient (age1..., "
        "age-keygen's public key): P.jsonl[.zst] becomes P.jsonl[.zst].age beside "
        "P.jsonl[.zst].age.recipients; the .partial being written stays plain. Repeatable: "
        "any of the recipients decrypts. Needs pip install 'receivewal[encrypt]'.")
    upload_to: str | None = same_option(
        "upload_to",
        help="Upload each completed change file, as it sits in OUTDIR (-Z, --encrypt-to), to "
        "PREFIX/<file name> in object storage (s3://BUCKET/PREFIX; credentials from boto3's "
        "AWS_* chain), in order, create-only. Nothing local is deleted unless --keep-local "
        "says so.")
    keep_local: str = same_option(
        "keep_local",
        help="With --upload-to: what OUTDIR keeps of the change files uploaded and applied "
        "(the slot confirmed past them), the last AGE (36h, 7d) or SIZE (10GB, 500MB); older "
        "ones are removed, the newest always stays. all: nothing is removed.")
    compression: str = same_option("compression")
    receive_timeout: float = same_option("receive_timeout")
    reconnect_delay: float = same_option("reconnect_delay")
    reconnect_delay_max: float = same_option("reconnect_delay_max")
    metrics_address: str | None = same_option("metrics_address")
    log_format: str = same_option("log_format")
    progress: bool = same_option("progress")


assert parse_file_size(LogicalOptions.file_size) == DEFAULT_FILE_SIZE


def build_logical_settings(opts: LogicalOptions) -> LogicalSettings:
    """Turn parsed options into validated LogicalSettings (raises ConfigurationError): the
    values, the first that does not parse refused; the replication=database connection
    string with the change log's session settings; the checks."""
    values, refused = setting_values(opts)
    if refused is not None:
        raise refused
    shared = {f.name for f in fields(Settings)}
    base: dict[str, Any] = {name: value for name, value in values.items() if name in shared}
    own: dict[str, Any] = {name: value for name, value in values.items() if name not in shared}
    daemon = Settings(conninfo="", hot_standby_feedback=False, **base)  # a logical
    # walsender takes no hot standby feedback (pg_recvlogical sends none)
    daemon = with_connection(daemon, opts, replication="database", session=SESSION_OPTIONS)
    return LogicalSettings(base=daemon, **own).validate()
