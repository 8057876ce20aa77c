"""The design rule of issue 25, read from the package's source: one function yields a checked
segment (:func:`receivewal.archive.segmentcheck.checked_segment`), and every path that hands
WAL out of the archive goes through it.

Every function of the package that writes a file or an object (``durable_file``,
``write_file_durably``, ``create_temporary``, ``finish_file``, ``put_new``) is listed
below, either as a path that hands WAL out (and then it must reach ``checked_segment``) or as
one that writes something else, with the reason. A new function that writes is in neither list
until someone decides which it is: a new serving path cannot bypass the check unnoticed.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "receivewal"
WRITERS = {"durable_file", "write_file_durably", "create_temporary", "finish_file",
           "put_new"}

#: The paths that hand WAL out: each reaches checked_segment (directly or through the one
#: function that calls it), with what it serves.
HANDS_OUT = {
    "restore/writing.py::write_restored":
        "restore's one writer of %p: a directory, --partial, a bucket (BucketSource.restore), "
        "and the prefetch filler (whose fetch is restore_file or BucketSource.restore)",
    "walreceiver/uploader.py::Uploader._upload":
        "uploads a completed segment: the bytes checked_file read and checked are the bytes "
        "put (issue 25 item 6)",
    "restore/filler.py::Spool._fetch_sized":
        "the filler renames into the spool what its fetch wrote through write_restored",
    "restore/served.py::take":
        "a call renames a spooled file to %p: only the filler writes the spool, through "
        "write_restored (see the filler's fetch below), and take serves it only while that "
        "filler lives, for the recorded source and system",
}
#: Paths that hand WAL out but do not go through the check yet, with who changes that.
NOT_YET: dict[str, str] = {}
#: Functions that write, but hand no WAL out of the archive.
WRITES_OTHER = {
    "archive/durable.py::durable_file": "the primitive itself",
    "archive/durable.py::write_file_durably": "the primitive itself",
    "archive/durable.py::probe_writable": "an empty probe file",
    "archive/directory.py::Archive._write_lock_record": "the lock file",
    "archive/directory.py::Archive.write_identity": "the identity file",
    "archive/directory.py::Archive.write_file_durably": "small files of the archive",
    "archive/directory.py::Archive.write_history": "a history file as the server sent it",
    "archive/identity.py::claim_identity": "the identity record, create-only",
    "archive/location.py::DirectoryLocation.put_new": "the directory driver's create-only put "
        "of a small file (the location interface's; WAL is uploaded by the uploader, above, "
        "and restored through write_restored)",
    "archive/partials.py::_convert": "a .partial converted inside the archive (start-up)",
    "archive/uploads.py::write_upload_record": "the upload record",
    "logical/snapshot.py::SnapshotWriter.begin": "a change log's snapshot: its intent",
    "logical/snapshot.py::SnapshotWriter.write_table": "a change log's snapshot: a table",
    "logical/snapshot.py::SnapshotWriter.finish": "a change log's snapshot: its manifest",
    "check/asoftables.py::put_parts": "analyze --as-of: a table's Parquet part put "
                                      "create-only into a bucket (no WAL)",
    "restore/spoolfiles.py::_write_bytes": "the spool's small records (.wanted, .window...)",
    "archive/writer.py::SegmentWriter._create_temporary": "the daemon writing what it receives",
    "archive/writer.py::SegmentWriter._create_preallocated": "the daemon writing what it receives",
    "archive/writer.py::SegmentWriter._promote": "the daemon writing what it receives",
    "archive/writer.py::SegmentWriter._finish_file": "the daemon writing what it receives",
    "archive/writer.py::CompressedSegmentWriter._synced": "the daemon writing what it receives",
    "daemon/state.py::write_state": "the state file",
    "logicalreceiver/changeuploads.py::ChangeUploader._upload":
        "a completed change file put create-only into the bucket (no WAL)",
    "logical/store.py::ChangeLogStore._complete": "a change log file (no WAL)",
    "backup/backupdir.py::BackupDirectory.begin_archive": "a base backup's tar (no WAL)",
    "backup/backupdir.py::BackupDirectory.end_archive": "a base backup's tar (no WAL)",
    "backup/backupdir.py::BackupDirectory.write_manifest": "a base backup's manifest",
    "backup/backupdir.py::BackupDirectory.commit": "a base backup's record",
    "recovery/unpack.py::_rewrite_tablespace_map": "a recovered data directory's tablespace map",
    "recovery/unpack.py::write_recovery": "a recovered data directory's recovery settings",
    "logical/store.py::ChangeLogStore._compress": "a change log file (no WAL)",
    "archive/sealed.py::seal_stream": "a completed file sealed inside the archive (a segment "
    "is checked first: SegmentWriter._seal's sealed_input reaches checked_segment, since "
    "nothing can check it once sealed; the uploader then puts it as it sits)",
    "archive/sealed.py::write_recipients_file": "a sealed file's recipients file",
    "walreceiver/uploader.py::Uploader._sealed_body": "a sealed file's recipients object",
    "backup/upload.py::BucketBackup.claim": "a bucket backup's claim of its ID (no WAL)",
    "backup/upload.py::BucketBackup._put_new": "a base backup's small object, in a bucket: its "
    "manifest, record or recipients (no WAL)",
    "backup/upload.py::BucketBackup.commit": "a base backup's record, in a bucket",
    "logical/store.py::ChangeLogStore._record": "a change log's small records (no WAL)",
}


def functions() -> dict[str, set[str]]:
    """Every function and method of the package, as ``path::Class.name`` (nested ones as
    ``path::outer.name``; two of one name are one entry), with the names it calls."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE))
        tree = ast.parse(path.read_text())
        durable = {alias.asname or alias.name for node in ast.walk(tree)
                   if isinstance(node, ast.ImportFrom)
                   and node.module == "receivewal.archive.durable" for alias in node.names}

        def visit(node: ast.AST, prefix: str, where: str = where,
                  durable: set[str] = durable) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    found[f"{where}::{prefix}{child.name}"] |= called(child, durable)
                    visit(child, f"{prefix}{child.name}.")
                elif isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.")
                else:
                    visit(child, prefix)

        visit(tree, "")
    return found


