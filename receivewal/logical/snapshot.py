"""The snapshot of a change log: the published tables' rows as of the slot's consistent point.

``receivewal logical --create-slot --snapshot`` creates the slot exporting its snapshot and,
while the slot's connection holds it, copies every table of the publications in that
snapshot (:mod:`receivewal.logicalreceiver.snapshot`). The snapshot and the change log together
rebuild the tables: the rows here, then every transaction the log holds (each committed after
the consistent point). This module is the format (docs/changelog.md, "The snapshot"):

``OUTDIR/snapshot/`` holds one file per table, ``0001.jsonl`` (``.zst`` compressed, ``.age``
sealed, as the change files are kept), and ``manifest.json``, written last: a snapshot is
complete only once its manifest is there. While it is taken the directory is
``snapshot.partial/`` (renamed once complete), holding ``slot.json`` from before the slot is
created, so that a run killed before the end is known as such and taken again from a new slot
(:func:`unfinished_snapshot`).

A table's file has the lines of the change log's format (:mod:`receivewal.logical.changelines`):
a ``header`` (format, slot, snapshot name, consistent point), the table's ``relation`` line,
one ``row`` line per row (``new``: column name to PostgreSQL's text output, NULL as null, under
the change log's session settings, so that a value reads here as it does in the log), and an
``end`` line with the number of rows, which a reader checks: a file cut short is refused.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from receivewal.archive import durable
from receivewal.archive.compression import CompressSpec
from receivewal.archive.recipients import RecipientSet
from receivewal.archive.sealed import seal_file
from receivewal.archive.storedform import StoredForm
from receivewal.errors import ArchiveError
from receivewal.logical.changelines import encode
from receivewal.logical.plainlines import PlainLines, unsealing_for
from receivewal.wal.lsn import format_lsn, parse_lsn
from receivewal.wal.names import AtRest

if TYPE_CHECKING:
    from receivewal.archive.encryption import Keys

FORMAT = 1
SNAPSHOT_DIRECTORY = "snapshot"
PARTIAL_DIRECTORY = "snapshot.partial"
MANIFEST = "manifest.json"
INTENT = "slot.json"
SNAPSHOT_MANIFEST_CAP = 16 << 20
_TABLE_FILE = re.compile(r"^(\d{4,})\.jsonl(\.zst)?(\.age)?$")
_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}
_ESCAPE = re.compile(r"\\(.)")


@dataclass(frozen=True)
class SnapshotColumn:
    """A column as the change log's relation line names it."""

    name: str
    type: str | None
    key: bool


@dataclass(frozen=True)
class SnapshotTable:
    """A published table: its columns (those the publication sends) and its row filter."""

    schema: str
    table: str
    columns: tuple[SnapshotColumn, ...]
    row_filter: str | None = None

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"


@dataclass(frozen=True)
class TableEntry:
    """One table of a complete snapshot, as its manifest lists it."""

    schema: str
    table: str
    file: str
    rows: int


@dataclass(frozen=True)
class SnapshotManifest:
    """A complete snapshot: the slot, its exported snapshot, where the log begins."""

    slot: str
    snapshot: str
    consistent_point: int
    tables: tuple[TableEntry, ...]
    taken_at: str | None = None


def decode_copy_row(line: bytes) -> list[str | None]:
    """One row of ``COPY ... TO STDOUT`` in text format: its fields, ``\\N`` as None and
    the format's backslash escapes undone (the server escapes only ``\\b \\f \\n \\r \\t \\v``
    and the backslash)."""
    text = line.decode().removesuffix("\n")
    return [None if field == "\\N" else
            _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(1)), field)
            if "\\" in field else field
            for field in text.split("\t")]


