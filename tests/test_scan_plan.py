"""Which files a segment's scan may read to finish its last record (pure, fast, no server).

A record can run through as many segments as PostgreSQL's longest record fills (about 1,030
of 1 MiB): each scan task lists the files that follow its segment that far, as a few runs
(one per timeline and format), never as a thousand names per task.
"""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from receivewal.check.crosscheck import FollowerRun, follower_files, plan_scans
from receivewal.check.verify import BYTES_PER_WORKER, worker_count
from receivewal.wal.crossing import followers_needed
from receivewal.wal.names import SegmentFile
from receivewal.wal.pageheader import SIZE_OF_LONG_PHD, SIZE_OF_SHORT_PHD, XLOG_BLCKSZ
from receivewal.wal.records import MAX_RECORD_LENGTH

MIB = 1 << 20
Chosen = dict[tuple[int, int], tuple[str, SegmentFile]]


def expected_followers(chosen: Mapping[tuple[int, int], tuple[str, SegmentFile]], tli: int,
                       segno: int, limit: int) -> list[tuple[str, str]]:
    """The rule, one step at a time: for segment segno+k, the file of the task's own timeline,
    else of the first later timeline that has one; the list ends at the first gap."""
    timelines = sorted({t for t, _ in chosen})
    out = []
    for step in range(1, limit + 1):
        hit = next((chosen[(c, segno + step)] for c in timelines
                    if c >= tli and (c, segno + step) in chosen), None)
        if hit is None:
            break
        out.append((hit[0], hit[1].compression))
    return out


files = st.dictionaries(
    st.tuples(st.integers(1, 3), st.integers(1, 80)),
    st.tuples(st.sampled_from(["", "gzip", "lz4", "zstd"]), st.booleans()), max_size=150)


@settings(max_examples=200, deadline=None)
@given(present=files)
def test_follower_runs_name_the_files_that_follow(
        present: dict[tuple[int, int], tuple[str, bool]]) -> None:
    """Timelines, formats, .partial files and gaps in any mix: the runs expand to the files
    of the rule, in order, and adjacent runs differ in timeline or format."""
    chosen: Chosen = {}
    for (tli, segno), (compression, partial) in present.items():
        seg = SegmentFile(segno, tli, compression, partial)
        chosen[(tli, segno)] = (seg.file_name(16 * MIB), seg)
    limit = followers_needed(16 * MIB)
    for task in plan_scans(chosen, segment_size=16 * MIB):
        tli, segno = task.segment.timeline, task.segment.segno
        listed = [(name, seg.compression)
                  for name, seg in follower_files(task.followers, 16 * MIB)]
        assert listed == expected_followers(
            chosen, tli, segno, limit)
        for a, b in zip(task.followers, task.followers[1:], strict=False):
            assert (a.timeline, a.compression, a.partial) != (b.timeline, b.compression,
                                                              b.partial)


def test_a_long_archive_plans_one_run_as_long_as_the_longest_record() -> None:
    """2,000 plain 1 MiB segments: each task has one run of followers, as many as a record
    of PostgreSQL's maximum length can fill (fewer near the end)."""
    chosen: Chosen = {}
    for segno in range(1, 2001):
        seg = SegmentFile(segno, 1)
        chosen[(1, segno)] = (seg.file_name(MIB), seg)
    need = followers_needed(MIB)
    usable = MIB - MIB // XLOG_BLCKSZ * SIZE_OF_SHORT_PHD - (SIZE_OF_LONG_PHD - SIZE_OF_SHORT_PHD)
    assert (need - 1) * usable < MAX_RECORD_LENGTH <= need * usable
    tasks = plan_scans(chosen, segment_size=MIB)
    assert tasks[0].followers == (FollowerRun(1, 2, need, "", False),)
    assert tasks[-2].followers == (FollowerRun(1, 2000, 1, "", False),)
    assert tasks[-1].followers == ()


def test_workers_follow_the_archive_size_never_more_than_asked() -> None:
    """A small archive is scanned in the process itself whatever -j says (a worker's start-up
    costs more than it saves there); a large one gets one worker per BYTES_PER_WORKER of WAL,
    at most -j and at most one per segment."""
    mib16 = 16 << 20
    small = BYTES_PER_WORKER // mib16 - 1
    assert worker_count(8, small, mib16) == 1
    assert worker_count(8, 1, mib16) == 1
    assert worker_count(2, 3 * BYTES_PER_WORKER // mib16, mib16) == 2
    assert worker_count(8, 3 * BYTES_PER_WORKER // mib16, mib16) == 3
    assert worker_count(1, 1000, mib16) == 1
    assert worker_count(8, 0, mib16) == 1