def called(function: ast.AST, durable: set[str]) -> set[str]:
    """The names a function calls (``f(...)`` and ``x.f(...)`` alike, nested functions
    included); a call of durable's (``durable.finish_file``, or ``finish_file`` imported from
    it) also as ``durable.NAME``."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                names.add(func.id)
                if func.id in durable:
                    names.add(f"durable.{func.id}")
            elif isinstance(func, ast.Attribute):
                names.add(func.attr)
                if isinstance(func.value, ast.Name) and func.value.id == "durable":
                    names.add(f"durable.{func.attr}")
    return names


def reaches(start: str, target: str, graph: dict[str, set[str]], by_name: dict[str, set[str]],
            ) -> bool:
    """Whether the function ``start`` calls ``target`` directly or through the package's
    functions (by name: a method and a function of the same name are both followed)."""
    seen, todo = set(), [start]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for name in graph[current]:
            if name == target:
                return True
            todo.extend(by_name.get(name, ()))
    return False


def test_every_function_that_writes_is_classified() -> None:
    """The functions that write files or objects are exactly the three lists' (a new one must
    be put in one of them, saying whether it hands WAL out)."""
    writes = {key for key, names in functions().items()
              if names & WRITERS}
    listed = {**HANDS_OUT, **NOT_YET, **WRITES_OTHER}
    assert sorted(writes - listed.keys()) == [], "unclassified writers"
    assert sorted(listed.keys() - writes) == [], "listed functions that no longer write"


def test_every_path_that_hands_wal_out_reaches_the_check() -> None:
    """Each serving path calls checked_segment, or calls what calls it; the filler's fetch
    (what fills the spool take serves from) is restore_file or BucketSource.restore, which
    reach it; the paths not checked yet do not reach it (else: move them)."""
    graph = functions()
    by_name: dict[str, set[str]] = defaultdict(set)
    for key in graph:
        by_name[key.rsplit("::", 1)[1].rsplit(".", 1)[-1]].add(key)
    check = "checked_segment"
    assert reaches("restore/writing.py::write_restored", check, graph, by_name)
    for source in ("restore/local.py::restore_file",
                   "restore/remote.py::BucketSource.restore"):
        assert "write_restored" in graph[source], source
    fetch = graph["restore/launch.py::fetcher.fetch"] | \
        graph["restore/launch.py::fetcher.restore"]
    assert {"restore_file", "restore"} <= fetch
    writing = {name for name in fetch if name in WRITERS or name.startswith("durable.")}
    assert writing == set(), "the filler's fetch writes only through restore's one path"
    for path in NOT_YET:
        assert not reaches(path, check, graph, by_name), f"{path} is checked now: HANDS_OUT"
    # a sealed segment is uploaded as it sits: it was checked when it was sealed
    assert reaches("archive/writer.py::SegmentWriter._seal", check, graph, by_name)


def test_the_check_is_the_verify_scanner() -> None:
    """checked_segment runs wal/reader's SegmentScanner (verify's): no second scanner."""
    source = (PACKAGE / "archive" / "segmentcheck.py").read_text()
    assert "from receivewal.wal.reader import SegmentScanner" in source
    scanners = [key for key in functions() if key.endswith((".scan", "::scan"))]
    assert scanners == ["wal/reader.py::SegmentScanner.scan"]
