"""verify and restore take an archive's segment size by one rule, from the same inputs
(:func:`receivewal.archive.sources.decide_segment_size`): the identity file's when there is one,
else what most of the segment files' own first page headers state, a header counting only when
its page address is where its file name puts the segment at the size it states. The same
archive is fed to each reader (verify, a restore from the directory, the prefetch filler, a
restore from a bucket and verify of the bucket): archives where they used to disagree, on files
only (the bucket's on a real S3 server)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.bucketcalls import new_prefix, put
from support.seaweed import SeaweedS3

from receivewal.archive.directory import Archive
from receivewal.archive.identity import IDENTITY_FILE, ArchiveIdentity, identity_to_json
from receivewal.check.verify import verify_archive
from receivewal.errors import ArchiveError
from receivewal.restore import launch, spoolfiles
from receivewal.restore.filler import Spool
from receivewal.restore.local import archive_segment_size
from receivewal.restore.remote import BucketSource
from receivewal.wal import pageheader
from receivewal.wal.majors import PAGE_MAGICS
from receivewal.wal.names import wal_file_name

MIB = 1 << 20
SYSID = 7


def segment(size_stated: int, page_address: int, file_size: int) -> bytes:
    """A segment file's bytes: a long page header stating ``size_stated`` and
    ``page_address``, zeros after it."""
    head = bytearray(file_size)
    pageheader.SHORT_HEADER.pack_into(head, 0, PAGE_MAGICS[15],
                                      pageheader.XLP_LONG_HEADER, 1, page_address, 0)
    pageheader.LONG_FIELDS.pack_into(head, pageheader.SIZE_OF_SHORT_PHD, SYSID, size_stated,
                                     pageheader.XLOG_BLCKSZ)
    return bytes(head)


def fillers_size(archive: Path, name: str) -> int:
    """The segment size the prefetch filler of ``archive`` records in its spool (``.source``)
    once it has fetched ``name`` (the fetch itself may fail: the size is decided before)."""
    target = archive.parent / "pg_wal" / "RECOVERYXLOG"
    target.parent.mkdir(exist_ok=True)
    spool = Spool.beside(target, os.path.realpath(archive))
    spoolfiles.make_spool_dir(str(spool.dir))
    launch.fetcher(str(archive), spool)(name, spool.dir / name)
    recorded = spoolfiles.recorded_source(str(spool.dir))
    assert recorded is not None
    return int(recorded[1])


def sizes_taken(archive: Path, name: str) -> dict[str, int]:
    """The segment size each local reader takes for the archive (the filler's after fetching
    ``name``)."""
    report, _ = verify_archive(archive, jobs=1)
    return {"verify": report.segment_size,
            "restore": archive_segment_size(archive, Archive(archive).read_identity()),
            "filler": fillers_size(archive, name)}


def every(size: int) -> dict[str, int]:
    return {"verify": size, "restore": size, "filler": size}


def identity_over_1mib_headers(archive: Path) -> str:
    """An identity file recording 16 MiB over files whose headers all state 1 MiB (each at the
    address its name has at 1 MiB); the name of one of them."""
    archive.mkdir()
    for segno in (1, 2, 3):
        name = wal_file_name(1, segno, MIB)
        (archive / name).write_bytes(segment(MIB, segno * MIB, MIB))
    (archive / IDENTITY_FILE).write_bytes(
        identity_to_json(ArchiveIdentity(str(SYSID), 16 * MIB, 1)))
    return wal_file_name(1, 2, MIB)


def majority_over_one_odd_header(archive: Path) -> str:
    """No identity file: three 16 MiB segments, and one whose header states 1 MiB at the
    address its name has at 1 MiB; that one's name."""
    archive.mkdir()
    for segno in (1, 2, 3):
        name = wal_file_name(1, segno, 16 * MIB)
        (archive / name).write_bytes(segment(16 * MIB, segno * 16 * MIB, 16 * MIB))
    odd = wal_file_name(1, 64, MIB)  # 000000010000000000000040, which 16 MiB puts at 1 GiB
    (archive / odd).write_bytes(segment(MIB, 64 * MIB, MIB))
    return odd


