"""The recovery settings a recovered data directory gets, as text (pure).

``restore_command`` points back at the archive through ``receivewal restore``: the archive's
path is quoted for the shell that runs the command and its ``%`` doubled (PostgreSQL expands
``%f``, ``%p``, ``%r`` and ``%%`` in it). The settings are appended to ``postgresql.auto.conf``
with each value quoted as ALTER SYSTEM writes it (a quote or a backslash doubled); a value that
holds a newline or a zero byte is refused. ``recovery_target_timeline`` is left at its default
(``latest``) unless the target names one; ``recovery_target_action`` is written with any target.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from receivewal.backup.choice import RecoveryTarget, TargetKind
from receivewal.backup.record import utc_text
from receivewal.errors import ConfigurationError
from receivewal.wal.lsn import format_lsn

ACTIONS = ("promote", "pause", "shutdown")
MARK = "# added by receivewal recover"


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
    settings = [("restore_command", command)]
    if target.kind is TargetKind.IMMEDIATE:
        settings.append(("recovery_target", "immediate"))
    elif target.time is not None:
        settings.append(("recovery_target_time", utc_text(target.time)))
    elif target.lsn is not None:
        settings.append(("recovery_target_lsn", format_lsn(target.lsn)))
    elif target.xid is not None:
        settings.append(("recovery_target_xid", str(target.xid)))
    elif target.name is not None:
        settings.append(("recovery_target_name", target.name))
    if target.timeline is not None:
        settings.append(("recovery_target_timeline", str(target.timeline)))
    if target.kind is not TargetKind.LATEST:
        settings.append(("recovery_target_action", action))
    return settings


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
