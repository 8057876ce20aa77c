"""Reading a change log file back to where its last complete run ends (pure).

A crash can leave the ``.partial`` being written cut anywhere: in the middle of a line, after
a transaction's ``begin`` and some of its changes, after relation lines meant for a run that
never came. :func:`scan_file` reads the lines in order and stops at the first one that is not
a whole JSON object; what it reports is where the last complete run ends (the size to trim the
file to), that run's end LSN, how many runs came before, and which relation descriptions are
in effect there (so that the store writes a relation line again only when one changes).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from receivewal.errors import ConfigurationError
from receivewal.logical import records


@dataclass
class FileScan:
    """What :func:`scan_file` found."""

    good_size: int = 0  # bytes up to the end of the last complete run
    runs: int = 0
    last_end: int = 0  # run_end of the last complete run (0: none)
    header: dict[str, Any] | None = None
    shapes: dict[tuple[str, str], bytes] = field(default_factory=dict)
    stopped: str | None = None  # why reading stopped before the end, if it did


def scan_file(chunks: Iterable[bytes]) -> FileScan:
    """Scan a change log file's content, given in chunks."""
    found = FileScan()
    pending: dict[tuple[str, str], bytes] = {}  # relation lines since the last run's end
    base, in_run, tail = 0, False, b""  # base: the file offset of data[0]
    for chunk in chunks:
        data = tail + chunk
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            record = _parse(data[start:end])
            if record is None or (found.header is None and record.get("op") != "header"):
                found.stopped = f"the line at byte {base + start} is not a change log record"
                return found
            try:
                in_run = _take(found, pending, record, in_run, base + end + 1)
            except (KeyError, TypeError, ValueError, ConfigurationError) as exc:
                found.stopped = f"the record at byte {base + start} is out of place ({exc})"
                return found
            start = end + 1
        base += start
        tail = data[start:]
    if tail:
        found.stopped = f"the last line (at byte {base}) is not complete"
    return found


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("op"), str) else None


def _take(found: FileScan, pending: dict[tuple[str, str], bytes], record: dict[str, Any],
          in_run: bool, offset: int) -> bool:
    """Account for one record ending at ``offset``; whether a run is open after it."""
    op = record["op"]
    if op == "header":
        if found.header is not None:
            raise ValueError("a second header")
        found.header = record
        found.good_size = offset
        return False
    if op == "relation":
        pending[(record["schema"], record["table"])] = records.recorded_shape(record)
        return in_run
    end = records.run_end(record)
    if end is not None:
        closes = op in ("commit", "prepare")  # the others stand alone
        if closes != in_run:
            raise ValueError(f"{op} {'outside' if closes else 'inside'} a run")
        found.runs += 1
        found.last_end = end
        found.good_size = offset
        found.shapes.update(pending)
        pending.clear()
        return False
    if records.starts_run(record):
        if in_run:
            raise ValueError(f"{op} inside a run")
        return True
    if not in_run:
        raise ValueError(f"{op} outside a run")
    return True
