"""WAL over time: record timestamps checked against pg_waldump, and bytes spread over hours.

The timestamps come from a real PostgreSQL 15 server's segments: every commit time must equal
the one pg_waldump prints for the same LSN, and checkpoint times must fall inside the test's
run. The hour arithmetic is checked on marks made up for it.
"""

from __future__ import annotations

import datetime
import re
import time
from pathlib import Path

import pytest
from support.servers import PgServer
from support.waldump import waldump_output

from receivewal.check.walclock import (
    HOUR,
    merge_ranges,
    thin_marks,
    time_marks,
    time_span,
    wal_per_bucket,
)
from receivewal.wal.names import parse_segment_file_name
from receivewal.wal.reader import SegmentScanner

SEG = 16 << 20
_COMMIT = re.compile(r"lsn: ([0-9A-F]+)/([0-9A-F]+), .*desc: (?:COMMIT|ABORT) "
                     r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) ([A-Za-z+-:0-9]+)")


def commit_times(text: str) -> dict[int, float]:
    """LSN -> Unix time of each commit or abort record pg_waldump lists (UTC output)."""
    out = {}
    for m in _COMMIT.finditer(text):
        assert m.group(4) == "UTC", f"pg_waldump printed times in {m.group(4)}"
        when = datetime.datetime.strptime(m.group(3), "%Y-%m-%d %H:%M:%S.%f").replace(
            tzinfo=datetime.UTC)
        out[int(m.group(1), 16) << 32 | int(m.group(2), 16)] = when.timestamp()
    return out


@pytest.mark.server
def test_commit_and_checkpoint_times_equal_pg_waldump(pg: PgServer) -> None:
    """Every commit and abort time equals pg_waldump's for the same LSN (to the microsecond);
    checkpoint records give times of this server's life, the last one from the test's own."""
    began = time.time()
    pg.sql("CREATE TABLE t (id int, pad text)")
    for i in range(20):
        pg.sql(f"INSERT INTO t SELECT g, repeat('x', 300) FROM generate_series(1, {i * 50}) g")
    pg.sql("BEGIN; INSERT INTO t VALUES (1, 'gone'); ROLLBACK")
    pg.sql("CHECKPOINT")
    name = pg.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
    pg.switch_wal()
    data = (pg.pg_wal / name).read_bytes()
    seg = parse_segment_file_name(name, SEG)
    assert seg is not None
    scanner = SegmentScanner(data, name, start_lsn=seg.start_lsn(SEG), segment_size=SEG,
                             timeline=1, segno=seg.segno, collect_lsns=True)
    scan = scanner.result()
    marks = dict(time_marks(data, scan.start_lsn, scan.record_lsns))
    expected = commit_times(waldump_output(Path(pg.pg_wal), name, name))
    assert len(expected) > 20
    assert {lsn: marks[lsn] for lsn in expected if lsn in marks} == pytest.approx(expected,
                                                                                  abs=1e-6)
    assert set(expected) <= set(marks)
    checkpoints = [when for lsn, when in sorted(marks.items()) if lsn not in expected]
    # initdb's shutdown checkpoint, the start-up one and the test's own CHECKPOINT
    assert len(checkpoints) >= 2, checkpoints
    assert all(began - 120 <= when <= time.time() + 1 for when in checkpoints), checkpoints
    assert checkpoints[-1] >= int(began)  # CheckPoint.time has whole seconds


def test_bytes_are_spread_over_the_hours_they_were_written_in() -> None:
    """WAL between two marks an hour apart is split by time; empty hours are listed with 0;
    before the first and after the last mark time stands still."""
    t0 = 1_700_000_000 // HOUR * HOUR  # an hour boundary
    marks = [(1000, t0 + 1800.0), (3000, t0 + 5400.0), (4000, t0 + 4 * HOUR + 10.0)]
    hours = wal_per_bucket([(0, 5000)], marks)
    assert list(hours) == [t0 + h * HOUR for h in range(5)]
    # 0-1000 at t0+1800 (hour 0); 1000-3000 over 1800 s of hour 0 and 1800 s of hour 1;
    # 3000-4000 over the rest of hour 1 (1800 s), hours 2 and 3, and 10 s of hour 4.
    span = 4 * HOUR + 10 - 5400
    assert hours[t0] == 1000 + 1000
    assert hours[t0 + HOUR] == 1000 + round(1000 * 1800 / span)
    assert hours[t0 + 4 * HOUR] == round(1000 * 10 / span) + 1000
    assert sum(hours.values()) == pytest.approx(5000, abs=len(hours))
    assert time_span(marks) == (t0 + 1800.0, t0 + 4 * HOUR + 10.0)


def test_clock_never_runs_backwards_and_overlaps_count_once() -> None:
    """A checkpoint's earlier start time does not move the clock back; the same WAL held by
    a .partial and the next timeline's segment counts once."""
    t0 = 1_700_000_000 // HOUR * HOUR
    marks = [(100, t0 + 10.0), (200, t0 - 600.0), (300, t0 + 20.0)]
    assert time_span(marks) == (t0 + 10.0, t0 + 20.0)
    assert wal_per_bucket([(0, 400), (200, 400)], marks) == {t0: 400}
    assert merge_ranges([(0, 10), (5, 20), (30, 40), (40, 40)]) == [(0, 20), (30, 40)]


def test_thinning_keeps_first_and_last_of_each_second() -> None:
    """Thinned marks give the same hours as all of them."""
    marks = [(i * 10, 1000.0 + i / 7) for i in range(100)]
    thin = thin_marks(marks)
    assert len(thin) <= 2 * 16
    assert wal_per_bucket([(0, 1000)], thin, 1) == wal_per_bucket([(0, 1000)], marks, 1)
