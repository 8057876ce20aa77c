"""Build WAL archives from real PostgreSQL 15 servers for the verify and analyze tests.

The archives are made the way pg_receivewal would leave them, without the streaming daemon:
completed segments and history files copied from the servers' ``pg_wal``, the old timeline's
last segment as ``.partial`` (as the promoted standby renames it), the newest segment as a
zero-padded ``.partial``, and compressed copies (gzip and LZ4 frame as pg_receivewal 15 writes
them, a zstd frame).
"""

from __future__ import annotations

import fcntl
import gzip
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lz4.frame
import zstandard

from receivewal.check.crosscheck import ArchiveReport
from receivewal.check.verify import rmgr_totals, verify_archive
from receivewal.wal.lsn import parse_lsn
from support.clusters import templates_dir
from support.servers import PgServer, make_shared_dir
from support.streams import wait_for

SEGMENT_SIZE = 1 << 20
INITDB_ARGS = ("--wal-segsize=1",)
COMPRESSORS = {
    "": lambda data: data,
    ".gz": gzip.compress,
    ".lz4": lz4.frame.compress,
    ".zst": lambda data: zstandard.ZstdCompressor(level=3).compress(data),
}


@dataclass
class BuiltArchive:
    """A plain archive (every file uncompressed) plus what the test needs to know about it."""

    plain: Path  # all files uncompressed: completed segments, .partial files, history
    tl1: list[str]  # completed timeline 1 segments, in order
    tl2: list[str]  # completed timeline 2 segments, in order
    tl1_partial: str
    tl2_partial: str
    switchpoint: str


def lsn_int(text: str) -> int:
    """An LSN printed by the server as an integer."""
    return parse_lsn(text)


def new_server(base: Path, name: str) -> PgServer:
    """A started primary with 1 MiB segments."""
    server = PgServer(base, name)
    server.init(initdb_args=INITDB_ARGS)
    server.start()
    return server


def write_wal(server: PgServer, rows: int, table: str = "t") -> None:
    """Inserts, an index, updates and a checkpoint: several resource managers and FPIs."""
    server.sql(f"CREATE TABLE IF NOT EXISTS {table} (id int, pad text)")
    server.sql(f"CREATE INDEX IF NOT EXISTS {table}_id ON {table} (id)")
    server.sql(f"INSERT INTO {table} SELECT g, repeat('p', 150) "
               f"FROM generate_series(1, {rows}) g")
    server.sql("CHECKPOINT")
    server.sql(f"UPDATE {table} SET pad = 'u' WHERE id % 5 = 0")


def _segment_names(wal: Path, timeline: int, below: str) -> list[str]:
    prefix = f"{timeline:08X}"
    return sorted(p.name for p in wal.iterdir()
                  if len(p.name) == 24 and p.name.startswith(prefix) and p.name < below)


def _copy_zero_padded(src: Path, dst: Path, upto: int) -> None:
    """Copy a segment that is still being written, zeroing what lies past ``upto`` (offset)."""
    data = bytearray(src.read_bytes())
    cut = (upto + 8191) // 8192 * 8192
    data[cut:] = bytes(len(data) - cut)
    dst.write_bytes(bytes(data))


