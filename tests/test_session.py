"""The COPY loop with a scripted connection: what is reported, when, and what is refused."""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.scripted import ScriptedConnection, status_updates
from support.stopflag import Stop

from receivewal.archive.directory import Archive
from receivewal.archive.layout import StartPoint
from receivewal.daemon.events import Event, SegmentCompleted
from receivewal.daemon.monitor import Monitor
from receivewal.daemon.settings import Settings
from receivewal.errors import ProtocolError, StreampackError
from receivewal.replication.commands import ServerInfo
from receivewal.replication.copystream import CopyStream
from receivewal.replication.link import (
    COPY_DONE,
    ReplicationLink,
    WalRun,
)
from receivewal.replication.messages import PrimaryKeepalive, build_xlogdata
from receivewal.replication.streampack import StreampackEncoder
from receivewal.walreceiver.session import Session
from receivewal.walreceiver.startpoint import Start

SEG = 1 << 20
START = 3 * SEG



def keepalive(reply: bool) -> bytes:
    return struct.pack(">cQqB", b"k", START + 10 * SEG, 0, int(reply))


def make_session(tmp_path: Path, script: Sequence[bytes | WalRun], **settings: Any
                 ) -> tuple[Session, ScriptedConnection]:
    stop = Stop()
    conn = ScriptedConnection(script, stop)
    archive = Archive(tmp_path, sync=True)
    link: ReplicationLink = conn
    session = Session(link, settings=Settings(directory=tmp_path, conninfo="",
                                              status_interval=0, **settings),
                      archive=archive, events=Monitor.null(), stop=stop)
    session.start = Start(ServerInfo("1", 1, START, SEG, 0o600, 150000),
                          StartPoint(START, 1, "server"))
    return session, conn


