"""Reading a change log file back to where its last complete run ends (pure).

A crash can leave the ``.partial`` being written cut anywhere: in the middle of a line, after
a transaction's ``begin`` and some of its changes, after relation lines meant for a run that
never came. :func:`scan_file` reads the lines in order and stops at the first one that is not
a whole JSON object; what it reports is where the last complete run ends (the size to trim the
file to), that run's end LSN, how many runs came before, and which relation descriptions are
in effect there (so that the store writes a relation line again only when one changes).

A torn tail is only ever what follows the last line a crash left whole: a damaged line
followed by a change log record (a line that reads as one), or a whole line that reads as a
record but is out of place, is damage inside the file. :func:`scan_file` reads on to the end
to tell the two apart and says so in :attr:`FileScan.corrupt`: such a file is never cut (the
runs after the damage may be all the slot still has of them), and its readers refuse it,
naming the line and the LSNs on both sides.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from receivewal.errors import ConfigurationError
from receivewal.logical import changelines
from receivewal.wal.lsn import format_lsn, parse_lsn


@dataclass
class FileScan:
    """What :func:`scan_file` found."""

    good_size: int = 0  # bytes up to the end of the last complete run
    runs: int = 0
    last_end: int = 0  # run_end of the last complete run (0: none)
    header: dict[str, Any] | None = None
    shapes: dict[tuple[str, str], bytes] = field(default_factory=dict)
    stopped: str | None = None  # why reading stopped before the end, if it did
    corrupt: str | None = None  # damage followed by records: not a torn tail (see the module)
    bad_line: int | None = None  # the line number (from 1) where reading stopped


@dataclass
class _After:
    """The records found after the first damaged line."""

    first_line: int = 0  # the first of them (0: none)
    last_lsn: int = 0  # the highest LSN any of them names


def scan_file(chunks: Iterable[bytes]) -> FileScan:
    """Scan a change log file's content, given in chunks."""
    found = FileScan()
    pending: dict[tuple[str, str], bytes] = {}  # relation lines since the last run's end
    base, in_run, tail, number = 0, False, b"", 0  # base: the file offset of data[0]
    after: _After | None = None  # once damage is found: what follows it
    for chunk in chunks:
        data = tail + chunk
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            number += 1
            record = _parse(data[start:end])
            if after is not None:
                if record is not None:
                    _note(after, record, number)
            elif record is None or (found.header is None and record.get("op") != "header"):
                found.stopped = f"line {number} (at byte {base + start}) is not a change " \
                                "log record"
                found.bad_line, after = number, _After()
            else:
                try:
                    in_run = _take(found, pending, record, in_run, base + end + 1)
                except (KeyError, TypeError, ValueError, ConfigurationError) as exc:
                    found.stopped = f"the record on line {number} (at byte {base + start}) " \
                                    f"is out of place ({exc})"
                    found.bad_line, after = number, _After()
                    _note(after, record, number)
            start = end + 1
        base += start
        tail = data[start:]
    if after is not None and after.first_line:
        found.corrupt = _corruption(found, after)
    elif tail and after is None:
        found.stopped = f"the last line (line {number + 1}, at byte {base}) is not complete"
    return found


def _note(after: _After, record: dict[str, Any], number: int) -> None:
    """Count a record read after the damage: its line, the highest LSN it names."""
    after.first_line = after.first_line or number
    for key in ("lsn", "end_lsn", "rollback_end_lsn"):
        value = record.get(key)
        if isinstance(value, str):
            try:
                after.last_lsn = max(after.last_lsn, parse_lsn(value))
            except ConfigurationError:
                continue


def _corruption(found: FileScan, after: _After) -> str:
    """The words for damage inside a file: the line, and the LSNs on both sides of it."""
    whole = f"whole through {format_lsn(found.last_end)}" if found.runs else \
        "without a complete run before it"
    reaching = f", up to {format_lsn(after.last_lsn)}" if after.last_lsn else ""
    same = after.first_line == found.bad_line
    return (f"{found.stopped}; "
            + ("it is a whole line, not a torn tail" if same else
               f"change log records follow it (from line {after.first_line}{reaching}): "
               "damage inside the file, not a torn tail")
            + f" (the file is {whole})")


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
        pending[(record["schema"], record["table"])] = changelines.recorded_shape(record)
        return in_run
    end = changelines.run_end(record)
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
    if changelines.starts_run(record):
        if in_run:
            raise ValueError(f"{op} inside a run")
        return True
    if not in_run:
        raise ValueError(f"{op} outside a run")
    return True
