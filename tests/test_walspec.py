"""The WAL reading spec has one home, ``receivewal/wal/``, read from the package's source.

The timeline limit, the system identifier limit, LSN parsing and printing, the page header
checks and the segment size a header records are each defined in one module of ``wal/``;
every other module imports them. The C scanner mirrors the Python definitions: its
constants are checked against them here, its results in tests/test_scanner_paths.py.
"""

from __future__ import annotations

import re
from pathlib import Path

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

