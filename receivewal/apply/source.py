"""What a change log directory holds, as ``apply`` takes it: the snapshot, then transactions.

The change log's files are read in name order (which is commit order), the complete ones and
then the partial one up to its last whole line, each decompressed and unsealed as it is kept
(:class:`~receivewal.logical.plainlines.PlainLines`). Lines become :class:`Transaction`
units: a ``begin`` .. ``commit`` run; a ``begin_prepare`` .. ``prepare`` run held until its
``commit_prepared`` (then applied, under that line's end LSN) or dropped at its
``rollback_prepared``. Each change carries the columns its table's relation line described
when it came (the replica identity's key among them). A run the log does not hold whole yet
(the partial file's last) ends the sequence; a ``gap`` line stops it with an error naming its
LSNs: the log misses transactions there, and applying past them would build wrong tables.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from receivewal.errors import ArchiveError
from receivewal.logical.plainlines import PlainLines, unsealing_for
from receivewal.logical.store import change_files, parse_file_name
from receivewal.wal.lsn import format_lsn, parse_lsn

if TYPE_CHECKING:
    from receivewal.archive.encryption import Keys

Record = dict[str, Any]
Columns = list[dict[str, Any]]


class LogGap(ArchiveError):  # noqa: N818 - what the log holds, as its line says
    """The change log misses transactions (a ``gap`` line): nothing past it is applied."""


@dataclass
class Transaction:
    """One committed transaction: its changes, each with its table's columns, and the LSN
    the target records as applied (its commit's end)."""

    end_lsn: int
    commit_lsn: int
    commit_time: str | None
    changes: list[tuple[Record, Columns]] = field(default_factory=list)

    @property
    def lsn(self) -> str:
        return format_lsn(self.commit_lsn)


def file_records(path: Path, keys: Keys | None) -> Iterator[Record]:
    """The whole lines of one change file (a partial one's up to its last newline)."""
    parsed = parse_file_name(path.name)
    assert parsed is not None
    unsealing = unsealing_for(path, keys, "applying")
    try:
        with path.open("rb") as fh:
            for lines in PlainLines(fh, parsed[1], unsealing).batches():
                yield from _decoded(lines)
    except FileNotFoundError:
        return  # completed (renamed) or expired meanwhile: the next listing has it
    except (OSError, ValueError) as exc:
        raise ArchiveError(f"change file {path}: {exc}") from exc


def _decoded(lines: list[bytes]) -> list[Record]:
    """Whole lines as objects, decoded as one JSON array (one call for a chunk's lines costs
    about half as much as one a line); when that fails or counts otherwise (a line holding
    two values), line by line, which raises at the line that is not one object."""
    if not lines:
        return []
    try:
        records = json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:
        records = None
    if not isinstance(records, list) or len(records) != len(lines):
        records = [json.loads(line) for line in lines]
    return records


def transactions(outdir: Path, keys: Keys | None = None) -> Iterator[Transaction]:
    """The log's committed transactions in commit order (see the module's docstring)."""
    runs = _Runs()
    for name in change_files(outdir):
        path = outdir / name
        for record in file_records(path, keys):
            handler = runs.handlers.get(record.get("op"))
            if handler is None:
                continue  # header, origin, message: nothing to apply
            done = handler(path, record)
            if done is not None:
                yield done


#: How many changes the log is read ahead of the target at most (a bigger transaction alone):
#: as many as a PostgreSQL target's batch, read while the server applies the one before.
AHEAD_CHANGES = 10_000


def read_ahead(source: Iterator[Transaction], changes: int = AHEAD_CHANGES
               ) -> Iterator[Transaction]:
    """``source``'s transactions read on a thread of its own, at most ``changes`` changes
    ahead of the caller (at least one transaction, whatever its size), so that reading and
    decoding the log goes on while the target works; an error of the reading is raised to the
    caller after the transactions read before it. The thread stops at its next transaction
    once the caller is done with the iterator."""
    shared = _ReadAhead(changes)
    threading.Thread(target=shared.read, args=(source,), name="apply-read-ahead",
                     daemon=True).start()
    try:
        yield from shared.taken()
    finally:
        with shared.turn:
            shared.closed = True
            shared.turn.notify_all()


class _ReadAhead:
    """What the reading thread and the caller share, under one condition."""

    def __init__(self, changes: int) -> None:
        self.changes = changes
        self.turn = threading.Condition()
        self.ready: deque[Transaction] = deque()
        self.held = 0  # changes in ``ready``
        self.done = False
        self.closed = False
        self.error: BaseException | None = None

    def read(self, source: Iterator[Transaction]) -> None:
        turn = self.turn
        try:
            for transaction in source:
                with turn:
                    while self.ready and self.held >= self.changes and not self.closed:
                        turn.wait()
                    if self.closed:
                        return
                    self.ready.append(transaction)
                    self.held += _size(transaction)
                    turn.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            with turn:
                self.error = exc
        finally:
            with turn:
                self.done = True
                turn.notify_all()

    def taken(self) -> Iterator[Transaction]:
        turn = self.turn
        while True:
            with turn:
                while not self.ready and not self.done:
                    turn.wait()
                if not self.ready:
                    if self.error is not None:
                        raise self.error
                    return
                transaction = self.ready.popleft()
                self.held -= _size(transaction)
                turn.notify_all()
            yield transaction


def _size(transaction: Transaction) -> int:
    return max(1, len(transaction.changes))


class _Runs:
    """The state between lines: the relations described, the run being read, the prepared
    runs held for their COMMIT PREPARED."""

    def __init__(self) -> None:
        self.relations: dict[tuple[str, str], Columns] = {}
        self.prepared: dict[str, Transaction] = {}
        self.current: Transaction | None = None
        self.handlers: dict[object, Callable[[Path, Record], Transaction | None]] = {
            "relation": self.relation, "begin": self.begin, "begin_prepare": self.begin,
            "insert": self.change, "update": self.change, "delete": self.change,
            "truncate": self.change, "commit": self.commit, "prepare": self.prepare,
            "commit_prepared": self.commit_prepared,
            "rollback_prepared": self.rollback_prepared, "gap": self.gap}

    def _open(self, path: Path, record: Record) -> Transaction:
        if self.current is None:
            raise ArchiveError(f"{path}: a {record.get('op')} line outside a transaction at "
                               f"{record.get('lsn')}")
        return self.current

    def relation(self, path: Path, record: Record) -> None:
        self.relations[(record["schema"], record["table"])] = record["columns"]

    def begin(self, path: Path, record: Record) -> None:
        lsn = record.get("commit_lsn") or record.get("prepare_lsn")
        self.current = Transaction(0, parse_lsn(str(lsn)), record.get("commit_time"))

    def change(self, path: Path, record: Record) -> None:
        columns = [] if record["op"] == "truncate" else \
            self.relations[(record["schema"], record["table"])]
        self._open(path, record).changes.append((record, columns))

    def commit(self, path: Path, record: Record) -> Transaction:
        done = self._open(path, record)
        done.end_lsn = parse_lsn(record["end_lsn"])
        done.commit_time = record.get("commit_time")
        self.current = None
        return done

    def prepare(self, path: Path, record: Record) -> None:
        self.prepared[record["gid"]] = self._open(path, record)
        self.current = None

    def commit_prepared(self, path: Path, record: Record) -> Transaction:
        held = self.prepared.pop(record["gid"], None)
        if held is None:  # its changes are not in the log: never applied as empty
            raise ArchiveError(f"{path}: COMMIT PREPARED of {record['gid']!r} at "
                               f"{record.get('lsn')}, but the log does not hold its PREPARE "
                               "(removed, or before the log began)")
        held.end_lsn = parse_lsn(record["end_lsn"])
        held.commit_lsn = parse_lsn(record["commit_lsn"])
        held.commit_time = record.get("commit_time")
        return held

    def rollback_prepared(self, path: Path, record: Record) -> None:
        self.prepared.pop(record["gid"], None)

    def gap(self, path: Path, record: Record) -> None:
        raise LogGap(f"the change log misses the transactions committed between "
                     f"{record['from_lsn']} and {record['lsn']} (a gap line: the slot was "
                     "confirmed past the log); nothing after it is applied")
