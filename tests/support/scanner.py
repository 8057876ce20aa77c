"""Run scanner tests on both paths: the compiled hot loop and the pure-Python fallback.

Import :func:`scanner_path` into a test module (``from support.scanner import scanner_path``)
and use it (autouse, or ``@pytest.mark.usefixtures("scanner_path")``): every test runs once
with ``receivewal.wal._scan`` and once without it. The compiled run is skipped only when the
extension is not built here (no compiler at install time); CI builds it.
"""

from __future__ import annotations

import pytest

from receivewal.wal import nativescan
from receivewal.wal.names import parse_segment_file_name
from receivewal.wal.reader import SegmentScan, SegmentScanner


@pytest.fixture(params=["c", "python"])
def scanner_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
                 ) -> str:
    """``"c"`` or ``"python"``: the scanner path this test runs on (also in forked workers,
    and in child processes through RECEIVEWAL_PURE_PYTHON)."""
    if request.param == "c":
        native = nativescan.native or nativescan.load_native()
        if native is None:
            pytest.skip("the C extension receivewal.wal._scan is not built here")
        monkeypatch.setattr(nativescan, "native", native)
        monkeypatch.delenv("RECEIVEWAL_PURE_PYTHON", raising=False)
    else:
        monkeypatch.setattr(nativescan, "native", None)
        monkeypatch.setenv("RECEIVEWAL_PURE_PYTHON", "1")
    return str(request.param)


def scan_segment(data: bytes, name: str, segment_size: int, nxt: bytes | None = None, *,
                 partial: bool = False, collect: bool = False) -> SegmentScan:
    """Scan one segment named ``name``, finishing its last record from ``nxt`` when given."""
    seg = parse_segment_file_name(name, segment_size)
    assert seg is not None
    scanner = SegmentScanner(data, name, start_lsn=seg.start_lsn(segment_size),
                             segment_size=segment_size, timeline=seg.timeline, segno=seg.segno,
                             partial=partial, collect_lsns=collect)
    scanner.scan()
    if nxt is not None and scanner.next_bytes_needed():
        scanner.continue_record(nxt[:scanner.next_bytes_needed()], "next")
    return scanner.result()
