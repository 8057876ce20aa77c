"""analyze's executor task holds at most about two segments of a file, whatever its size.

No Spark here: :func:`scan_row` is what each executor runs for one segment, and it imports no
Spark. The measure is Python's own allocation peak (tracemalloc), not time.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

from receivewal.check.analyze import scan_row

SEGMENT = 1 << 20
NAME = "000000010000000000000003"


def test_an_oversize_plain_file_is_a_problem_read_within_bounds(tmp_path: Path) -> None:
    """A 64 MiB file named like a 1 MiB segment is reported, not read into memory whole."""
    with (tmp_path / NAME).open("wb") as fh:
        fh.truncate(64 * SEGMENT)
    row = SimpleNamespace(segno=3, timeline=1, compression="", partial=False, file=NAME,
                          base=str(tmp_path), followers=json.dumps([]), segment_size=SEGMENT,
                          compressibility=False, file_bytes=64 * SEGMENT)
    tracemalloc.start()
    try:
        out = scan_row(row)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    problems = json.loads(out["problems"]) if isinstance(out["problems"], str) else out["problems"]
    assert any("more than" in str(p) for p in problems), problems
    assert peak < 8 * SEGMENT, f"peak {peak} bytes for a {64 * SEGMENT}-byte file"
