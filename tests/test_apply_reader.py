"""How ``apply --follow`` reads a growing change log (issue 37, section 2): each read goes on
where the one before ended, never opening the files before its place again, holding the
prepared transactions across reads; a run the store may still cut is read again whole, and a
partial file compressed into its final name meanwhile is read on from the same place. Hand-made
logs, no server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from receivewal.apply import source
from receivewal.apply.source import LogReader, Transaction, transactions
from receivewal.archive.compression import CompressSpec
from receivewal.archive.storedform import StoredForm
from receivewal.logical.store import file_name
from receivewal.wal.lsn import format_lsn

COLUMNS = [{"name": "id", "type": "integer", "key": True}]


def line(op: str, **fields: Any) -> bytes:
    return json.dumps({"op": op, **fields}).encode() + b"\n"


def header() -> bytes:
    return line("header", format=1, slot="s") + line(
        "relation", lsn="0/1", schema="public", table="t", columns=COLUMNS)


def committed(lsn: int, *ids: int) -> bytes:
    """One transaction committed at ``lsn`` (its end: ``lsn + 1``) inserting ``ids``."""
    return (line("begin", lsn=format_lsn(lsn - 8), xid=lsn, commit_lsn=format_lsn(lsn),
                 commit_time="2026-01-01T00:00:00Z")
            + b"".join(line("insert", schema="public", table="t", new={"id": i})
                       for i in ids)
            + line("commit", lsn=format_lsn(lsn), end_lsn=format_lsn(lsn + 1),
                   commit_time="2026-01-01T00:00:00Z"))


def ids(read: list[Transaction]) -> list[list[int]]:
    return [[change["new"]["id"] for change, _ in t.changes] for t in read]


def test_a_later_read_opens_only_the_file_it_stopped_in_and_the_new_ones(tmp_path: Path
                                                                         ) -> None:
    (tmp_path / file_name(0x100)).write_bytes(header() + committed(0x100, 1))
    (tmp_path / file_name(0x200)).write_bytes(header() + committed(0x200, 2))
    partial = tmp_path / file_name(0x300, partial=True)
    partial.write_bytes(header() + committed(0x300, 3))
    reader = LogReader(tmp_path)
    assert ids(list(reader.transactions())) == [[1], [2], [3]]
    assert reader.files_opened == 3
    with partial.open("ab") as fh:
        fh.write(committed(0x310, 4))
    assert ids(list(reader.transactions())) == [[4]]
    assert reader.files_opened == 4  # the partial file alone
    assert list(reader.transactions()) == []
    (tmp_path / file_name(0x300)).write_bytes(partial.read_bytes())  # completed: renamed
    partial.unlink()
    (tmp_path / file_name(0x400, partial=True)).write_bytes(header() + committed(0x400, 5))
    assert ids(list(reader.transactions())) == [[5]]
    assert reader.files_opened == 7
    assert reader.reads == 4
    everything = sum(path.stat().st_size for path in tmp_path.iterdir())
    assert reader.bytes_read == everything  # every line read once


def test_a_run_being_written_is_read_again_whole_with_its_relation_lines(tmp_path: Path
                                                                        ) -> None:
    """The partial file ends inside a run (its relation line redescribing the table, its
    begin and one insert): the next read takes that run from its start, once."""
    partial = tmp_path / file_name(0x100, partial=True)
    wider = [*COLUMNS, {"name": "v", "type": "text", "key": False}]
    whole = committed(0x200, 7, 8)
    cut = whole.index(b'{"op": "insert"', whole.index(b'"id": 7') + 1)
    partial.write_bytes(header() + committed(0x100, 1)
                        + line("relation", lsn="0/150", schema="public", table="t",
                               columns=wider) + whole[:cut] + b'{"op": "ins')
    reader = LogReader(tmp_path)
    assert ids(list(reader.transactions())) == [[1]]
    partial.write_bytes(partial.read_bytes()[:-len(b'{"op": "ins')] + whole[cut:])
    again = list(reader.transactions())
    assert ids(again) == [[7, 8]]
    assert again[0].changes[0][1] == wider


def test_a_prepared_transaction_is_held_across_reads_until_its_commit_prepared(
        tmp_path: Path) -> None:
    prepared = (line("begin_prepare", lsn="0/F8", prepare_lsn="0/100", gid="g1", xid=9,
                     commit_time="2026-01-01T00:00:00Z")
                + line("insert", schema="public", table="t", new={"id": 9})
                + line("prepare", lsn="0/100", end_lsn="0/101", gid="g1"))
    (tmp_path / file_name(0x100)).write_bytes(header() + prepared)
    partial = tmp_path / file_name(0x200, partial=True)
    partial.write_bytes(header() + committed(0x200, 1))
    reader = LogReader(tmp_path)
    assert ids(list(reader.transactions())) == [[1]]
    with partial.open("ab") as fh:
        fh.write(line("commit_prepared", lsn="0/300", commit_lsn="0/300", end_lsn="0/301",
                      gid="g1", commit_time="2026-01-01T00:00:00Z"))
    done = list(reader.transactions())
    assert ids(done) == [[9]]
    assert (done[0].commit_lsn, done[0].end_lsn) == (0x300, 0x301)
    assert reader.files_opened == 3  # the PREPARE's file was not read again


def test_a_partial_file_compressed_into_its_final_name_is_read_on_from_the_same_place(
        tmp_path: Path) -> None:
    partial = tmp_path / file_name(0x100, partial=True)
    partial.write_bytes(header() + committed(0x100, 1))
    reader = LogReader(tmp_path)
    assert ids(list(reader.transactions())) == [[1]]
    content = partial.read_bytes() + committed(0x110, 2)
    form = StoredForm(CompressSpec("zstd", 3))
    with form.writer() as writer:
        packed = bytes(writer.begin()) + bytes(writer.update(content)) + writer.finish()
    (tmp_path / file_name(0x100, "zstd")).write_bytes(packed)
    partial.unlink()
    assert ids(list(reader.transactions())) == [[2]]
    assert ids(list(transactions(tmp_path))) == [[1], [2]]  # a new reader: all of it


def test_a_file_gone_when_opened_ends_the_read_and_the_next_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    partial = tmp_path / file_name(0x100, partial=True)
    partial.write_bytes(header() + committed(0x100, 1))
    listed = [partial.name]
    partial.rename(tmp_path / file_name(0x100))  # completed between the listing and the open
    reader = LogReader(tmp_path)
    with monkeypatch.context() as patched:
        patched.setattr(source, "change_files", lambda directory: listed)
        assert list(reader.transactions()) == []
    assert not reader.whole
    assert ids(list(reader.transactions())) == [[1]]
    assert reader.whole
