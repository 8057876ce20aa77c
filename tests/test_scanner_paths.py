"""The compiled scanner and the pure-Python one give identical results (fast, no server).

The same bytes are scanned on both paths: the committed real segment pair, intact and with
random damage, a .partial cut at random lengths, and cuts with damage just before the cut.
The C scanner called directly on short buffers that end at an unreadable page reads nothing
past them (tests/support/cbounds.py). CRC-32C from the extension (SSE4.2 and table-driven)
equals the crc32c package's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import crc32c
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from support.scanner import scan_segment

from receivewal.wal import nativescan
from receivewal.wal.reader import SegmentScan

DATA = Path(__file__).parent / "data" / "wal"
SEG = 1 << 20
NAMES = sorted(p.name.removesuffix(".zst") for p in DATA.glob("*.zst"))
SEGMENTS = {n: zstandard.ZstdDecompressor().decompress((DATA / f"{n}.zst").read_bytes(),
                                                        max_output_size=SEG) for n in NAMES}


@pytest.fixture(scope="module")
def native() -> ModuleType:
    """The compiled module (skipped only where it is not built: no compiler at install)."""
    module = nativescan.native or nativescan.load_native()
    if module is None:
        pytest.skip("the C extension receivewal.wal._scan is not built here")
    return module


def scan_on(path: ModuleType | None, data: bytes, name: str, nxt: bytes | None,
            partial: bool) -> SegmentScan:
    """Scan with ``nativescan.native`` set to ``path`` (None: pure Python)."""
    saved = nativescan.native
    nativescan.native = path
    try:
        return scan_segment(data, name, SEG, nxt, partial=partial, collect=True)
    finally:
        nativescan.native = saved


def both(native: ModuleType, data: bytes, name: str = NAMES[0], nxt: bytes | None = None,
         partial: bool = False) -> SegmentScan:
    """The scan, after checking that both paths give the same one."""
    ours = scan_on(native, data, name, nxt, partial)
    assert ours == scan_on(None, data, name, nxt, partial)
    return ours


def test_intact_pair_scans_the_same(native: ModuleType) -> None:
    """The real pair: same records, statistics, LSN list and ends on both paths."""
    first, second = NAMES
    scan = both(native, SEGMENTS[first], first, SEGMENTS[second])
    assert scan.records > 1000
    assert not scan.problems
    both(native, SEGMENTS[second], second)


@settings(max_examples=60, deadline=None)
@given(offsets=st.lists(st.integers(0, SEG - 1), min_size=1, max_size=6),
       value=st.integers(0, 255), which=st.sampled_from(NAMES))
def test_random_damage_scans_the_same(native: ModuleType, offsets: list[int], value: int,
                                      which: str) -> None:
    """Bytes overwritten anywhere (headers, lengths, block references): the same findings."""
    data = bytearray(SEGMENTS[which])
    for off in offsets:
        data[off] = value
    nxt = SEGMENTS[NAMES[1]] if which == NAMES[0] else None
    both(native, bytes(data), which, nxt)


@settings(max_examples=40, deadline=None)
@given(cut=st.integers(0, SEG))
def test_partial_cut_anywhere_scans_the_same(native: ModuleType, cut: int) -> None:
    """A .partial (compressed ones end anywhere) cut at any length: the same scan, no error."""
    scan = both(native, SEGMENTS[NAMES[1]][:cut], NAMES[1] + ".partial", partial=True)
    assert not [p for p in scan.problems if p.severity == "error"]


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(0, SEG), partial=st.booleans(),
       offsets=st.lists(st.integers(-48, 8), min_size=1, max_size=4),
       value=st.sampled_from([0x00, 0x01, 0x7F, 0xFF]))
def test_cut_and_damaged_at_the_cut_scans_the_same(native: ModuleType, cut: int, partial: bool,
                                                   offsets: list[int], value: int) -> None:
    """A segment cut at any length (a .partial, or a complete segment that lost its tail)
    with bytes overwritten just before the cut, so record lengths and continuation headers
    point past the data: the same scan on both paths."""
    name = NAMES[1]
    data = bytearray(SEGMENTS[name][:cut])
    for off in offsets:
        if 0 <= cut + off < cut:
            data[cut + off] = value
    both(native, bytes(data), name + (".partial" if partial else ""), partial=partial)


def test_c_scanner_reads_only_the_buffer_it_is_given(native: ModuleType) -> None:
    """check_pages and walk called directly on short and odd buffers (no Python padding),
    each ending at an unreadable page, with page lists and ends that promise more: no read
    past the buffer (that would be SIGSEGV in the child), answers within its bounds, and a
    negative start refused with ValueError."""
    done = subprocess.run([sys.executable, "-m", "support.cbounds", str(DATA / f"{NAMES[0]}.zst")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split()[-2:] == ["ok", "184"]


@pytest.fixture(scope="module", params=["sse4.2", "software"])
def crc_impl(request: pytest.FixtureRequest, native: ModuleType) -> Iterator[str]:
    """The extension's CRC-32C, hardware (where the CPU has SSE4.2) or table-driven."""
    if request.param == "software":
        native.force_software_crc(True)
    elif native.crc32c_impl() != "sse4.2":
        pytest.skip("this CPU has no SSE4.2")
    yield str(request.param)
    native.force_software_crc(False)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300), seed=st.integers(0, 0xFFFFFFFF))
