"""One ``apply`` run: the snapshot's tables the target lacks, then the transactions it lacks.

The target says how far it got (:class:`~receivewal.apply.postgres.Progress`); everything at
or before that is passed over, everything after it is applied unit by unit, in order. With
``follow`` the run then waits for the log to grow and goes on until it is stopped; without,
it ends once it has applied all the log holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from receivewal.apply.postgres import PostgresTarget
from receivewal.apply.source import file_records, log_files, transactions
from receivewal.errors import ConfigurationError
from receivewal.logical.snapshot import read_manifest, table_records
from receivewal.wal.lsn import format_lsn

if TYPE_CHECKING:
    from receivewal.archive.encryption import Keys


@dataclass
class Applied:
    """What a run applied, and how far the target now holds the log."""

    tables: int = 0
    rows: int = 0
    transactions: int = 0
    through: int = 0

    def describe(self) -> str:
        return (f"applied {self.tables} snapshot tables ({self.rows} rows) and "
                f"{self.transactions} transactions; the target holds the change log through "
                f"{format_lsn(self.through)}")


def source_name(outdir: Path, keys: Keys | None) -> str:
    """The name the target keeps this log's progress under: its slot's. ConfigurationError
    when the directory holds no change log."""
    manifest = read_manifest(outdir)
    if manifest is not None:
        return manifest.slot
    for path in log_files(outdir):
        for record in file_records(path, keys):
            if record.get("op") == "header" and record.get("slot"):
                return str(record["slot"])
            break
    raise ConfigurationError(f"{outdir} holds no change log (no snapshot, no change file)")


def apply_log(outdir: Path, conninfo: str, *, keys: Keys | None = None, follow: bool = False,
              stopped: Callable[[], bool] = lambda: False, poll: float = 1.0,
              say: Callable[[str], None] = lambda line: None) -> Applied:
    """Apply what ``outdir``'s change log holds that the target at ``conninfo`` lacks."""
    if not outdir.is_dir():
        raise ConfigurationError(f"{outdir} is not a directory")
    applied = Applied()
    target = PostgresTarget(conninfo, source_name(outdir, keys))
    try:
        progress = target.progress()
        applied.through = progress.applied_through
        manifest = read_manifest(outdir)
        start = 0 if manifest is None else manifest.consistent_point
        if manifest is not None:
            for index, entry in enumerate(manifest.tables, 1):
                if index <= progress.snapshot_tables:
                    continue
                records = table_records(outdir, entry, keys)
                relation = next(r for r in records if r.get("op") == "relation")
                rows = target.apply_table(index, relation,
                                          (r for r in records if r.get("op") == "row"))
                applied.tables += 1
                applied.rows += rows
                say(f"snapshot table {entry.schema}.{entry.table}: {rows} rows")
                if stopped():
                    return applied
        while True:
            for transaction in transactions(outdir, keys):
                if transaction.end_lsn <= max(applied.through, start):
                    continue
                target.apply_transaction(transaction)
                applied.transactions += 1
                applied.through = transaction.end_lsn
                if stopped():
                    return applied
            if not follow or stopped():
                return applied
            time.sleep(poll)
    finally:
        target.close()