class SnapshotWriter:
    """Writes a snapshot into ``OUTDIR/snapshot.partial/``, one table after the other, then
    completes it (:meth:`finish`: the manifest, the directory renamed to ``snapshot/``)."""

    def __init__(self, outdir: Path, *, compression: CompressSpec,
                 recipients: RecipientSet | None, mode: int, sync: bool) -> None:
        self.outdir = outdir
        self.partial = outdir / PARTIAL_DIRECTORY
        self.form = StoredForm(compression)
        self.recipients = recipients
        self.mode, self.sync = mode, sync
        self.tables: list[TableEntry] = []

    def begin(self, slot: str) -> None:
        """Start a new snapshot for ``slot``: its directory and intent, durably, before the
        slot is created (a run killed after the creation is then known to own the slot)."""
        shutil.rmtree(self.partial, ignore_errors=True)
        self.partial.mkdir(mode=0o700)
        durable.write_file_durably(self.partial, INTENT, encode({"slot": slot}),
                                   mode=self.mode, sync=self.sync)
        durable.sync_path(self.outdir, sync=self.sync)

    def write_table(self, table: SnapshotTable, header: dict[str, Any],
                    rows: Iterable[list[str | None]]) -> int:
        """Write ``table``'s file from its ``rows`` (values in column order); its row count."""
        index = len(self.tables) + 1
        name = f"{index:04d}.jsonl" + AtRest(self.form.method).suffix
        path = self.partial / name
        names = [column.name for column in table.columns]
        count = 0
        with durable.durable_file(path, self.mode, sync=self.sync) as out, \
                self.form.writer() as writer:
            out.write(writer.begin())
            out.write(writer.update(encode({"op": "header", "format": FORMAT, **header})))
            out.write(writer.update(encode({
                "op": "relation", "lsn": header["consistent_point"], "schema": table.schema,
                "table": table.table,
                "columns": [{"name": c.name, "type": c.type, "key": c.key}
                            for c in table.columns]})))
            batch: list[bytes] = []
            for values in rows:
                if len(values) != len(names):
                    raise ArchiveError(f"table {table.name}: a row of {len(values)} values "
                                       f"for {len(names)} columns")
                batch.append(encode({"op": "row", "new": dict(zip(names, values, strict=True))}))
                count += 1
                if len(batch) >= 1024:
                    out.write(writer.update(b"".join(batch)))
                    batch.clear()
            batch.append(encode({"op": "end", "rows": count}))
            out.write(writer.update(b"".join(batch)))
            out.write(writer.finish())
        if self.recipients is not None:
            path = seal_file(path, self.recipients, mode=self.mode, sync=self.sync)
        self.tables.append(TableEntry(table.schema, table.table, path.name, count))
        return count

    def finish(self, slot: str, snapshot: str, consistent_point: int, taken_at: str) -> Path:
        """Write the manifest last, then name the directory ``snapshot/``: complete."""
        manifest = {"format": FORMAT, "slot": slot, "snapshot": snapshot,
                    "consistent_point": format_lsn(consistent_point), "taken_at": taken_at,
                    "tables": [{"schema": t.schema, "table": t.table, "file": t.file,
                                "rows": t.rows} for t in self.tables]}
        (self.partial / INTENT).unlink()
        durable.write_file_durably(self.partial, MANIFEST,
                                   json.dumps(manifest, indent=1).encode() + b"\n",
                                   mode=self.mode, sync=self.sync)
        final = self.outdir / SNAPSHOT_DIRECTORY
        durable.sync_path(self.partial, sync=self.sync)  # its entries; the files are synced
        durable.finish_file(self.partial, final, sync=self.sync)  # a directory: renamed alike
        return final

    def abandon(self) -> None:
        """Remove what was written (the slot it was for is gone or never was)."""
        shutil.rmtree(self.partial, ignore_errors=True)
        durable.sync_path(self.outdir, sync=self.sync)


def unfinished_snapshot(outdir: Path) -> str | None:
    """The slot an interrupted snapshot of ``outdir`` was taken for (its intent), None when
    there is none. ArchiveError when its intent cannot be read."""
    path = outdir / PARTIAL_DIRECTORY / INTENT
    try:
        document = json.loads(path.read_bytes()[:4096])
        return str(document["slot"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArchiveError(f"{path} is damaged: {exc}") from exc


def read_manifest(outdir: Path) -> SnapshotManifest | None:
    """The complete snapshot of the change log in ``outdir``, None when it has none.
    ArchiveError naming the manifest when it cannot be read or is not one."""
    path = outdir / SNAPSHOT_DIRECTORY / MANIFEST
    try:
        with path.open("rb") as fh:
            data = fh.read(SNAPSHOT_MANIFEST_CAP)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ArchiveError(f"snapshot manifest {path}: {exc}") from exc
    return parse_snapshot_manifest(data, str(path))


def parse_snapshot_manifest(data: bytes, where: str) -> SnapshotManifest:
    """A manifest's bytes read as one; ArchiveError naming ``where`` when they are not one."""
    try:
        return _manifest(json.loads(data))
    except (KeyError, TypeError, ValueError, ArchiveError) as exc:
        raise ArchiveError(f"snapshot manifest {where}: {exc}") from exc


def _manifest(document: Any) -> SnapshotManifest:
    if document["format"] != FORMAT:
        raise ValueError(f"format {document['format']!r} is not {FORMAT}")
    tables = tuple(TableEntry(str(t["schema"]), str(t["table"]), str(t["file"]), int(t["rows"]))
                   for t in document["tables"])
    for entry in tables:
        if _TABLE_FILE.match(entry.file) is None:
            raise ValueError(f"{entry.file!r} is not a table file's name")
    return SnapshotManifest(str(document["slot"]), str(document["snapshot"]),
                            parse_lsn(str(document["consistent_point"])), tables,
                            document.get("taken_at"))


def table_records(outdir: Path, entry: TableEntry,
                  keys: Keys | None = None) -> Iterator[dict[str, Any]]:
    """The lines of one table's file (header, relation, rows), checked against the manifest
    (a sealed file opened with ``keys``): ArchiveError naming the file when it is cut short
    or holds another number of rows."""
    path = outdir / SNAPSHOT_DIRECTORY / entry.file
    method = "zstd" if ".jsonl.zst" in entry.file else ""
    rows = 0
    ended = False
    try:
        with path.open("rb") as fh:
            lines = PlainLines(fh, method, unsealing_for(path, keys, "reading"))
            for line in lines:
                record = json.loads(line)
                if ended:
                    raise ArchiveError(f"{path}: a line after its end line")
                if record.get("op") == "end":
                    ended = True
                    if record.get("rows") != rows:
                        raise ArchiveError(f"{path}: its end line counts "
                                           f"{record.get('rows')} rows, it holds {rows}")
                    continue
                if record.get("op") == "row":
                    rows += 1
                yield record
    except (OSError, ValueError) as exc:
        raise ArchiveError(f"snapshot file {path}: {exc}") from exc
    if not ended or lines.tail:
        raise ArchiveError(f"snapshot file {path} is cut short (no end line)")
    if rows != entry.rows:
        raise ArchiveError(f"snapshot file {path} holds {rows} rows, its manifest says "
                           f"{entry.rows}")
