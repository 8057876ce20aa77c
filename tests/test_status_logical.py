"""``receivewal status`` of a logical receiver's OUTDIR speaks of a change log (files
completed, the stream's bytes as sent plain, the change log's files), from the kind of
receiver the state file records; a WAL archive's status, and its state file, read exactly as
they did before the state file recorded it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from test_status import NOW, fresh, locked, status, streaming_state

from receivewal.daemon.health import describe
from receivewal.daemon.monitor import Monitor
from receivewal.daemon.state import decode_state, encode_state, read_state, write_state
from receivewal.errors import ArchiveError
from receivewal.wal.lsn import parse_lsn

__all__ = ["locked"]  # the fixture, used by name

STREAM_STATUS = """\
pid:                4242 on db-backup
phase:              streaming
started:            2023-11-14 21:13:20 UTC (3600s ago)
updated:            2023-11-14 22:13:19 UTC (1s ago)
server:             host=db1 port=5432 user=rep
system identifier:  7300000000000000001
timeline:           1
slot:               slot1 (restart_lsn 0/4000000)
received:           0/5001000
written:            0/5001000
flushed:            0/5000000
server WAL end:     0/5002000
last contact:       2023-11-14 22:13:18 UTC (2s ago)
compression:        zstd: 3.9 kB WAL in 1000 B on the wire (4.00x) this connection
since start:        7.8 kB WAL in 2.0 kB on the wire (4.00x)
segments completed: 4 (last 000000010000000000000004)
reconnects:         1
archive:            -
last error:         ConnectionLost: server closed the connection (600s ago)"""
LOGICAL = {"receiver": "logical", "last_segment": "0000000005000000.jsonl.zst"}


def test_a_stream_state_reads_as_it_always_did() -> None:
    """The words of a WAL archive's status, every line, as before (the same text as
    ``describe`` gave before the state recorded its receiver); its state file has no
    ``receiver`` key and reads back as a WAL receiver's."""
    state = streaming_state(pid=4242, hostname="db-backup")
    assert "\n".join(describe(state, NOW)) == STREAM_STATUS
    data = encode_state(state)
    assert b"receiver" not in data
    assert decode_state(data).receiver == "wal"


def test_a_logical_state_speaks_of_change_files_not_segments(tmp_path: Path) -> None:
    state = streaming_state(**LOGICAL)
    write_state(tmp_path, state)
    assert json.loads((tmp_path / ".receivewal-state.json").read_text())["receiver"] == \
        "logical"
    assert read_state(tmp_path) == state
    lines = describe(state, NOW)
    assert "files completed:   4 (last 0000000005000000.jsonl.zst)" in lines
    assert ("compression:       zstd: 3.9 kB plain in 1000 B on the wire (4.00x) this "
            "connection") in lines
    assert "since start:       7.8 kB plain in 2.0 kB on the wire (4.00x)" in lines
    assert "slot:              slot1 (confirmed 0/4000000)" in lines
    assert [line for line in lines if "WAL" in line or "segment" in line
            or line.startswith("archive")] == ["server WAL end:    0/5002000"]


def test_an_unknown_receiver_in_the_state_file_is_refused() -> None:
    data = encode_state(streaming_state(**LOGICAL)).replace(b'"logical"', b'"physical"')
    with pytest.raises(ArchiveError, match="receiver 'physical' is not one of wal, logical"):
        decode_state(data)


def test_status_of_a_logical_outdir_counts_its_change_files(tmp_path: Path,
                                                           locked: None) -> None:
    """The command: the change log's complete files, their size and the partial file, in
    place of the WAL archive's backups and segments; the same in --json."""
    (tmp_path / "0000000005000000.jsonl.zst").write_bytes(b"x" * 1000)
    (tmp_path / "0000000004000000.jsonl").write_bytes(b"x" * 2000)
    (tmp_path / "0000000005100000.jsonl.partial").write_bytes(b"x" * 300)
    (tmp_path / ".spool").mkdir()
    write_state(tmp_path, fresh(**LOGICAL))
    code, output = status(tmp_path)
    assert code == 0, output
    lines = output.splitlines()
    assert lines[-1] == ("change log:        2 complete files 2.9 kB (newest "
                         "0000000005000000.jsonl.zst), partial "
                         "0000000005100000.jsonl.partial (300 bytes)")
    assert "files completed:   4 (last 0000000005000000.jsonl.zst)" in lines
    assert not [line for line in lines if "backup" in line or "recoverable" in line]
    code, output = status(tmp_path, "--json")
    document = json.loads(output)
    assert "archive" not in document
    assert document["change_log"] == {
        "files": 2, "bytes": 3000, "newest": "0000000005000000.jsonl.zst",
        "partial": "0000000005100000.jsonl.partial", "partial_bytes": 300}
    assert document["state"]["receiver"] == "logical"


def test_a_monitor_made_for_a_logical_receiver_records_it(tmp_path: Path,
                                                         locked: None) -> None:
    monitor = Monitor(tmp_path, environ={}, receiver="logical")
    monitor.connected("host=db1 port=5432 user=rep", "7300000000000000001", 1, "slot1")
    monitor.streaming_started(1, parse_lsn("0/5000000"))
    monitor.received(parse_lsn("0/5000100"), 100, 250)
    monitor.segment_completed("0000000005000000.jsonl")
    monitor.tick(time.time() + 10)
    try:
        state = read_state(tmp_path)
        assert state is not None
        assert state.receiver == "logical"
        code, output = status(tmp_path)
        assert code == 0, output
        assert "files completed:   1 (last 0000000005000000.jsonl)" in output.splitlines()
    finally:
        monitor.close()
