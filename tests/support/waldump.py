"""Run pg_waldump on WAL files and read its output, the reference the parser is checked against."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from receivewal.wal.lsn import parse_lsn
from support.servers import pg_bin

_STATS_ROW = re.compile(
    r"^(\S+)\s+(\d+) \(\s*[\d.]+\)\s+(\d+) \(\s*[\d.]+\)\s+(\d+) \(\s*[\d.]+\)\s+(\d+)"
)
_RECORD_LSN = re.compile(r"\blsn: ([0-9A-F]+/[0-9A-F]+),")


def waldump_output(wal_dir: Path, first: str, last: str, *args: str) -> str:
    """pg_waldump's stdout over the segments ``first`` to ``last`` in ``wal_dir``.

    pg_waldump exits non-zero when the last record runs into a segment it was not given;
    everything before that is printed, which is all that is compared.
    """
    out = subprocess.run([pg_bin("pg_waldump"), *args, "-p", str(wal_dir), first, last],
                         capture_output=True, text=True, check=False)
    if not out.stdout:
        raise AssertionError(f"pg_waldump printed nothing: {out.stderr}")
    return out.stdout


def parse_stats(text: str) -> dict[str, tuple[int, int, int]]:
    """``pg_waldump --stats`` rows with records: name -> (records, record bytes, FPI bytes)."""
    rows: dict[str, tuple[int, int, int]] = {}
    for line in text.splitlines():
        match = _STATS_ROW.match(line)
        if match and match.group(1) != "Type" and int(match.group(2)):
            rows[match.group(1)] = (int(match.group(2)), int(match.group(3)),
                                    int(match.group(4)))
    return rows


def parse_record_lsns(text: str) -> list[int]:
    """The LSN of every record pg_waldump lists (without --stats)."""
    lsns = []
    for match in _RECORD_LSN.finditer(text):
        lsns.append(parse_lsn(match.group(1)))
    return lsns


def by_rmgr(rows: dict[str, tuple[int, int, int]]) -> dict[str, list[tuple[int, int, int]]]:
    """``--stats=record`` rows (``Rmgr/RECORD``) grouped by resource manager, sorted."""
    out: dict[str, list[tuple[int, int, int]]] = {}
    for name, row in rows.items():
        out.setdefault(name.split("/")[0], []).append(row)
    return {k: sorted(v) for k, v in sorted(out.items())}
