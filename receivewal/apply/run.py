"""One ``apply`` run: the snapshot's tables the target lacks, then the transactions it lacks.

Both targets are driven alike (:class:`Target`): a PostgreSQL database
(:mod:`~receivewal.apply.postgres`, ``--to CONNSTR``) or Delta tables
(:mod:`~receivewal.apply.delta`, ``--to delta:DIR``). The target says how far it got; every
snapshot table it holds and every transaction at or before that point is passed over, the rest
is handed to it in order, in batches of whole transactions (one transaction a batch for
PostgreSQL, which records its progress with each). With ``follow`` the run then waits for the
log to grow and goes on until it is stopped, each poll reading only what the log gained
(:class:`~receivewal.apply.source.LogReader` keeps its place and the prepared transactions it
holds); without, it ends once it has applied all the log holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from receivewal.apply.source import LogReader, Record, Transaction, file_records, read_ahead
from receivewal.errors import ConfigurationError
from receivewal.logical.snapshot import read_manifest, table_records
from receivewal.logical.store import change_files
from receivewal.wal.lsn import format_lsn

if TYPE_CHECKING:
    from receivewal.archive.encryption import Keys

#: ``--to delta:DIR``: Delta tables under DIR; anything else is a PostgreSQL connection.
DELTA_PREFIX = "delta:"
#: How many times in a row the log is read again at once when a file it listed was gone when
#: opened (completed meanwhile; a name that never opens, a dangling link, waits for the poll).
REREADS = 3


class Target(Protocol):
    """What ``apply`` asks of where it applies the log."""

    #: how many changes a batch of transactions holds at most (a bigger transaction alone)
    batch_changes: int

    @property
    def commits(self) -> int | None:
        """The commits written so far, where the target counts them (Delta's), else None."""

    def begin(self, consistent_point: int) -> int:
        """Read the target's progress; the LSN through which it holds every transaction."""

    def holds_table(self, index: int, schema: str, table: str) -> bool:
        """Whether the snapshot's table number ``index`` is in the target."""

    def apply_table(self, index: int, relation: Record, rows: Iterable[Record]) -> int:
        """Load the snapshot's table number ``index``, with its progress; the rows loaded."""

    def apply_batch(self, batch: list[Transaction]) -> int:
        """Apply what the target lacks of ``batch``, with its progress; the transactions of
        which something was applied."""

    def close(self) -> None:
        """Let go of the target."""


@dataclass
class Applied:
    """What a run applied, and how far the target now holds the log."""

    tables: int = 0
    rows: int = 0
    transactions: int = 0
    through: int = 0
    changes: int = 0
    commits: int | None = None  # a Delta target's commits
    reads: int = 0  # how many times the change log was read (a follower's polls)
    files_opened: int = 0
    bytes_read: int = 0

    def count_reading(self, reader: LogReader) -> None:
        self.reads, self.files_opened = reader.reads, reader.files_opened
        self.bytes_read = reader.bytes_read

    def describe(self) -> str:
        said = (f"applied {self.tables} snapshot tables ({self.rows} rows) and "
                f"{self.transactions} transactions; the target holds the change log through "
                f"{format_lsn(self.through)}")
        if self.commits is not None:
            said += f" ({self.commits} Delta commits for {self.changes} changes read)"
        said += (f"; {self.bytes_read} bytes of the change log read in {self.reads} reads "
                 f"({self.files_opened} files opened)")
        return said


def source_name(outdir: Path, keys: Keys | None) -> str:
    """The name the target keeps this log's progress under: its slot's. ConfigurationError
    when the directory holds no change log."""
    manifest = read_manifest(outdir)
    if manifest is not None:
        return manifest.slot
    for name in change_files(outdir):
        for record in file_records(outdir / name, keys):
            if record.get("op") == "header" and record.get("slot"):
                return str(record["slot"])
            break
    raise ConfigurationError(f"{outdir} holds no change log (no snapshot, no change file)")


def open_target(to: str, source: str) -> Target:
    """The target ``--to`` names, for the log of ``source`` (its slot)."""
    if to.startswith(DELTA_PREFIX):
        try:
            from receivewal.apply.delta import DeltaTarget  # noqa: PLC0415 - the delta extra
        except ImportError as exc:
            raise ConfigurationError(f"--to {DELTA_PREFIX}DIR needs the delta extra "
                                     f"(pip install 'receivewal[delta]'): {exc}") from exc
        return DeltaTarget(to[len(DELTA_PREFIX):], source)
    from receivewal.apply.postgres import PostgresTarget  # noqa: PLC0415 - psycopg when used

    return PostgresTarget(to, source)


def apply_log(outdir: Path, to: str, *, keys: Keys | None = None, follow: bool = False,
              stopped: Callable[[], bool] = lambda: False, poll: float = 1.0,
              say: Callable[[str], None] = lambda line: None) -> Applied:
    """Apply what ``outdir``'s change log holds that the target ``to`` lacks."""
    if not outdir.is_dir():
        raise ConfigurationError(f"{outdir} is not a directory")
    applied = Applied()
    target = open_target(to, source_name(outdir, keys))
    try:
        manifest = read_manifest(outdir)
        start = 0 if manifest is None else manifest.consistent_point
        applied.through = target.begin(start)
        if manifest is not None:
            for index, entry in enumerate(manifest.tables, 1):
                if target.holds_table(index, entry.schema, entry.table):
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
        reader = LogReader(outdir, keys)
        again = 0  # reads in a row that met a file gone when opened
        while True:
            try:
                if _apply_transactions(reader, target, applied, start=start, stopped=stopped):
                    return applied
            finally:
                applied.count_reading(reader)
            again = 0 if reader.whole else again + 1
            if 0 < again <= REREADS:
                continue  # a file was completed as it was listed: read on at once
            if not follow or stopped():
                return applied
            time.sleep(poll)
    finally:
        applied.commits = target.commits
        target.close()


def _apply_transactions(reader: LogReader, target: Target, applied: Applied, *,
                        start: int, stopped: Callable[[], bool]) -> bool:
    """The log's transactions after what the target holds (what ``reader`` has not read
    yet), batch by batch; whether a stop was requested."""
    batch: list[Transaction] = []
    size = 0

    def flush() -> None:
        nonlocal size
        applied.transactions += target.apply_batch(batch)
        applied.changes += size
        applied.through = batch[-1].end_lsn
        batch.clear()
        size = 0

    for transaction in read_ahead(reader.transactions()):
        if transaction.end_lsn <= max(applied.through, start):
            continue
        batch.append(transaction)
        size += max(1, len(transaction.changes))
        if size >= target.batch_changes:
            flush()
            if stopped():
                return True
    if batch:
        flush()
    return stopped()