def build_two_timeline_archive(base: Path, out: Path, rows: int = 12000) -> BuiltArchive:
    """Timeline 1 on a primary, a standby promoted to timeline 2, WAL on both: an archive."""
    out.mkdir(parents=True, exist_ok=True)
    primary = new_server(base, "primary")
    standby = None
    try:
        write_wal(primary, rows)
        standby = primary.make_standby("standby")
        write_wal(primary, rows // 2, "t2")
        target = primary.sql("SELECT pg_current_wal_lsn()")
        wait_for(lambda: lsn_int(standby.current_lsn()) >= lsn_int(target),
                 what="the standby to catch up")
        primary.stop("fast")
        wait_for(lambda: standby.sql("SELECT count(*) FROM pg_stat_wal_receiver "
                                     "WHERE status = 'streaming'") == "0",
                 what="the standby to see the primary gone")
        standby.promote()
        history = (standby.pg_wal / "00000002.history").read_text()
        switchpoint = history.split()[1]
        write_wal(standby, rows, "t3")
        standby.sql("CHECKPOINT")  # commits are asynchronous: make the WAL reach the files
        current = standby.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
        flush = lsn_int(standby.sql("SELECT pg_current_wal_flush_lsn()"))
        switch_name = standby.sql(f"SELECT pg_walfile_name('{switchpoint}')")
        switch_name = "00000001" + switch_name[8:]
        tl1 = _segment_names(primary.pg_wal, 1, switch_name)
        for name in tl1:
            shutil.copy(primary.pg_wal / name, out / name)
        tl1_partial = switch_name + ".partial"
        src = standby.pg_wal / tl1_partial  # renamed only when archiving is on
        if not src.exists():
            src = standby.pg_wal / switch_name
        _copy_zero_padded(src, out / tl1_partial,
                          lsn_int(switchpoint) % SEGMENT_SIZE)
        shutil.copy(standby.pg_wal / "00000002.history", out / "00000002.history")
        tl2 = _segment_names(standby.pg_wal, 2, current)
        for name in tl2:
            shutil.copy(standby.pg_wal / name, out / name)
        tl2_partial = current + ".partial"
        _copy_zero_padded(standby.pg_wal / current, out / tl2_partial, flush % SEGMENT_SIZE)
        return BuiltArchive(out, tl1, tl2, tl1_partial, tl2_partial, switchpoint)
    finally:
        if standby is not None:
            standby.stop("immediate")
        primary.stop("immediate")


def build_single_archive(base: Path, name: str, out: Path, rows: int = 6000) -> list[str]:
    """One server's completed segments (timeline 1), copied plain; their names."""
    out.mkdir(parents=True, exist_ok=True)
    server = new_server(base, name)
    try:
        write_wal(server, rows)
        return copy_completed_segments(server, out)
    finally:
        server.stop("immediate")


def copy_completed_segments(server: PgServer, out: Path) -> list[str]:
    """Switch to a new segment and copy every completed timeline 1 segment into ``out``
    (plain); their names."""
    current = server.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
    server.switch_wal()
    names = _segment_names(server.pg_wal, 1, current)
    for seg in names:
        shutil.copy(server.pg_wal / seg, out / seg)
    return names


@dataclass(frozen=True)
class TwoArchives:
    """Two archives from two servers (different system identifiers); ``beta`` lacks the
    segment ``removed``. ``built`` is when the first server started and the last stopped."""

    alpha: Path
    beta: Path
    removed: str
    built: tuple[float, float]


def build_two_server_archives(root: Path, prefix: str) -> TwoArchives:
    """Two archives from two servers under ``root``; the servers' scratch directory (named
    with ``prefix``) is removed once they are built."""
    began = time.time()
    base = make_shared_dir(prefix)
    try:
        build_single_archive(base, "alpha", root / "alpha")
        names = build_single_archive(base, "beta", root / "beta", rows=9000)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    removed = names[len(names) // 2]
    (root / "beta" / removed).unlink()
    return TwoArchives(root / "alpha", root / "beta", removed, (began, time.time()))


def two_server_archives_once(prefix: str) -> TwoArchives:
    """:func:`build_two_server_archives`, once per run for every process of it: in the run's
    shared directory (support.clusters.templates_dir, which pytest-xdist's workers inherit),
    built under an exclusive ``flock``; a process that comes later (or waited on the lock)
    takes what the first one built. The readers only read the archives."""
    root = templates_dir() / "two-archives"
    with (templates_dir() / "two-archives.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # closing the file releases it
        record = root / "built.json"
        if record.exists():
            facts = json.loads(record.read_text())
            return TwoArchives(root / "alpha", root / "beta", facts["removed"],
                               (facts["built"][0], facts["built"][1]))
        shutil.rmtree(root, ignore_errors=True)  # a builder that died half-way
        root.mkdir()
        archives = build_two_server_archives(root, prefix)
        record.write_text(json.dumps({"removed": archives.removed,
                                      "built": list(archives.built)}))
        return archives


def archive_key(archive: Path) -> str:
    """How analyze runs over two_server_archives name them: alpha by path, beta by file:// URI."""
    return archive.as_uri() if archive.name == "beta" else str(archive)


def compressed_copy(src: Path, dst: Path) -> dict[str, str]:
    """Copy an archive, compressing segment files in turn with each method; old -> new name."""
    dst.mkdir(parents=True, exist_ok=True)
    renamed = {}
    suffixes = list(COMPRESSORS)
    for i, path in enumerate(sorted(src.iterdir())):
        if path.name.endswith(".history"):
            shutil.copy(path, dst / path.name)
            continue
        suffix = suffixes[i % len(suffixes)]
        stem, partial = path.name.removesuffix(".partial"), path.name.endswith(".partial")
        new = stem + suffix + (".partial" if partial else "")
        (dst / new).write_bytes(COMPRESSORS[suffix](path.read_bytes()))
        renamed[path.name] = new
    return renamed


def rmgr_table_totals(spark: Any, table: str, key: str) -> dict[str, tuple[int, int, int]]:
    """(records, record bytes, FPI bytes) per resource manager of archive ``key`` in analyze's
    segment_rmgr table: what verify's ``rmgr_totals`` gives for the same archive."""
    rows = spark.read.parquet(table)
    totals: dict[str, tuple[int, int, int]] = {}
    for r in rows.where(rows.archive == key).collect():
        acc = totals.get(r["rmgr"], (0, 0, 0))
        totals[r["rmgr"]] = (acc[0] + r["records"], acc[1] + r["record_bytes"],
                             acc[2] + r["fpi_bytes"])
    return totals


def segment_table_rows(spark: Any, table: str, key: str) -> dict[str, tuple[int, ...]]:
    """(records, record bytes, FPI bytes, valid end) per segment file of archive ``key`` in
    analyze's segments table, as :func:`verify_segment_rows` gives them from verify."""
    rows = spark.read.parquet(table)
    return {r["file"]: (r["records"], r["record_bytes"], r["fpi_bytes"], r["valid_end"])
            for r in rows.where(rows.archive == key).collect()}


def verify_segment_rows(report: ArchiveReport) -> dict[str, tuple[int, ...]]:
    """The same per-segment figures from a verify report."""
    return {s.file: (s.records, s.record_bytes, s.fpi_bytes, s.valid_end) for s in report.scans}


def assert_tables_agree_with_verify(rows: Callable[[str], list[dict[str, Any]]],
                                    archives: TwoArchives) -> None:
    """The analyze tables of a run over ``archives`` (alpha by path, beta by URI; ``rows``
    reads one table by name) equal verify's on each archive: one segments row per file with
    verify's records and FPI bytes, every segment 1 MiB and smaller in zstd, per-rmgr totals;
    no problem in alpha, beta's removed segment its one missing_segment; alpha is
    recoverable, beta is not, and their system identifiers differ."""
    segments, rmgr = rows("segments"), rows("segment_rmgr")
    for archive in (archives.alpha, archives.beta):
        report, _ = verify_archive(archive, jobs=1)
        own = [r for r in segments if r["archive"] == archive_key(archive)]
        assert len(own) == len(report.scans) == len(list(archive.iterdir()))
        assert sum(r["records"] for r in own) == sum(s.records for s in report.scans)
        assert sum(r["fpi_bytes"] for r in own) == sum(s.fpi_bytes for s in report.scans)
        assert all(r["data_bytes"] == SEGMENT_SIZE > r["zstd_bytes"] for r in own)
        totals: dict[str, tuple[int, int, int]] = {}
        for r in (r for r in rmgr if r["archive"] == archive_key(archive)):
            acc = totals.get(r["rmgr"], (0, 0, 0))
            totals[r["rmgr"]] = (acc[0] + r["records"], acc[1] + r["record_bytes"],
                                 acc[2] + r["fpi_bytes"])
        assert totals == rmgr_totals(report.scans)
    alpha, beta, removed = archive_key(archives.alpha), archive_key(archives.beta), archives.removed
    problems = rows("problems")
    assert not [p for p in problems if p["archive"] == alpha]
    assert [(p["archive"], p["file"], p["lsn"]) for p in problems
            if p["kind"] == "missing_segment"] == [
        (beta, removed, int(removed[16:], 16) * SEGMENT_SIZE)]
    verdicts = {r["archive"]: r for r in rows("archives")}
    assert {name: r["recoverable"] for name, r in verdicts.items()} == {alpha: True, beta: False}
    assert verdicts[alpha]["system_identifier"] != verdicts[beta]["system_identifier"]


class SharedSession:
    """A test's shared Spark session given to a command as its own (monkeypatch
    ``sparksession.make_session`` to return it): the command must not stop it."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def __getattr__(self, name: str) -> Any:
        return getattr(self.spark, name)

    def stop(self) -> None:
        pass
