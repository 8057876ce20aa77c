"""The WAL that bench/slow_link.py streams: a range of whole segments of pgbench WAL on the
primary, held by one replication slot per run, and the check that an archive equals it."""

from __future__ import annotations

import filecmp
import subprocess
from dataclasses import dataclass
from pathlib import Path

from support.servers import PgServer, pg_bin

from receivewal.wal.lsn import format_lsn, parse_lsn
from receivewal.wal.names import wal_file_name

SEGMENT = 16 << 20
SCALE, TRANSACTIONS, DEFAULT_MB = 5, 3000, 84
"""The default WAL: pgbench -i -s 5 and 2 x 3000 transactions make 83.9 MB."""


def volume(mb: float | None, scale: int | None, transactions: int | None) -> tuple[int, int]:
    """pgbench's scale and transactions per client: as given, else the defaults, grown
    together for about ``mb`` MB of WAL (the same mix of initialisation and TPC-B)."""
    if mb is None:
        return scale or SCALE, transactions or TRANSACTIONS
    factor = mb / DEFAULT_MB
    return max(1, round(SCALE * factor)), max(1, round(TRANSACTIONS * factor))


@dataclass(frozen=True)
class WalRange:
    start: int
    end: int
    slots: tuple[str, ...]


def make_wal(server: PgServer, runs: int, scale: int, transactions: int) -> WalRange:
    """Reserve one slot per run (and one that holds the range), write pgbench WAL, and switch
    segments: the range is whole segments [start, end) of timeline 1."""
    slots = tuple(f"bench_{i}" for i in range(runs + 1))
    for slot in slots:
        server.sql(f"SELECT pg_create_physical_replication_slot('{slot}', true)")
    restart = server.sql("SELECT min(restart_lsn), max(restart_lsn) FROM pg_replication_slots")
    first, last = (parse_lsn(x) for x in restart.split("|"))
    start = first // SEGMENT * SEGMENT
    assert last // SEGMENT * SEGMENT == start, "slots reserved WAL in different segments"
    pgbench = [pg_bin("pgbench"), "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres"]
    subprocess.run([*pgbench, "-i", "-q", "-s", str(scale), "postgres"],
                   check=True, capture_output=True)
    subprocess.run([*pgbench, "-c", "2", "-t", str(transactions), "postgres"],
                   check=True, capture_output=True)
    switch_end = parse_lsn(server.switch_wal())
    end = (switch_end - 1) // SEGMENT * SEGMENT + SEGMENT
    # pg_receivewal -E stops only on a message that goes past the end position: give it one
    server.sql("CREATE TABLE after_range AS SELECT generate_series(1, 1000) AS x")
    assert parse_lsn(server.sql("SELECT pg_current_wal_flush_lsn()")) > end
    return WalRange(start, end, slots[:-1])


def check_archive(server: PgServer, directory: Path, wal: WalRange) -> None:
    """The archive holds the range's segments, each equal to the server's file. pg_receivewal
    writes whole messages, so a ``.partial`` of the segment at the range's end may follow."""
    names = {wal_file_name(1, segno, SEGMENT)
             for segno in range(wal.start // SEGMENT, wal.end // SEGMENT)}
    beyond = {wal_file_name(1, wal.end // SEGMENT, SEGMENT) + ".partial"}
    found = {p.name for p in directory.iterdir() if p.name.startswith("00000001")}
    if not names <= found or found - names - beyond:
        raise AssertionError(f"{directory}: segments {sorted(found ^ names)} differ from "
                             f"the range {format_lsn(wal.start)}..{format_lsn(wal.end)}")
    for name in sorted(names):
        if not filecmp.cmp(directory / name, server.pg_wal / name, shallow=False):
            raise AssertionError(f"{directory / name} differs from the server's pg_wal")
