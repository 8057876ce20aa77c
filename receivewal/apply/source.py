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
A follower reads the log again and again with one :class:`LogReader`, each read going on where
the one before ended.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from receivewal.errors import ArchiveError
from receivewal.logical import changelines
from receivewal.logical.plainlines import PlainLines, unsealing_for
from receivewal.logical.store import change_files, parse_file_name
from receivewal.wal.lsn import format_lsn, parse_lsn

if TYPE_CHECKING:
    from receivewal.archive.encryption import Keys
    from receivewal.archive.storedform import Unsealing

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
    return LogReader(outdir, keys).transactions()


#: The ops of lines that never end a run (every other line is asked
#: :func:`~receivewal.logical.changelines.run_end`).
_INSIDE_RUN = frozenset(("insert", "update", "delete", "truncate", "begin", "begin_prepare",
                         "relation", "header"))


class LogReader:
    """The log read as a follower reads it, again and again as it grows: each
    :meth:`transactions` goes on where the one before ended, at the end of the last run it
    read whole (the file, by the LSN in its name, and the bytes of its lines before that
    point), with what the lines before it said kept in memory (the relations described, the
    prepared transactions held for their COMMIT PREPARED). A run the store may still cut (the
    partial file's last, read before it ended) is read again from its start. Files before the
    position are not opened again; the one it is in is skipped to it (seeked, or its lines
    before it passed over undecoded when it was compressed or sealed since)."""

    def __init__(self, outdir: Path, keys: Keys | None = None) -> None:
        self.outdir, self.keys = outdir, keys
        self._runs = _Runs()
        self._file = -1  # the LSN naming the file the next read begins in (-1: the first)
        self._offset = 0  # the plaintext bytes of that file before it (a run ended there)
        self.reads = 0  # how many times the log was read
        self.files_opened = 0
        self.bytes_read = 0  # of whole lines, a compressed file's skipped ones too
        self.whole = True  # whether the last read met no file gone between listing and open

    def transactions(self) -> Iterator[Transaction]:
        """What the log holds past the last read's end, in commit order; the read ends at the
        first file that is gone when opened (renamed when completed, or sealed: the next read
        lists it again; :attr:`whole` says so)."""
        self.reads += 1
        self.whole = True
        runs = self._runs
        runs.rewind()
        read = -1  # the LSN of the file last read (a complete file hides a partial of its LSN)
        for name in change_files(self.outdir):
            parsed = parse_file_name(name)
            assert parsed is not None
            lsn = parsed[0]
            if lsn < self._file or lsn == read:
                continue
            if lsn > self._file and runs.current is None:
                runs.settle()
                self._file, self._offset = lsn, 0
            read = lsn
            skip = self._offset if lsn == self._file else 0
            opened = _open(self.outdir / name)
            if opened is None:
                self.whole = False
                return
            self.files_opened += 1
            with opened as fh:
                yield from self._file_transactions(fh, self.outdir / name, parsed[1], skip)

    def _file_transactions(self, fh: BinaryIO, path: Path, method: str, skip: int
                           ) -> Iterator[Transaction]:
        """The transactions of one open file, from ``skip`` bytes of its plaintext on; the
        position moved to each run's end as it is read (before its transaction is handed on)."""
        runs, handlers = self._runs, self._runs.handlers
        unsealing = unsealing_for(path, self.keys, "applying")
        plain = method == "" and unsealing is None
        if plain:
            fh.seek(skip)
        base = skip if plain else 0  # the plaintext offset of the batch's first line
        for batch in _batches(fh, path, method, unsealing):
            lines = batch
            if base < skip:  # the lines before the position, passed over undecoded
                before = base
                lines, base = _past(batch, base, skip)
                self.bytes_read += base - before
            counted, at = 0, base  # lines[:counted] end at plaintext offset ``at``
            for index, record in enumerate(_records(lines, path)):
                op = record.get("op")
                handler = handlers.get(op)
                done = None if handler is None else handler(path, record)
                if op not in _INSIDE_RUN and runs.current is None \
                        and changelines.run_end(record) is not None:
                    at += sum(len(line) + 1 for line in lines[counted:index + 1])
                    counted = index + 1
                    runs.settle()
                    self._offset = at
                if done is not None:
                    yield done
            size = sum(len(line) + 1 for line in lines)
            self.bytes_read += size
            base += size


def _open(path: Path) -> BinaryIO | None:
    """``path`` open to read; None when it is gone (completed or expired meanwhile)."""
    try:
        return path.open("rb")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ArchiveError(f"change file {path}: {exc}") from exc


def _batches(fh: BinaryIO, path: Path, method: str, unsealing: Unsealing | None
             ) -> Iterator[list[bytes]]:
    """The whole lines of the open file ``path``, a list for each chunk of plaintext."""
    try:
        yield from PlainLines(fh, method, unsealing).batches()
    except (OSError, ValueError) as exc:
        raise ArchiveError(f"change file {path}: {exc}") from exc


def _records(lines: list[bytes], path: Path) -> list[Record]:
    try:
        return _decoded(lines)
    except ValueError as exc:
        raise ArchiveError(f"change file {path}: {exc}") from exc


def _past(lines: list[bytes], base: int, skip: int) -> tuple[list[bytes], int]:
    """The lines of a batch beginning at plaintext offset ``base`` that begin at or after
    ``skip`` (a line's end), and the offset of the first of them."""
    for index, line in enumerate(lines):
        if base >= skip:
            return lines[index:], base
        base += len(line) + 1
    return [], base


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
    runs held for their COMMIT PREPARED; :meth:`rewind` takes it back to where a run last
    ended (:meth:`settle`)."""

    def __init__(self) -> None:
        self.relations: dict[tuple[str, str], Columns] = {}
        # the relations described since the last settle, as they were before (None: not)
        self._before: dict[tuple[str, str], Columns | None] = {}
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

    def settle(self) -> None:
        """A run ended here: what the lines before said stays."""
        self._before.clear()

    def rewind(self) -> None:
        """Back to the last :meth:`settle`: the lines after it are read again (the prepared
        transactions change only where a run ends)."""
        for key, columns in self._before.items():
            if columns is None:
                del self.relations[key]
            else:
                self.relations[key] = columns
        self._before.clear()
        self.current = None

    def relation(self, path: Path, record: Record) -> None:
        key = (record["schema"], record["table"])
        if key not in self._before:
            self._before[key] = self.relations.get(key)
        self.relations[key] = record["columns"]

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
