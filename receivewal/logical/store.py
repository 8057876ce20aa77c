# Over 500 lines: the writer, its crash recovery and its completion share one file's state.
"""The change log on disk: JSON Lines files in OUTDIR, written durably, resumed exactly once.

OUTDIR holds complete files named after the commit LSN of their first run,
``<16 hex digits>.jsonl`` (``.jsonl.zst`` with zstd at rest), and at most one
``<16 hex digits>.jsonl.partial`` being written. A file starts with a header line, then runs
(:class:`~receivewal.logical.assembly.Run`), each preceded by the relation lines it needs
that the file does not have yet (so every file can be read alone); a relation line comes again
only when the table's description changes. Once the partial file reaches ``file_size`` bytes
it is completed before the next run: fsynced and renamed, or compressed into a new file
(written, fsynced and renamed by :mod:`receivewal.archive.durable`) that replaces it.

:meth:`ChangeLogStore.flush` fsyncs what was written and returns the end LSN of the last
run now durable: the only position a slot may be confirmed to. :meth:`ChangeLogStore.open`
recovers from a crash at any point: it removes leftover temporary files and a partial file
whose compressed copy was completed, cuts the partial file after its last complete run (a
file with no complete run goes), and reports in :attr:`~ChangeLogStore.written_through` the
end of the last run on disk, so that the runs a resumed stream sends again are skipped.

What the log holds is checked against the slot at every start (the session compares the
slot's ``confirmed_flush_lsn`` with :attr:`~ChangeLogStore.held_through`): a slot confirmed
past the log's end means transactions the slot will never send again are missing from it.
The log itself proves it holds everything up to its last run's end; beyond that, a slot
confirmed to a keepalive's walEnd while nothing was open is proven by
:data:`CONFIRMED_THROUGH` (:meth:`ChangeLogStore.mark_confirmed`, made durable before the
server is told), which says where the log ended when it was written, so that a log that has
since lost its newest runs (a damaged ``.partial`` moved away) does not count it.
"""

from __future__ import annotations

import errno
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from receivewal.archive import durable
from receivewal.archive.compression import CompressSpec, check_change_file_method
from receivewal.archive.recipients import RecipientSet
from receivewal.archive.sealed import seal_file
from receivewal.archive.storedform import StoredForm, plain_chunks
from receivewal.errors import ArchiveError, ConfigurationError, DiskFullError
from receivewal.logical import changelines
from receivewal.logical.assembly import Run
from receivewal.logical.relations import RelationInfo
from receivewal.logical.scan import FileScan, scan_file
from receivewal.logical.spool import clear_spool
from receivewal.wal.names import ENCRYPTED_SUFFIX, AtRest

SUFFIX = ".jsonl"
PARTIAL = ".partial"
DEFAULT_FILE_SIZE = 64 << 20
SPOOL = ".spool"
_NAME = re.compile(r"^([0-9A-F]{16})\.jsonl(\.zst)?(\.age)?(\.partial)?$")
#: The plain record of the sealed files' end: which file was sealed last and the end LSN of
#: its last run (written before it is sealed: resuming after it needs no key).
SEALED_THROUGH = ".sealed-through"
#: Where the slot was confirmed beyond the log's last run (a keepalive's walEnd while nothing
#: was open; a new log's start, the slot's position then) and where the log ended then (plain
#: JSON): what the start-up check of the slot counts the log as holding.
CONFIRMED_THROUGH = ".confirmed-through"
_WRITE_BUFFER = 1 << 20
_CHUNK = 1 << 20


@dataclass(frozen=True)
class StoreSettings:
    """How the change log is kept: ``compression`` "" or "zstd" (``level`` None: its
    default), ``header`` the extra fields of each file's header line, ``sync`` False to
    skip fsync (tests only, as the archive's ``--no-sync``)."""

    file_size: int = DEFAULT_FILE_SIZE
    compression: str = ""
    level: int | None = None
    header: tuple[tuple[str, Any], ...] = ()
    mode: int = 0o600
    sync: bool = True
    recipients: RecipientSet | None = None  # --encrypt-to: completed files sealed to them

    def __post_init__(self) -> None:
        check_change_file_method(self.compression)
        if self.file_size < 1:
            raise ConfigurationError(f"invalid file size {self.file_size}")