def test_the_identity_file_decides_for_verify_as_for_restore(tmp_path: Path) -> None:
    """The identity's 16 MiB over files whose headers state 1 MiB: restore took 16 MiB and
    verify 1 MiB (issue 25); all take the identity's 16 MiB (verify reports the files as not
    being 16 MiB segments)."""
    archive = tmp_path / "archive"
    name = identity_over_1mib_headers(archive)
    assert sizes_taken(archive, name) == every(16 * MIB)


def test_the_majority_of_headers_decides_for_restore_as_for_verify(tmp_path: Path) -> None:
    """No identity file, the asked segment's header stating 1 MiB among three that state
    16 MiB: verify took the majority's 16 MiB, restore and the filler that file's own 1 MiB
    (issue 26); all take 16 MiB."""
    archive = tmp_path / "archive"
    odd = majority_over_one_odd_header(archive)
    assert sizes_taken(archive, odd) == every(16 * MIB)


@pytest.mark.parametrize("stated", [MIB, 64 * MIB])
def test_a_header_at_another_address_than_its_name_decides_nothing(tmp_path: Path,
                                                                   stated: int) -> None:
    """No identity file, one segment whose header states a size at which its name would put it
    elsewhere than its page address: restore took the stated size and verify PostgreSQL's
    default; now none trusts that header and all take 16 MiB."""
    archive = tmp_path / "archive"
    archive.mkdir()
    name = wal_file_name(1, 3, 16 * MIB)
    (archive / name).write_bytes(segment(stated, 3 * 16 * MIB, 16 * MIB))
    assert sizes_taken(archive, name) == every(16 * MIB)


def test_headers_that_agree_with_their_names_decide_for_all(tmp_path: Path) -> None:
    """No identity file, 1 MiB segments whose headers agree with their names: all take
    1 MiB (the rule's ordinary case, unchanged)."""
    archive = tmp_path / "archive"
    archive.mkdir()
    for segno in (4, 5):
        (archive / wal_file_name(1, segno, MIB)).write_bytes(segment(MIB, segno * MIB, MIB))
    assert sizes_taken(archive, wal_file_name(1, 4, MIB)) == every(MIB)


def copied_to_bucket(store: SeaweedS3, archive: Path) -> str:
    """A fresh prefix holding the archive's files (its identity object when it has one)."""
    identity = archive / IDENTITY_FILE
    url = new_prefix(store, None)
    if identity.exists():
        put(url, IDENTITY_FILE, identity.read_bytes())
    for path in sorted(archive.iterdir()):
        if path.name != IDENTITY_FILE:
            put(url, path.name, path.read_bytes())
    return url


@pytest.mark.server
def test_a_bucket_is_read_by_the_same_rule(store: SeaweedS3, tmp_path: Path) -> None:
    """The same archives copied to a bucket: restore from it takes the identity object's size
    as every local reader does, and verify of the bucket the size verify of the directory
    takes; a prefix without an identity object is never restored from (it decides no size)."""
    with_identity = tmp_path / "with"
    name = identity_over_1mib_headers(with_identity)
    url = copied_to_bucket(store, with_identity)
    assert BucketSource(url).segment_size() == 16 * MIB
    assert verify_archive(url, jobs=1)[0].segment_size == sizes_taken(with_identity, name)[
        "verify"] == 16 * MIB
    without = tmp_path / "without"
    odd = majority_over_one_odd_header(without)
    url = copied_to_bucket(store, without)
    with pytest.raises(ArchiveError, match="no archive identity object"):
        BucketSource(url).segment_size()
    assert verify_archive(url, jobs=1)[0].segment_size == sizes_taken(without, odd)[
        "verify"] == 16 * MIB
