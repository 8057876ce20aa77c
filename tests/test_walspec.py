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

from receivewal.errors import ConfigurationError
from receivewal.wal import lsn as lsn_module
from receivewal.wal import majors, pageheader, records, rmgr, timeline
from receivewal.wal.pageheader import LONG_FIELDS, SHORT_HEADER
from receivewal.wal.pages import check_pages

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
    assert places(r"\btimeline == 0\b") == set()  # names, files, the server: is_timeline_id
    top = timeline.MAX_TIMELINE
    assert top == 0xFFFFFFFF
    assert [timeline.is_timeline_id(t) for t in (0, 1, top, top + 1)] == [
        False, True, True, False]


def test_file_names_are_read_in_wal_only() -> None:
    """A WAL file name's parts (timeline, log and seg digits) are read, and its digits
    spelled, only in wal/ (leannames for the lean path, names for the rest): restore's spool,
    the archive's layout and check/charts call them (issue 26: they read names by hand)."""
    by_hand = r"\[(:8|8:16|16:|16:24)\], 16\)|0123456789ABCDEF"
    assert {p for p in places(by_hand) if not p.startswith("wal/")} == set()
    assert places(r"0x1_?0000_?0000\b") == {"wal/leannames.py"}


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


def test_page_headers_are_checked_in_wal_pageheader_only() -> None:
    """The flag bits and the page address are compared in one module; the magic numbers of
    the majors are spelled, and a magic judged, in wal/majors.py only (pageheader asks it)."""
    assert places(r"~XLP_ALL_FLAGS") == {"wal/pageheader.py"}
    assert places(r"0x[dD]1[0-9a-fA-F]{2}\b") == {"wal/majors.py"}
    assert places(r"invalid magic number") == {"wal/majors.py"}
    assert {path for path in places(r"\bmagic_problem\(|\bMAJOR_OF_MAGIC\b")
            if path not in {"wal/majors.py", "wal/pageheader.py"}} == set()


@pytest.mark.parametrize(("field", "value"), [
    ("magic", 0x1234), ("info", 0x0012), ("info", 0x0000), ("tli", 0), ("tli", 2),
    ("addr", 0x4000000), ("seg_size", 1 << 20), ("blcksz", 4096)])
def test_verify_and_the_start_up_check_judge_a_first_page_alike(field: str, value: int) -> None:
    """One definition of the page header checks: verify's page walk (check_pages) and the
    daemon's start-up check of a segment's first page (first_page_problem) find the same
    fault in the same words."""
    fields = {"magic": majors.PAGE_MAGICS[15], "info": pageheader.XLP_LONG_HEADER,
              "tli": 1, "addr": 0x3000000, "sysid": 7, "seg_size": 1 << 24, "blcksz": 8192}
    fields[field] = value
    page = bytearray(pageheader.XLOG_BLCKSZ)
    SHORT_HEADER.pack_into(page, 0, fields["magic"], fields["info"], fields["tli"],
                           fields["addr"], 0)
    LONG_FIELDS.pack_into(page, pageheader.SIZE_OF_SHORT_PHD, fields["sysid"],
                          fields["seg_size"], fields["blcksz"])
    _, findings = check_pages(bytes(page), data_len=len(page), start_lsn=0x3000000,
                              segment_size=1 << 24, timeline=1, partial=True)
    header = pageheader.parse_long_header(bytes(page))
    assert header is not None
    said = pageheader.first_page_problem(header, timeline=1, page_address=0x3000000,
                                         segment_size=1 << 24)
    assert said is not None
    assert findings == [("bad_page_header", 0x3000000, said)]


