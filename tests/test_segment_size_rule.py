"""verify and restore take an archive's segment size by one rule
(:func:`receivewal.wal.pageheader.archive_segment_size`): the identity file's when there is
one, else what the files' own first page headers state, a header counting only when its page
address is where its file name puts the segment at the size it states. Archives where the two
commands used to disagree, on files only (no server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from receivewal.archive.identity import IDENTITY_FILE, ArchiveIdentity, identity_to_json
from receivewal.check.verify import verify_archive
from receivewal.restore.local import candidates, segment_size
from receivewal.wal import pageheader
from receivewal.wal.names import wal_file_name

MIB = 1 << 20
SYSID = 7


def segment(size_stated: int, page_address: int, file_size: int) -> bytes:
    """A segment file's bytes: a long page header stating ``size_stated`` and
    ``page_address``, zeros after it."""
    head = bytearray(file_size)
    pageheader.SHORT_HEADER.pack_into(head, 0, pageheader.XLOG_PAGE_MAGIC,
                                      pageheader.XLP_LONG_HEADER, 1, page_address, 0)
    pageheader.LONG_FIELDS.pack_into(head, pageheader.SIZE_OF_SHORT_PHD, SYSID, size_stated,
                                     pageheader.XLOG_BLCKSZ)
    return bytes(head)


def sizes_taken(archive: Path, name: str) -> tuple[int, int]:
    """(the segment size verify reports for the archive, the one restore uses for ``name``)."""
    report, _ = verify_archive(archive, jobs=1)
    return report.segment_size, segment_size(archive, candidates(archive, name,
                                                                 partial=False)[0])


def test_the_identity_file_decides_for_verify_as_for_restore(tmp_path: Path) -> None:
    """An identity file recording 16 MiB over files whose headers all state 1 MiB (each at the
    address its name has at 1 MiB): restore took 16 MiB and verify 1 MiB; now both take the
    identity's 16 MiB (and verify reports the files as not being 16 MiB segments)."""
    for segno in (1, 2, 3):
        name = wal_file_name(1, segno, MIB)
        (tmp_path / name).write_bytes(segment(MIB, segno * MIB, MIB))
    (tmp_path / IDENTITY_FILE).write_bytes(
        identity_to_json(ArchiveIdentity(str(SYSID), 16 * MIB, 1)))
    name = wal_file_name(1, 2, MIB)
    assert sizes_taken(tmp_path, name) == (16 * MIB, 16 * MIB)


@pytest.mark.parametrize("stated", [MIB, 64 * MIB])
def test_a_header_at_another_address_than_its_name_decides_nothing(tmp_path: Path,
                                                                   stated: int) -> None:
    """No identity file, one segment whose header states a size at which its name would put it
    elsewhere than its page address: restore took the stated size and verify PostgreSQL's
    default; now neither trusts that header and both take 16 MiB."""
    name = wal_file_name(1, 3, 16 * MIB)
    (tmp_path / name).write_bytes(segment(stated, 3 * 16 * MIB, 16 * MIB))
    assert sizes_taken(tmp_path, name) == (16 * MIB, 16 * MIB)


def test_headers_that_agree_with_their_names_decide_for_both(tmp_path: Path) -> None:
    """No identity file, 1 MiB segments whose headers agree with their names: both take
    1 MiB (the rule's ordinary case, unchanged)."""
    for segno in (4, 5):
        (tmp_path / wal_file_name(1, segno, MIB)).write_bytes(segment(MIB, segno * MIB, MIB))
    assert sizes_taken(tmp_path, wal_file_name(1, 4, MIB)) == (MIB, MIB)