def file_name(lsn: int, compression: str = "", *, partial: bool = False) -> str:
    """The name of the file whose first run has commit LSN ``lsn``."""
    return f"{lsn:016X}{SUFFIX}{AtRest(compression).suffix}{PARTIAL if partial else ''}"


def parse_file_name(name: str) -> tuple[int, str, bool] | None:
    """(LSN, compression, partial) of a change log file's name (a sealed one's, ``.age``,
    too: :func:`is_sealed`); None for other names (a partial file is never compressed nor
    sealed)."""
    match = _NAME.match(name)
    if match is None or (match.group(4) and (match.group(2) or match.group(3))):
        return None
    return int(match.group(1), 16), "zstd" if match.group(2) else "", bool(match.group(4))


def change_files(directory: Path) -> list[str]:
    """The names of the change log's files in ``directory``, in order: by the commit LSN they
    name, a partial file after a complete one of its LSN (OSError if it cannot be listed)."""
    named = [(parsed[0], parsed[2], name) for name in os.listdir(directory)
             if (parsed := parse_file_name(name)) is not None]
    return [name for *_, name in sorted(named)]


def is_sealed(name: str) -> bool:
    """Whether the change log file ``name`` is sealed (``--encrypt-to``)."""
    return name.endswith(ENCRYPTED_SUFFIX)


