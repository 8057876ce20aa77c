"""``receivewal backups -D ARCHIVE``: list an archive's backups, oldest first, one line each
(``--json``: a JSON list for scripts).

Each backup with its ID, start and end (time and LSN), timeline, bytes stored, compression,
whether it is sealed (``--encrypt-to``), its state in the catalog
(:class:`~receivewal.backup.catalog.EntryState`), the oldest point a recovery from it reaches
(its end: no target before it is consistent) and whether the archive holds its WAL (every
segment from its start through its end). Only the backups' records and the listing are read:
a sealed backup's record is plain, so no ``--identity`` is asked for.
:func:`receivewal.retention.summary.listed_backups` reads them, as ``status`` does.
"""

from __future__ import annotations

import json

import click

from receivewal.archive.view import ArchiveView
from receivewal.backup.record import BackupRecord, utc_text
from receivewal.check.sizes import human_bytes
from receivewal.commands import catalog
from receivewal.commands.clickoptions import click_option
from receivewal.errors import ReceivewalError
from receivewal.retention.summary import ListedBackup, listed_backups
from receivewal.secrets import redacted
from receivewal.wal.lsn import format_lsn


@click.command("backups")
@click_option(catalog.DIRECTORY.but(required=True, metavar="ARCHIVE"))
@click_option(catalog.JSON.but(help="Print the backups as a JSON list."))
def backups_command(directory: str, as_json: bool) -> None:
    """List the archive's backups, oldest first: when, how big, their state, the oldest
    point each recovers to, and whether the archive holds its WAL."""
    try:
        listed = listed_backups(ArchiveView.open(str(directory)))
    except (ReceivewalError, OSError) as exc:
        raise click.ClickException(redacted(f"{directory}: {exc}")) from exc
    if as_json:
        click.echo(json.dumps([backup_document(b) for b in listed], indent=2))
    elif not listed:
        click.echo("no backups")
    else:
        for backup in listed:
            click.echo(backup_line(backup))


def state_name(backup: ListedBackup) -> str:
    """The backup's state as one word (the catalog's state's name)."""
    return backup.entry.state.name.lower()


def compression_of(record: BackupRecord) -> str:
    """How the backup's archives are compressed: one method, several joined, or "none"."""
    methods = sorted({a.compression for a in record.archives if a.compression})
    return "+".join(methods) or "none"


def backup_line(backup: ListedBackup) -> str:
    """The backup as one line."""
    entry, record = backup.entry, backup.entry.record
    if record is None:
        return f"{entry.backup_id}  {state_name(backup)}: {entry.describe()}"
    sealed = "sealed" if record.encrypted_to else "plain"
    wal = "WAL held" if backup.wal_held else "WAL missing"
    return (f"{entry.backup_id}  start {utc_text(record.start_time)} "
            f"{format_lsn(record.start_lsn)}  end {utc_text(record.end_time)} "
            f"{format_lsn(record.end_lsn)}  timeline {record.timeline}  "
            f"{human_bytes(record.stored_bytes)}  {compression_of(record)}  {sealed}  "
            f"{state_name(backup)}  recovers from {format_lsn(record.end_lsn)}  {wal}")


def backup_document(backup: ListedBackup) -> dict[str, object]:
    """The backup for ``--json``."""
    entry, record = backup.entry, backup.entry.record
    document: dict[str, object] = {"backup_id": entry.backup_id, "state": state_name(backup),
                                   "problem": entry.problem or None}
    if record is None:
        return {**document, "wal_held": None}
    return {
        **document,
        "label": record.label,
        "start_time": utc_text(record.start_time), "start_lsn": format_lsn(record.start_lsn),
        "end_time": utc_text(record.end_time), "end_lsn": format_lsn(record.end_lsn),
        "timeline": record.timeline, "end_timeline": record.end_timeline,
        "stored_bytes": record.stored_bytes, "database_bytes": record.database_bytes,
        "compression": compression_of(record), "sealed": bool(record.encrypted_to),
        "oldest_recovery_point": {"lsn": format_lsn(record.end_lsn),
                                  "time": utc_text(record.end_time)},
        "wal_held": backup.wal_held,
    }
