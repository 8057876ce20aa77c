"""The WAL reading spec has one home, ``receivewal/wal/``, read from the package's source.

The timeline limit, the system identifier limit, LSN parsing and printing, the page header
checks and the segment size a header records are each defined in one module of ``wal/``;
every other module imports them. The C scanner mirrors the Python definitions: its
constants are checked against them here, its results in tests/test_scanner_paths.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from receivewal.wal import lsn as lsn_module
from receivewal.wal import timeline

PACKAGE = Path(__file__).parent.parent / "receivewal"


def places(pattern: str) -> set[str]:
    """The package's Python modules (paths under receivewal/) with a line matching
    ``pattern``."""
    regex = re.compile(pattern, re.MULTILINE)
    return {str(path.relative_to(PACKAGE)) for path in sorted(PACKAGE.rglob("*.py"))
            if regex.search(path.read_text())}


def test_the_timeline_and_system_identifier_limits_are_defined_once() -> None:
    """2^32-1 (the largest timeline ID) in wal/timeline.py, 2^64-1 (the largest system
    identifier) in wal/pageheader.py; nobody else spells them."""
    assert places(r"^_?MAX_TIMELINE\s*=") == {"wal/timeline.py"}
    assert places(r"^_?MAX_SYSTEM_IDENTIFIER\s*=") == {"wal/pageheader.py"}
    assert places(r"<=\s*_?MAX_TIMELINE\b") == {"wal/timeline.py"}
    top = timeline.MAX_TIMELINE
    assert top == 0xFFFFFFFF
    assert [timeline.is_timeline_id(t) for t in (0, 1, top, top + 1)] == [
        False, True, True, False]


def test_lsns_are_parsed_and_printed_in_wal_lsn_only() -> None:
    """The 32-bit halves of an LSN are joined and split only in wal/lsn.py."""
    assert places(r"(<<|>>) 32\b") == {"wal/lsn.py"}


@pytest.mark.parametrize(("text", "lsn"), [
    ("0/3000000", 0x3000000), ("  0x1/+ff and more", 0x1_000000FF), ("1A/B", 0x1A_0000000B),
    ("123456789/1", 0x23456789_00000001), ("1/", None), ("/1", None), ("g/1", None)])
def test_scan_lsn_reads_as_sscanf_does(text: str, lsn: int | None) -> None:
    """pg_receivewal's --endpos rule, sscanf("%X/%X"): leading space, a sign and 0x allowed,
    the low 32 bits of each half kept, anything may follow; None when it does not start so."""
    assert lsn_module.scan_lsn(text) == lsn