def test_flush_is_reported_only_after_fsync(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """With a slot, each reported flush position was covered by an fsync before it was sent."""
    fsynced: list[int] = []
    session_ref: list[Session] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        real_fsync(fd)
        if session_ref and session_ref[0].feed is not None:
            fsynced.append(session_ref[0].feed.position)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    script = [build_xlogdata(START, 0, 0, b"a" * 1000), keepalive(reply=False),
              build_xlogdata(START + 1000, 0, 0, b"b" * 3000), keepalive(reply=True),
              build_xlogdata(START + 4000, 0, 0, b"c" * 500)]
    session, conn = make_session(tmp_path, script, slot="s")
    session_ref.append(session)
    assert session.run() == "stopped"
    updates = status_updates(conn)
    assert updates, "no status update sent"
    for write, flush, apply in updates:
        assert apply == 0
        assert flush <= write
        assert flush <= max([START, *fsynced]), "flush reported beyond what was fsynced"
    assert updates[0] == (START + 4000, START + 4000, 0)  # the keepalive asked for a reply
    assert updates[-1] == (START + 4500, START + 4500, 0)  # the final report at stop
    data = (tmp_path / "000000010000000000000003.partial").read_bytes()
    assert data[:4500] == b"a" * 1000 + b"b" * 3000 + b"c" * 500
    assert len(data) == SEG


def test_without_slot_flush_is_zero_and_feedback_follows_status(tmp_path: Path) -> None:
    """No slot: flush = 0 (Invalid); every r is followed by an all-zero h."""
    session, conn = make_session(tmp_path, [build_xlogdata(START, 0, 0, b"x" * 10),
                                            keepalive(reply=True)])
    session.run()
    assert status_updates(conn)[0] == (START + 10, 0, 0)
    kinds = [m[:1] for m in conn.sent]
    assert kinds == [b"r", b"h"] * (len(kinds) // 2)
    assert all(struct.unpack(">cqIIII", m)[2:] == (0, 0, 0, 0) for m in conn.sent
               if m[:1] == b"h")


def test_feedback_off_sends_no_h(tmp_path: Path) -> None:
    """--no-hot-standby-feedback: only r messages."""
    session, conn = make_session(tmp_path, [keepalive(reply=True)], hot_standby_feedback=False)
    session.run()
    assert {m[:1] for m in conn.sent} == {b"r"}


def test_gap_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """WAL that does not continue where the file stands raises, naming both LSNs."""
    session, _ = make_session(tmp_path, [build_xlogdata(START, 0, 0, b"a" * 100),
                                         build_xlogdata(START + 200, 0, 0, b"b" * 100)])
    with pytest.raises(ProtocolError, match=r"gap: received data at 0/3000C8 but the archive "
                                            r"continues at 0/300064"):
        session.run()
    data = (tmp_path / "000000010000000000000003.partial").read_bytes()
    assert data[:100] == b"a" * 100
    assert data[100:400] == bytes(300)


def test_compressed_frame_without_request_is_refused(tmp_path: Path) -> None:
    """A flagged frame when no compression was requested is a streampack error."""
    frame = bytearray(build_xlogdata(START, 0, 0, b"z" * 64))
    frame[17] |= 0x80
    session, _ = make_session(tmp_path, [bytes(frame)], compression=())
    with pytest.raises(StreampackError, match="0/300000"):
        session.run()


def test_payload_crossing_a_segment_completes_the_first(tmp_path: Path) -> None:
    """A message across a boundary is split; the first segment is renamed complete."""
    start = START + SEG - 100
    first = build_xlogdata(START, 0, 0, b"p" * (SEG - 100))
    session, _ = make_session(tmp_path, [first, build_xlogdata(start, 0, 0, b"q" * 300)])
    session.run()
    done = (tmp_path / "000000010000000000000003").read_bytes()
    assert done == b"p" * (SEG - 100) + b"q" * 100
    nxt = (tmp_path / "000000010000000000000004.partial").read_bytes()
    assert nxt[:200] == b"q" * 200


def test_run_of_the_compiled_loop_is_written_across_a_segment_boundary(tmp_path: Path) -> None:
    """A WalRun (the compiled loop's batch) between plain messages and a keepalive: its pieces
    are written in order, cut at the segment boundary, the first segment completed, the reply
    reports its end, and the decoder counts its frames as plain ones."""
    pieces = [memoryview(b"a" * 200), memoryview(b"b" * 300)]
    run = WalRun(START + SEG - 300, START + 2 * SEG, pieces, wire=500 + 2 * 25)
    script: list[bytes | WalRun] = [build_xlogdata(START, 0, 0, b"p" * (SEG - 300)), run,
                                    keepalive(reply=True),
                                    build_xlogdata(START + SEG + 200, 0, 0, b"c" * 50)]
    session, conn = make_session(tmp_path, script, slot="s")
    assert session.run() == "stopped"
    done = (tmp_path / "000000010000000000000003").read_bytes()
    assert done == b"p" * (SEG - 300) + b"a" * 200 + b"b" * 100
    assert (tmp_path / "000000010000000000000004.partial").read_bytes()[:250] == \
        b"b" * 200 + b"c" * 50
    assert status_updates(conn)[0][0] == START + SEG + 200
    stats = session.loop.stream.stats()
    assert (stats.frames, stats.wal_bytes) == (4, SEG + 250)


def test_one_message_completing_two_segments_reports_each_with_its_end(tmp_path: Path) -> None:
    """A payload running over two segment boundaries: two SegmentCompleted events, in order,
    each with the LSN its segment ends at (the writer is already past both)."""
    session, _ = make_session(tmp_path, [build_xlogdata(START, 0, 0, b"m" * (2 * SEG + 100))])
    seen: list[Event] = []
    session.events = seen.append
    session.run()
    completed = [event for event in seen if isinstance(event, SegmentCompleted)]
    assert [(event.segment, event.end_lsn, event.lsn) for event in completed] == [
        ("000000010000000000000003", START + SEG, START + 2 * SEG + 100),
        ("000000010000000000000004", START + 2 * SEG, START + 2 * SEG + 100),
    ]


def test_the_copy_stream_hands_over_one_kind_of_data() -> None:
    """What the session reads is a run, a keepalive or the end: a plain XLogData payload and a
    pg_streampack frame come out as runs of one message (restored, the wire bytes counted as
    they came), the compiled loop's run as it is; the decoder counts the run's frames too."""
    plain = build_xlogdata(START, START + 100, 0, b"p" * 100)
    encoder = StreampackEncoder("zstd")
    packed = bytes(encoder.encode(build_xlogdata(START + 100, START + 400, 0, b"z" * 300)))
    run = WalRun(START + 400, START + 600, [memoryview(b"a" * 50), memoryview(b"b" * 150)],
                 wire=200 + 2 * 25)
    stop = Stop()
    link = ScriptedConnection([plain, packed, run, keepalive(reply=True)], stop)
    stream = CopyStream(link, ("zstd",))
    got = [stream.read(0.0) for _ in range(4)]
    assert [type(message) for message in got] == [WalRun, WalRun, WalRun, PrimaryKeepalive]
    first, second, third, _ = got
    assert isinstance(first, WalRun)
    assert isinstance(second, WalRun)
    assert (first.wal_start, first.wal_end, [bytes(p) for p in first.payload], first.wire) == \
        (START, START + 100, [b"p" * 100], len(plain))
    assert (second.wal_start, [bytes(p) for p in second.payload], second.wire) == \
        (START + 100, [b"z" * 300], len(packed))
    assert third is run
    assert stream.algorithm == "zstd"
    assert stream.read(0.0) is None  # nothing more: the scripted server stops us
    link.end_copy()
    assert stream.read(0.0) is COPY_DONE
    assert (stream.stats().frames, stream.stats().compressed_frames) == (4, 1)
