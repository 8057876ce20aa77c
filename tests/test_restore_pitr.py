"""Point-in-time recovery of a real base backup from a local archive that holds a bad file
(issue 25, items 1, 2 and 5): PostgreSQL trusts what restore_command gives it, and given a
damaged segment, another cluster's or a .partial of random bytes, it ends replay at the bad
record, promotes and never reads the rest: marker rows silently lost. With restore checking
what it serves, the call exits 126 and PostgreSQL stops recovery instead.

One primary (1 MiB segments: WAL is cheap to write), one base backup and one archive for the
whole module: eight marker rows, each in a segment of its own. Each case recovers a copy of the
backup from a copy of the archive with one file spoiled, with prefetch on (the filler checks
too) unless the case says otherwise."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.postgres_user import install_for_postgres, readable_by_postgres
from support.recovery import copy_of, recover_or_stop
from support.scanner import scan_segment
from support.servers import PgServer, make_shared_dir

from receivewal.wal.lsn import format_lsn

pytestmark = pytest.mark.server

SEGMENT = 1 << 20
MARKERS = 8
IDENTITY = ".receivewal-archive.json"


@dataclass(frozen=True)
class Setup:
    base: Path
    backup: PgServer
    archive: Path  # every segment the backup needs, and the identity file
    marker_segments: list[str]  # the segment holding each marker row, in order
    other_segment: bytes  # another cluster's segment under marker 3's segment's name
    command: str  # the restore_command prefix, runnable by the server user


def write_markers(primary: PgServer) -> list[str]:
    """Eight marker rows, each followed by about a segment of WAL and a switch; the segment
    that holds each marker row."""
    primary.sql("CREATE TABLE marker (n int)")
    primary.sql("CREATE TABLE filler (id bigint, pad text)")
    segments = []
    for n in range(1, MARKERS + 1):
        primary.sql(f"INSERT INTO marker VALUES ({n})")
        segments.append(primary.sql("SELECT pg_walfile_name(pg_current_wal_insert_lsn())"))
        primary.sql("INSERT INTO filler SELECT g, repeat('x', 150) FROM generate_series(1, 2500) g")
        primary.switch_wal()
    return segments


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    base = make_shared_dir("receivewal-pitr-")
    primary = PgServer(base, "primary")
    other = PgServer(base, "other")
    try:
        primary.init(initdb_args=("--wal-segsize=1",))
        primary.start()
        backup = primary.base_backup("backup")
        first = (backup.datadir / "backup_label").read_text().split("(file ")[1][:24]
        markers = write_markers(primary)
        sysid = primary.sql("SELECT system_identifier FROM pg_control_system()")
        primary.stop()
        archive = base / "archive"
        archive.mkdir()
        for path in sorted(primary.pg_wal.iterdir()):
            if len(path.name) == 24 and first <= path.name <= markers[-1]:
                shutil.copy(path, archive / path.name)
        (archive / IDENTITY).write_text(json.dumps(
            {"system_identifier": sysid, "wal_segment_size": SEGMENT, "timeline": 1}))
        other.init(initdb_args=("--wal-segsize=1",))
        other.start()
        while other.sql("SELECT pg_walfile_name(pg_current_wal_insert_lsn())") <= markers[2]:
            other.switch_wal()
        other.stop()
        theirs = (other.pg_wal / markers[2]).read_bytes()
        yield Setup(base, backup, archive, markers, theirs, install_for_postgres(base))
    finally:
        primary.stop("immediate")
        other.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def archive_copy(setup: Setup, name: str) -> Path:
    path = setup.base / f"archive-{name}"
    shutil.copytree(setup.archive, path)
    return path


def recover(setup: Setup, case: str, archive: Path, *options: str) -> tuple[bool, PgServer]:
    """Recover a copy of the backup from ``archive``; whether it promoted, and the server."""
    readable_by_postgres(archive)
    server = copy_of(setup.backup, f"recovered-{case}")
    command = (f"RECEIVEWAL_PREFETCH_IDLE=3 {setup.command} -D {archive} {' '.join(options)} "
               "%f %p")
    return recover_or_stop(server, command), server


def markers_after(promoted: bool, server: PgServer) -> str:
    """What a promoted server holds, for the failure message."""
    if not promoted:
        return "stopped"
    return f"promoted with {server.sql('SELECT count(*) FROM marker')} of {MARKERS} marker rows"


def assert_stopped_by_restore(setup: Setup, case: str, archive: Path, words: list[str],
                              *options: str) -> None:
    """Recovery from ``archive`` stops (restore_command exits 126, one line naming the file
    and the LSN in the server's log) instead of promoting with marker rows missing."""
    promoted, server = recover(setup, case, archive, *options)
    try:
        log = server.logfile.read_text()
        assert not promoted, f"{markers_after(promoted, server)}; server log:\n{log[-3000:]}"
        lines = [line for line in log.splitlines() if line.startswith("receivewal restore: error")]
        assert lines, log[-3000:]
        assert all(word in lines[-1] for word in words), lines
        # PostgreSQL's words for exit status 126, which it takes as fatal
        assert f'could not restore file "{words[0][:24]}" from archive: command not ' \
            "executable" in log, log[-3000:]
    finally:
        server.stop("immediate")


def record_inside(data: bytes, name: str) -> int:
    """The offset of a record in the middle of the segment that lies on one page."""
    lsns = scan_segment(data, name, SEGMENT, collect=True).record_lsns
    for lsn in lsns[len(lsns) // 2:]:
        pos = lsn % SEGMENT
        length = struct.unpack_from("<I", data, pos)[0]
        if length >= 64 and pos % 8192 + length <= 8192:
            return pos
    raise AssertionError(f"no record on one page in {name}")


def test_the_good_archive_recovers_every_marker(setup: Setup) -> None:
    """The checks pass a real server's WAL (records crossing pages and segments included):
    recovery from the archive as it is reaches all eight marker rows."""
    promoted, server = recover(setup, "good", setup.archive)
    try:
        assert promoted, server.logfile.read_text()[-3000:]
        assert server.sql("SELECT count(*) FROM marker") == str(MARKERS)
        assert "from the prefetch spool" in server.logfile.read_text()
    finally:
        server.stop("immediate")


def test_a_segment_with_a_flipped_bit_stops_recovery(setup: Setup) -> None:
    """Item 1: one bit flipped in a record of marker 5's segment. Before: restored with exit
    0, PostgreSQL promoted with 5 of 8 markers. Now: exit 126 naming the file and the record's
    LSN, and recovery stops."""
    archive = archive_copy(setup, "flipped")
    name = setup.marker_segments[4]
    data = bytearray((archive / name).read_bytes())
    at = record_inside(bytes(data), name)
    data[at + 40] ^= 0x01
    (archive / name).write_bytes(data)
    lsn = format_lsn(int(name[8:16], 16) << 32 | int(name[16:], 16) * SEGMENT | at)
    assert_stopped_by_restore(setup, "flipped", archive, [name, lsn])


def test_another_clusters_segment_stops_recovery(setup: Setup) -> None:
    """Item 2: marker 3's segment replaced by another cluster's segment of the same name (the
    archive's identity file names this cluster). Before: exit 0, PostgreSQL refused the page
    header, ended recovery and promoted with 2 of 8 markers. Now: exit 126."""
    archive = archive_copy(setup, "other")
    name = setup.marker_segments[2]
    (archive / name).write_bytes(setup.other_segment)
    assert_stopped_by_restore(setup, "other", archive, [name, "database system"])


def test_a_partial_of_random_bytes_stops_recovery(setup: Setup) -> None:
    """Item 5: with ``--partial``, the last segment only as a .partial of random bytes.
    Before: served with exit 0, PostgreSQL found no valid page and promoted with 7 of 8
    markers. Now: exit 126."""
    archive = archive_copy(setup, "partial")
    name = setup.marker_segments[-1]
    (archive / name).unlink()
    (archive / (name + ".partial")).write_bytes(os.urandom(SEGMENT))
    assert_stopped_by_restore(setup, "partial", archive, [name + ".partial"], "--partial")