def test_the_segment_size_a_header_records_is_read_in_wal_pageheader_only() -> None:
    """verify and restore take a header's segment size from one function, with one rule:
    a long header (40 bytes) whose xlp_seg_size is a power of two from 1 MiB to 1 GiB."""
    assert places(r"\[32:36\]|header\.segment_size\b") == {"wal/pageheader.py"}
    head = bytearray(pageheader.SIZE_OF_LONG_PHD)
    SHORT_HEADER.pack_into(head, 0, majors.PAGE_MAGICS[15], pageheader.XLP_LONG_HEADER,
                           1, 0, 0)
    LONG_FIELDS.pack_into(head, pageheader.SIZE_OF_SHORT_PHD, 7, 1 << 24, 8192)
    assert pageheader.header_segment_size(bytes(head)) == 1 << 24
    with pytest.raises(ConfigurationError, match="too short"):
        pageheader.header_segment_size(bytes(head[:39]))
    LONG_FIELDS.pack_into(head, pageheader.SIZE_OF_SHORT_PHD, 7, 3 << 20, 8192)
    with pytest.raises(ConfigurationError, match="power of two"):
        pageheader.header_segment_size(bytes(head))


def test_records_are_judged_in_wal_records_only() -> None:
    """What makes a record unacceptable is worded in wal/records.py only (judge_record,
    record_length_problem), and the resource manager id range is spelled in wal/rmgr.py
    only: the scanner's fast path reads it from a table built there."""
    assert places(r"invalid record length|incorrect prev-link|invalid resource manager id"
                  r"|data checksum\"|invalid block references") == {"wal/records.py"}
    assert places(r"rmid (<=|>=|<|>) \d") == set()
    assert places(r"(RecordHeader|Struct)\(\"<IIQBBxxI\"\)") == {"wal/records.py"}


def test_pages_and_block_headers_are_walked_in_wal_only() -> None:
    """Where a record's bytes lie on the pages (a page header between its pieces) and how
    its block headers decode are known in wal/ only: check/ (walclock, crosscheck) asks
    wal/pages, wal/records and wal/crossing."""
    assert {path for path in places(r"SIZE_OF_SHORT_PHD") if not path.startswith("wal/")} \
        == set()
    assert places(r"BKPBLOCK_HAS_IMAGE") == {"wal/records.py"}


def c_defines() -> dict[str, int]:
    """The integer #defines of the C scanner."""
    text = (PACKAGE / "wal" / "_scan.c").read_text()
    return {name: int(value.rstrip("u"), 0) for name, value in
            re.findall(r"^#define (\w+) (0x[0-9A-Fa-f]+u?|\d+)\b", text, re.MULTILINE)}


def test_the_c_scanner_mirrors_the_python_constants() -> None:
    """Every layout constant _scan.c defines has the value of its Python definition; the
    page magic is not one of them (it differs between majors: check_pages is handed the
    segment's, which Python decides by wal/majors.py)."""
    defines = c_defines()
    assert not {name for name in defines if "MAGIC" in name}
    assert {name: defines[name] for name in (
        "BLCKSZ", "SHORT_PHD", "RECORD_HEADER",
        "XLP_FIRST_IS_CONTRECORD", "XLP_LONG_HEADER", "XLP_FIRST_IS_OVERWRITE_CONTRECORD",
        "XLP_ALL_FLAGS", "MAX_RECORD_LENGTH", "RM_MAX_BUILTIN_ID", "RM_MIN_CUSTOM_ID")} == {
        "BLCKSZ": pageheader.XLOG_BLCKSZ,
        "SHORT_PHD": pageheader.SIZE_OF_SHORT_PHD,
        "RECORD_HEADER": records.SIZE_OF_XLOG_RECORD,
        "XLP_FIRST_IS_CONTRECORD": pageheader.XLP_FIRST_IS_CONTRECORD,
        "XLP_LONG_HEADER": pageheader.XLP_LONG_HEADER,
        "XLP_FIRST_IS_OVERWRITE_CONTRECORD": pageheader.XLP_FIRST_IS_OVERWRITE_CONTRECORD,
        "XLP_ALL_FLAGS": pageheader.XLP_ALL_FLAGS,
        "MAX_RECORD_LENGTH": records.MAX_RECORD_LENGTH,
        "RM_MAX_BUILTIN_ID": rmgr.RM_MAX_BUILTIN_ID,
        "RM_MIN_CUSTOM_ID": rmgr.RM_MIN_CUSTOM_ID,
    }