def test_crc32c_equals_the_crc32c_package(crc_impl: str, native: ModuleType, data: bytes,
                                          seed: int) -> None:
    """Any bytes, any running value, every alignment: the crc32c package's result."""
    assert native.crc32c(data) == crc32c.crc32c(data)
    assert native.crc32c(data, seed) == crc32c.crc32c(data, seed)
    big = os.urandom(1000) + data
    assert native.crc32c(memoryview(big)[3:]) == crc32c.crc32c(big[3:])


@pytest.mark.parametrize("pure", [False, True])
def test_verify_says_which_scanner_runs(native: ModuleType, pure: bool) -> None:
    """`receivewal verify` prints the scanner it ran; RECEIVEWAL_PURE_PYTHON=1 forces Python."""
    env = {**os.environ, "RECEIVEWAL_PURE_PYTHON": "1" if pure else "0"}
    done = subprocess.run([sys.executable, "-m", "receivewal", "verify", "-j", "1", str(DATA)],
                          capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    line = done.stdout.splitlines()[1]
    cpu = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    crc = "sse4.2" if native is not None and " sse4_2" in cpu else "software"
    assert line == ("scanner: python" if pure else f"scanner: c (crc32c: {crc})")


@pytest.mark.parametrize("pure", [False, True])
def test_only_the_python_path_loads_the_crc32c_package(native: ModuleType, pure: bool) -> None:
    """With the C scanner, verify computes every CRC-32C (records crossing pages and segments
    too) with the extension's, and never imports the crc32c package (its import costs
    start-up ~12 ms); RECEIVEWAL_PURE_PYTHON=1 uses the package. Neither path loads the
    archive writer's modules (partials, directory: ~10 ms) where no two .partial forms
    compete. Both verify the archive."""
    probe = ("import sys\n"
             "from receivewal.commands.cli import main\n"
             "try:\n"
             "    main(['verify', '-j', '1', sys.argv[1]])\n"
             "except SystemExit as exc:\n"
             "    assert exc.code == 0, exc.code\n"
             "print('crc32c' in sys.modules, 'receivewal.archive.partials' in sys.modules,\n"
             "      'receivewal.archive.directory' in sys.modules)\n")
    env = {**os.environ, "RECEIVEWAL_PURE_PYTHON": "1" if pure else "0"}
    done = subprocess.run([sys.executable, "-c", probe, str(DATA)], capture_output=True,
                          text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert "recoverable end to end" in done.stdout
    assert done.stdout.splitlines()[-1] == f"{pure} False False"