class ChangeLogStore:
    """One change log directory, written by one process (the caller holds its lock)."""

    def __init__(self, directory: Path, settings: StoreSettings) -> None:
        self.directory = directory
        self.settings = settings
        self.written_through = 0  # end LSN of the last run written (durable or not)
        self.durable_through = 0  # end LSN of the last run fsynced
        self.last_name = -1  # the LSN in the newest file's name
        self._beyond = 0  # where the slot was confirmed past the runs (CONFIRMED_THROUGH)
        self.new_log = True  # neither a change file nor CONFIRMED_THROUGH when opened
        self._fd: int | None = None
        self._partial: Path | None = None
        self._size = 0  # the partial file's size, pending bytes included
        self._pending = bytearray()
        self._dirty = False  # written since the last fsync
        self._new_file = False  # the partial file's directory entry is not fsynced yet
        self._rotate = False  # the partial file is full: complete it before the next run
        self._broken = False  # a write failed: the file may end inside a run
        self._versions: dict[tuple[str, str], int] = {}  # relation version per table
        self._shapes: dict[tuple[str, str], bytes] = {}  # what the file says of each table
        self._completed: list[str] = []  # files completed since the last completed() call

    @property
    def broken(self) -> bool:
        """Whether a write failed (the disk full, say): the partial file may end inside a
        run, and nothing more is written until the log is opened again."""
        return self._broken

    @property
    def spool(self) -> Path:
        """The scratch directory for transactions being buffered."""
        return self.directory / SPOOL

    @classmethod
    def open(cls, directory: Path, settings: StoreSettings) -> ChangeLogStore:
        """Open (or start) the change log in ``directory``, recovering from a crash."""
        store = cls(directory, settings)
        try:
            store._recover()
        except OSError as exc:
            raise ArchiveError(f"cannot open the change log in {directory}: {exc}") from exc
        return store

    # -- start-up ----------------------------------------------------------------------------
    def _recover(self) -> None:
        clear_spool(self.spool)
        complete: dict[int, str] = {}
        partials: list[tuple[int, Path]] = []
        for entry in sorted(os.listdir(self.directory), key=is_sealed):  # sealed ones last
            if durable.is_temporary(entry):
                (self.directory / entry).unlink()
                continue
            parsed = parse_file_name(entry)
            if parsed is None:
                continue
            lsn, _, partial = parsed
            if partial:
                partials.append((lsn, self.directory / entry))
                continue
            if is_sealed(entry) and lsn in complete:  # sealed whole; the crash came before
                (self.directory / complete[lsn]).unlink()  # the plain file's unlink
            complete[lsn] = entry
        for lsn, path in list(partials):
            if lsn in complete:  # compressed and renamed; the crash came before the unlink
                path.unlink()
                partials.remove((lsn, path))
        if len(partials) > 1:
            raise ArchiveError(f"{self.directory} holds more than one partial change log file: "
                               + ", ".join(path.name for _, path in partials))
        self.last_name = max(complete, default=-1)
        if complete:
            self.written_through = self._newest_end(self.directory / complete[max(complete)])
        if partials:
            self._resume(*partials[0])
        durable.sync_path(self.directory, sync=self.settings.sync)
        self.durable_through = self.written_through
        marked = self._confirmed_through()
        self.new_log = self.last_name == -1 and marked is None
        if marked is not None and marked[0] <= self.written_through:  # else the log lost runs
            self._beyond = marked[1]

    @property
    def held_through(self) -> int:
        """Up to where the log holds every transaction the slot sent: the end of its last run,
        or further where :data:`CONFIRMED_THROUGH` proves it."""
        return max(self.written_through, self._beyond)

    def _confirmed_through(self) -> tuple[int, int] | None:
        """What :data:`CONFIRMED_THROUGH` says: (where the log ended, where the slot was
        confirmed to)."""
        path = self.directory / CONFIRMED_THROUGH
        try:
            document = json.loads(path.read_bytes()[:4096])
            return int(document["log_end"]), int(document["confirmed"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise ArchiveError(f"{path} is damaged: {exc}") from exc

    def mark_confirmed(self, lsn: int) -> None:
        """Record, durably, that the slot may be confirmed to ``lsn`` though the log's last
        run ends before it (nothing was open: every transaction committed before ``lsn`` is
        in the log); before the server is told. Nothing to do when the log proves it."""
        self.flush()
        if lsn <= self.held_through and not self.new_log:
            return
        try:
            self._record(CONFIRMED_THROUGH, {"log_end": self.durable_through, "confirmed": lsn})
        except OSError as exc:
            raise _failure(f"cannot write {self.directory / CONFIRMED_THROUGH}", exc) from exc
        self.new_log = False
        self._beyond = max(self._beyond, lsn)

    def write_gap(self, from_lsn: int, lsn: int, slot: str, recorded_at: str) -> None:
        """--accept-gap: a line of its own saying that what committed after ``from_lsn``
        and up to ``lsn`` is not in the log, written as a run that ends at ``lsn`` (the
        stream resumes there), and made durable."""
        self.write_run(Run(lsn, lsn, [], iter([(None, changelines.gap(lsn, from_lsn, slot,
                                                                   recorded_at))])))
        self.flush()

    def _newest_end(self, newest: Path) -> int:
        """The end LSN of the last run of the newest complete file: read from it, or for a
        sealed one from :data:`SEALED_THROUGH`; with --encrypt-to, a plain one (a kill came
        after it was completed, before or while it was sealed) is sealed now."""
        marked = self._sealed_through()
        if is_sealed(newest.name):
            if marked is None or marked[0] != newest.name:
                raise ArchiveError(f"cannot resume the change log in {self.directory}: its "
                                   f"newest file {newest.name} is sealed and "
                                   f"{SEALED_THROUGH} does not say where it ends")
            return marked[1]
        found = self._scan(newest)
        self._check_header(newest, found)
        recipients = self.settings.recipients
        if recipients is not None:  # a kill came after it was completed, before it was sealed
            if marked != (newest.name + ENCRYPTED_SUFFIX, found.last_end):
                self._record(SEALED_THROUGH, {"file": newest.name + ENCRYPTED_SUFFIX,
                                              "end_lsn": found.last_end})
            seal_file(newest, recipients, mode=self.settings.mode, sync=self.settings.sync)
        return found.last_end

    def _sealed_through(self) -> tuple[str, int] | None:
        """What :data:`SEALED_THROUGH` says: the file sealed last and its end LSN."""
        path = self.directory / SEALED_THROUGH
        try:
            document = json.loads(path.read_bytes()[:4096])
            return str(document["file"]), int(document["end_lsn"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise ArchiveError(f"{path} is damaged: {exc}") from exc

    def _seal(self, final: Path) -> Path:
        """Seal the completed file ``final`` when ``--encrypt-to`` asks (its end recorded
        first); the file's name now."""
        recipients = self.settings.recipients
        if recipients is None:
            return final
        self._record(SEALED_THROUGH, {"file": final.name + ENCRYPTED_SUFFIX,
                                      "end_lsn": self.written_through})
        return seal_file(final, recipients, mode=self.settings.mode, sync=self.settings.sync)

    def _record(self, name: str, document: dict[str, Any]) -> None:
        """Write the small plain record ``name`` (:data:`SEALED_THROUGH`,
        :data:`CONFIRMED_THROUGH`) durably. Raises OSError."""
        durable.write_file_durably(self.directory, name, json.dumps(document).encode() + b"\n",
                                   mode=self.settings.mode, sync=self.settings.sync)

    def _scan(self, path: Path) -> FileScan:
        parsed = parse_file_name(path.name)
        assert parsed is not None
        _, compression, partial = parsed
        with path.open("rb") as raw:
            chunks = plain_chunks(raw, compression)
            try:
                found = scan_file(chunks)
            except ArchiveError as exc:  # the compressed stream is damaged
                raise ArchiveError(f"{path} is damaged: {exc}") from exc
        if found.corrupt:  # never cut: the runs after the damage may be the only copy
            raise ArchiveError(f"{path} is damaged: {found.corrupt}; nothing was changed "
                               "(put the file right, or move it away and start with "
                               "--accept-gap to go on from the slot with the gap recorded)")
        if found.stopped and not partial:
            raise ArchiveError(f"{path} is damaged: {found.stopped}")
        if found.header is not None and found.header.get("format") != changelines.FORMAT:
            raise ArchiveError(f"{path} is change log format {found.header.get('format')!r}, "
                               f"not {changelines.FORMAT}")
        return found

    def _resume(self, name: int, path: Path) -> None:
        """Cut the partial file after its last complete run and open it to append; remove it
        when it has none (its name goes with it)."""
        found = self._scan(path)
        if not found.runs:
            path.unlink()
            return
        self._check_header(path, found)
        self.last_name = max(self.last_name, name)
        if path.stat().st_size != found.good_size:
            os.truncate(path, found.good_size)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        durable.sync_file(fd, sync=self.settings.sync)
        self._fd, self._partial, self._size = fd, path, found.good_size
        self._shapes = dict(found.shapes)
        self.written_through = max(self.written_through, found.last_end)
        self._rotate = self._size >= self.settings.file_size

    def _check_header(self, path: Path, found: FileScan) -> None:
        """The log goes on only as what it was written as: every field of this store's header
        (the plugin, the slot) that the newest file's header has must be equal, or the
        resumed stream would be another one's, skipped up to where that one ended."""
        mine = dict(self.settings.header)
        theirs = found.header or {}
        differ = [f"{key} {theirs[key]!r} (not {mine[key]!r})" for key in mine
                  if key in theirs and theirs[key] != mine[key]]
        if differ:
            raise ArchiveError(f"{self.directory} holds another change log: {path.name} was "
                               f"written with {', '.join(differ)}")

    # -- writing -----------------------------------------------------------------------------
    def write_run(self, run: Run) -> None:
        """Append one run (after the relation lines it needs), starting a new file first when
        none is open or the open one is full."""
        if self._broken:
            raise ArchiveError(f"the change log in {self.directory} failed a write: open it "
                               "again to resume")
        try:
            if self._rotate:
                self._complete()
            if self._fd is None:
                self._start_file(run.name_lsn)
            for needed in run.relations:
                self._describe(needed)
            self._write_lines(run)
        except OSError as exc:
            self._broken = True
            raise _failure(f"cannot write the change log in {self.directory}", exc) from exc
        self.written_through = run.end_lsn
        self._rotate = self._size >= self.settings.file_size

    def flush(self) -> int:
        """Make every run written durable; the end LSN of the last one (0: none)."""
        if self._broken:
            return self.durable_through
        try:
            self._flush_pending()
            if self._fd is not None and self._dirty:
                durable.sync_file(self._fd, sync=self.settings.sync)
            if self._new_file:
                durable.sync_path(self.directory, sync=self.settings.sync)
        except OSError as exc:
            self._broken = True
            raise _failure(f"cannot flush the change log in {self.directory}", exc) from exc
        self._dirty = self._new_file = False
        self.durable_through = self.written_through
        return self.durable_through

    def completed(self) -> list[str]:
        """The names of the files completed (durable under their final names) since the last
        call, in order."""
        done, self._completed = self._completed, []
        return done

    def close(self) -> int:
        """Flush and close; the partial file stays to be resumed. Returns :meth:`flush`'s."""
        through = self.flush()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        return through

    def _write_lines(self, run: Run) -> None:
        """:meth:`_write` of each line, after the relation line its version needs (looked
        for once per run of lines made with the same version: a file is never started
        inside a run)."""
        described: RelationInfo | None = None
        pending, added = self._pending, 0
        try:
            for info, line in run.lines:
                if info is not described and info is not None:
                    self._describe(info)
                    described = info
                pending += line
                added += len(line)
                if len(pending) >= _WRITE_BUFFER:
                    self._flush_pending()
        finally:
            self._size += added

    def _describe(self, info: RelationInfo) -> None:
        """Write a relation line unless the file already describes the table so."""
        if self._versions.get(info.name) == info.version:
            return
        shape = changelines.relation_shape(info)
        if self._shapes.get(info.name) != shape:
            self._write(changelines.relation(info))
            self._shapes[info.name] = shape
        self._versions[info.name] = info.version

    def _write(self, line: bytes) -> None:
        self._pending += line
        self._size += len(line)
        if len(self._pending) >= _WRITE_BUFFER:
            self._flush_pending()

    def _flush_pending(self) -> None:
        if self._pending:
            assert self._fd is not None
            with memoryview(self._pending) as view:
                durable.write_all(self._fd, view)
            self._pending.clear()
            self._dirty = True

    def _start_file(self, name_lsn: int) -> None:
        name = max(name_lsn, self.last_name + 1)  # names only grow, even in odd cases
        path = self.directory / file_name(name, partial=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL
                           | os.O_NOFOLLOW | os.O_CLOEXEC, self.settings.mode)
        self._partial, self._size, self._new_file = path, 0, True
        self.last_name = name
        self._versions, self._shapes = {}, {}
        self._write(changelines.header(dict(self.settings.header)))

    def _complete(self) -> None:
        """Complete the partial file: fsync and rename, or compress into its final name."""
        assert self._fd is not None
        assert self._partial is not None
        self._flush_pending()
        fd, partial = self._fd, self._partial
        final = partial.with_name(partial.name.removesuffix(PARTIAL)
                                  + AtRest(self.settings.compression).suffix)
        if self.settings.compression:
            durable.sync_file(fd, sync=self.settings.sync)
            os.close(fd)
            self._fd, self._partial = None, None
            self._compress(partial, final)
            partial.unlink()
            durable.sync_path(self.directory, sync=self.settings.sync)
        else:
            self._fd, self._partial = None, None  # finish_file closes fd, whatever happens
            durable.finish_file(partial, final, fd=fd, close=True, sync=self.settings.sync)
        self._dirty = self._new_file = False
        self.durable_through = self.written_through
        self._completed.append(self._seal(final).name)

    def _compress(self, partial: Path, final: Path) -> None:
        form = StoredForm(CompressSpec(self.settings.compression, self.settings.level))
        with durable.durable_file(final, self.settings.mode, sync=self.settings.sync) as out, \
                partial.open("rb") as source, form.writer() as writer:
            out.write(writer.begin())
            while chunk := source.read(_CHUNK):
                out.write(writer.update(chunk))
            out.write(writer.finish())


def _failure(what: str, exc: OSError) -> ArchiveError:
    kind = DiskFullError if exc.errno == errno.ENOSPC else ArchiveError
    return kind(f"{what}: {exc}")


@dataclass(frozen=True)
class ChangeLogContents:
    """What a change log directory holds, as ``status`` shows it."""

    files: int = 0  # complete files
    bytes: int = 0  # their size
    newest: str | None = None  # the newest complete file's name
    partial: str | None = None  # the partial file's name
    partial_bytes: int = 0


def change_log_contents(directory: Path) -> ChangeLogContents:
    """Count the change log's files in ``directory`` (OSError if it cannot be listed; a file
    gone meanwhile is left out)."""
    files = size = partial_size = 0
    newest = partial = None
    for entry in change_files(directory):
        try:
            length = (directory / entry).stat().st_size
        except FileNotFoundError:  # completed or removed meanwhile
            continue
        if entry.endswith(PARTIAL):
            partial, partial_size = entry, length
        else:
            files, size, newest = files + 1, size + length, entry
    return ChangeLogContents(files, size, newest, partial, partial_size)
