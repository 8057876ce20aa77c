"""The recovery settings a recovered data directory gets, as text (pure).

``restore_command`` points back at the archive through ``receivewal restore``: the archive's
path is quoted for the shell that runs the command and its ``%`` doubled (PostgreSQL expands
``%f``, ``%p``, ``%r`` and ``%%`` in it). The settings are appended to ``postgresql.auto.conf``
with each value quoted as ALTER SYSTEM writes it (a quote or a backslash doubled); a value that
holds a newline or a zero byte is refused.

A recovery's outcome is decided by recover's block alone, whatever the backup holds: a backup
of a server that was itself recovered carries that recovery's ``restore_command`` and target
in its ``postgresql.auto.conf`` (PostgreSQL ignores them without ``recovery.signal``), and they
would stop this recovery at the old target. :func:`without_recovery_settings` drops every line
of :data:`RECOVERY_SETTINGS` from the backup's ``postgresql.auto.conf``, and the block writes
each of them, those it does not use empty (their default): PostgreSQL reads
``postgresql.auto.conf`` after ``postgresql.conf`` and whatever it includes, and takes the last
occurrence of a setting, so the same settings in those files are overridden, not applied (the
target kinds not used come first and the one used last: PostgreSQL refuses a second kind set
after another).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from receivewal.backup.record import utc_text
from receivewal.errors import ConfigurationError
from receivewal.recovery.choice import RecoveryTarget, TargetKind
from receivewal.wal.lsn import format_lsn

ACTIONS = ("promote", "pause", "shutdown")
MARK = "# added by receivewal recover"
#: The settings recover decides, every one written by its block: what a recovered server's
#: backup inherits of them is removed from ``postgresql.auto.conf``.
TARGET_KINDS = ("recovery_target", "recovery_target_time", "recovery_target_xid",
                "recovery_target_lsn", "recovery_target_name")
RECOVERY_SETTINGS = ("restore_command", *TARGET_KINDS, "recovery_target_inclusive",
                     "recovery_target_timeline", "recovery_target_action",
                     "recovery_end_command", "archive_cleanup_command", "primary_conninfo",
                     "primary_slot_name")
# a configuration line's name, as PostgreSQL's lexer reads one (case does not matter)
_NAME = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_$.]*)\s*(?:=|\s|'|$)")
_INCLUDE = re.compile(r"\s*(include_if_exists|include_dir|include)(?![A-Za-z0-9_$.])"
                      r"\s*=?\s*(?:'([^']*)'|([^\s#']+))", re.IGNORECASE)


def restore_command(prefix: str, archive: str, identity: str | None = None) -> str:
    """``prefix -D ARCHIVE [--identity FILE] %f %p``: ``prefix`` runs ``receivewal restore``
    (e.g. ``receivewal restore`` or ``/usr/bin/python3 -m receivewal restore``); ``identity``
    (absolute) decrypts an encrypted WAL archive."""
    def quoted(value: str) -> str:
        return shlex.quote(value).replace("%", "%%")

    key = f" --identity {quoted(identity)}" if identity is not None else ""
    return f"{prefix} -D {quoted(archive)}{key} %f %p"


def recovery_settings(target: RecoveryTarget, action: str, command: str
                      ) -> list[tuple[str, str]]:
    """The settings, in order, for a recovery to ``target`` ending with ``action``."""
    if action not in ACTIONS:
        raise ConfigurationError(f"invalid target action {action!r}: one of "
                                 f"{', '.join(ACTIONS)}")
    chosen: tuple[str, str] | None = None
    if target.kind is TargetKind.IMMEDIATE:
        chosen = ("recovery_target", "immediate")
    elif target.time is not None:
        chosen = ("recovery_target_time", utc_text(target.time))
    elif target.lsn is not None:
        chosen = ("recovery_target_lsn", format_lsn(target.lsn))
    elif target.xid is not None:
        chosen = ("recovery_target_xid", str(target.xid))
    elif target.name is not None:
        chosen = ("recovery_target_name", target.name)
    settings = [("restore_command", command)]
    settings += [(name, "") for name in ("recovery_end_command", "archive_cleanup_command",
                                         "primary_conninfo", "primary_slot_name")]
    # the kinds not used first, empty: PostgreSQL refuses a second kind set after another
    settings += [(name, "") for name in TARGET_KINDS if chosen is None or name != chosen[0]]
    if chosen is not None:
        settings.append(chosen)
    settings += [("recovery_target_inclusive", "on"),
                 ("recovery_target_timeline", "latest" if target.timeline is None
                  else str(target.timeline))]
    if target.kind is not TargetKind.LATEST:
        settings.append(("recovery_target_action", action))
    else:  # without a target PostgreSQL ignores it: written only to override an inherited one
        settings.append(("recovery_target_action", "promote"))
    return settings


#: What ``recover --setting`` may not set: what recover itself decides.
DECIDED = ("restore_command", *TARGET_KINDS, "recovery_target_inclusive",
           "recovery_target_timeline", "recovery_target_action")
_SETTING = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*")


def parse_extra_setting(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` of ``recover --setting`` (as pgBackRest's ``--recovery-option``): the
    name in lower case; ConfigurationError for a malformed one, or one recover decides."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not _SETTING.fullmatch(name):
        raise ConfigurationError(f"--setting {text[:80]!r}: not NAME=VALUE with a setting's name "
                                 "(e.g. --setting port=5433)")
    if name.lower() in DECIDED or name.lower().startswith("recovery_target"):
        raise ConfigurationError(f"--setting {name}: recover sets {name.lower()} itself (give "
                                 "the target with --target-*, the program with "
                                 "--restore-command-prefix)")
    quote_setting(value)  # a line break or a zero byte: refused now
    return name.lower(), value


def with_extra_settings(settings: list[tuple[str, str]], extra: tuple[tuple[str, str], ...]
                        ) -> list[tuple[str, str]]:
    """recover's block with ``--setting`` values: one recover writes empty (a
    ``primary_conninfo``, a ``recovery_end_command``) takes the value in place, any other is
    appended, the last given of a name winning."""
    chosen = dict(extra)
    block = [(name, chosen.pop(name, value)) for name, value in settings]
    return block + list(chosen.items())


def setting_name(line: str) -> str | None:
    """The setting a configuration file's line sets, in lower case (PostgreSQL's names are
    case-insensitive); None for a blank or comment line."""
    match = _NAME.match(line)
    return None if match is None else match.group(1).lower()


def without_recovery_settings(text: str) -> tuple[str, list[str]]:
    """``postgresql.auto.conf``'s ``text`` without the lines that set one of
    :data:`RECOVERY_SETTINGS` (and without an earlier recover's mark); what is left, and the
    lines removed (as they were)."""
    kept: list[str] = []
    removed: list[str] = []
    for line in text.splitlines(keepends=True):
        if setting_name(line) in RECOVERY_SETTINGS:
            removed.append(line.rstrip("\r\n"))
        elif line.rstrip("\r\n") != MARK:
            kept.append(line)
    return "".join(kept), removed


def recovery_lines(text: str) -> list[tuple[int, str]]:
    """The lines (number, text) of a configuration file that set one of
    :data:`RECOVERY_SETTINGS`."""
    return [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1)
            if setting_name(line) in RECOVERY_SETTINGS]


def include_directives(text: str) -> list[tuple[str, str]]:
    """The ``include``, ``include_if_exists`` and ``include_dir`` lines of a configuration
    file: (directive in lower case, the path as written)."""
    return [(m.group(1).lower(), m.group(2) or m.group(3)) for m in
            (_INCLUDE.match(line) for line in text.splitlines()) if m is not None]


def quote_setting(value: str) -> str:
    """A configuration file's string value, as ALTER SYSTEM writes one."""
    if "\n" in value or "\r" in value or "\0" in value:
        raise ConfigurationError(f"a setting cannot hold a line break or a zero byte: "
                                 f"{value[:80]!r}")
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def auto_conf_lines(settings: list[tuple[str, str]]) -> str:
    """The lines appended to ``postgresql.auto.conf``."""
    return MARK + "\n" + "".join(f"{name} = {quote_setting(value)}\n" for name, value in settings)


def start_instructions(pgdata: Path, tablespaces: list[Path]) -> str:
    """How to start the recovered server, for the operator."""
    owner = [str(pgdata), *map(str, tablespaces)]
    return "\n".join([
        f"The backup is unpacked in {pgdata}, with recovery.signal and the recovery settings "
        "in postgresql.auto.conf.",
        "Check that the server's user owns these directories (mode 0700): "
        + " ".join(shlex.quote(p) for p in owner),
        "and that it can run the restore_command. Then start the server as that user:",
        f"    pg_ctl -D {shlex.quote(str(pgdata))} -l {shlex.quote(str(pgdata))}/recovery.log "
        "start",
        "It replays the archive's WAL up to the target and then does what "
        "recovery_target_action says (without a target: to the end of the archive, then "
        "promotes).",
    ])
