"""The COPY loop drives any consumer of a stream: a logical change log is a second one beside
the WAL archive, through the logical receiver's feed (logicalreceiver/changefeed.py), with the same
loop, status updates, events and monitor (issue 26 item 4, for issue 27's logical
receiver)."""

from __future__ import annotations

import struct
from pathlib import Path

from support import logical_wire as w
from support.changelog import open_store, read_log, runs
from support.scripted import ScriptedConnection, status_updates
from support.stopflag import Stop

from receivewal.daemon.copyloop import STOPPED, CopyLoop, StreamConsumer
from receivewal.daemon.events import CompressionKnown, Event, Flushed, Received
from receivewal.daemon.monitor import Monitor
from receivewal.daemon.settings import Settings
from receivewal.logical.consumer import ChangeLogConsumer, PluginSettings
from receivewal.logical.pgoutput import PgoutputOptions
from receivewal.logicalreceiver.changefeed import ChangeFeed
from receivewal.replication.link import WalRun
from receivewal.replication.messages import build_xlogdata
from receivewal.replication.streampack import StreampackEncoder, is_compressed
from receivewal.wal.lsn import format_lsn

T0 = 849_000_000_000_000
ITEMS = w.relation(16384, "public", "items", [(True, "id", 23, -1), (False, "name", 25, -1)])


def keepalive(wal_end: int, reply: bool) -> bytes:
    return struct.pack(">cQqB", b"k", wal_end, 0, int(reply))


def test_the_copy_loop_feeds_a_change_log_through_a_thin_adapter(tmp_path: Path) -> None:
    """pgoutput messages as a server sends them, one as the compiled receive loop hands them
    over (a run of two whose walStarts follow on), through the same COPY loop as WAL: the
    change log holds the committed transaction alone, the status updates report the durable
    commit as flushed (not the open transaction after it), and the monitor shows what the
    consumer's Flushed events said."""
    begin = w.begin(0x400, T0, 700)
    insert = w.insert(16384, [("t", b"1"), ("t", b"one")])
    script: list[bytes | WalRun] = [
        build_xlogdata(0x100, 0x100, 0, ITEMS),
        WalRun(0x300, 0x300, [memoryview(begin), memoryview(insert)], wire=0),
        build_xlogdata(0x300 + len(begin) + len(insert), 0x430, 0,
                       w.commit(0x400, 0x430, T0)),
        build_xlogdata(0x500, 0x500, 0, w.begin(0x600, T0, 701)),  # still open at the stop
        keepalive(0x500, reply=True),
    ]
    assert 0x300 + len(begin) + len(insert) < 0x400
    stop = Stop()
    conn = ScriptedConnection(script, stop)
    monitor = Monitor.null()
    seen: list[Event] = []

    def events(event: Event) -> None:
        seen.append(event)
        monitor(event)

    settings = Settings(directory=tmp_path, conninfo="", slot="logical", status_interval=0,
                        hot_standby_feedback=False)
    store = open_store(tmp_path)
    options = PgoutputOptions(1, streaming="off", two_phase=False, binary=False,
                              messages=False)
    feed: StreamConsumer = ChangeFeed(ChangeLogConsumer(store, PluginSettings(
        "pgoutput", options)), store, events)
    loop = CopyLoop(conn, settings, events, stop)
    loop.start("START_REPLICATION SLOT logical LOGICAL 0/0")
    try:
        assert loop.run(feed, 1) == STOPPED
    finally:
        feed.close()
        store.close()
    logged = runs(read_log(tmp_path))
    assert [[record["op"] for record in run] for run in logged] == [["begin", "insert", "commit"]]
    assert [record["lsn"] for record in logged[0]] == \
        [format_lsn(lsn) for lsn in (0x300, 0x300 + len(begin), 0x300 + len(begin) +
                                     len(insert))]  # each message's own walStart
    assert status_updates(conn)[0] == (0x500, 0x430, 0)  # the keepalive's reply
    assert status_updates(conn)[-1] == (0x500, 0x430, 0)  # and the one at the stop
    assert {m[:1] for m in conn.sent} == {b"r"}
    assert monitor.snapshot().flushed_lsn == 0x430
    assert [event.lsn for event in seen if isinstance(event, Flushed)][-1] == 0x430


def loop_events(tmp_path: Path, frames: list[bytes],
                compression: tuple[str, ...]) -> list[Event]:
    """The events of the COPY loop fed ``frames`` of a logical stream, pg_streampack
    decoding as ``compression`` asks."""
    tmp_path.mkdir(exist_ok=True)
    stop = Stop()
    conn = ScriptedConnection([*frames, keepalive(0x900, reply=False)], stop)
    seen: list[Event] = []
    settings = Settings(directory=tmp_path, conninfo="", slot="logical", status_interval=0,
                        hot_standby_feedback=False, compression=compression)
    store = open_store(tmp_path)
    options = PgoutputOptions(1, streaming="off", two_phase=False, binary=False,
                              messages=False)
    feed: StreamConsumer = ChangeFeed(ChangeLogConsumer(store, PluginSettings(
        "pgoutput", options)), store, seen.append)
    loop = CopyLoop(conn, settings, seen.append, stop, scattered=True)  # as logicalsession
    loop.start("START_REPLICATION SLOT logical LOGICAL 0/0")
    try:
        assert loop.run(feed, 1) == STOPPED
    finally:
        feed.close()
        store.close()
    assert len(runs(read_log(tmp_path))) == 1
    return seen


def compression_reports(tmp_path: Path, frames: list[bytes],
                        compression: tuple[str, ...]) -> list[tuple[str | None, str]]:
    """The CompressionKnown events (algorithm, requested) of the COPY loop fed ``frames``."""
    return [(e.algorithm, e.requested) for e in loop_events(tmp_path, frames, compression)
            if isinstance(e, CompressionKnown)]


def transaction_frames() -> list[bytes]:
    """One transaction as XLogData frames: a Begin (21 bytes) first, shorter than
    pg_streampack's min_size (32), so a compressing server sends it plain."""
    begin = w.begin(0x400, T0, 700)
    insert = w.insert(16384, [("t", b"1"), ("t", b"one")])
    assert len(begin) < 32 <= len(ITEMS)
    messages = [begin, ITEMS, insert, w.commit(0x400, 0x430, T0)]
    frames, lsn = [], 0x300
    for message in messages:
        frames.append(build_xlogdata(lsn, lsn, 0, message))
        lsn += len(message)
    return frames


def test_a_compressed_logical_stream_is_reported_once_with_its_algorithm(
        tmp_path: Path) -> None:
    """A logical stream begins with messages too short to compress (a Begin): the stream is
    not reported plain on its first frame and then compressed, but once, with its algorithm,
    when the first compressed frame comes."""
    encoder = StreampackEncoder("zstd")
    frames = [bytes(encoder.encode(frame)) for frame in transaction_frames()]
    assert [is_compressed(frame) for frame in frames] == [False, True, False, False]
    assert compression_reports(tmp_path, frames, ("zstd", "lz4")) == [("zstd", "zstd,lz4")]


def test_a_plain_stream_is_reported_plain_once_a_frame_could_have_been_compressed(
        tmp_path: Path) -> None:
    """Compression asked of a server without pg_streampack: the stream is reported plain at
    the first frame long enough to have been compressed; asked for nothing, at the first."""
    assert compression_reports(tmp_path / "asked", transaction_frames(), ("zstd",)) == [
        (None, "zstd")]
    assert compression_reports(tmp_path / "not", transaction_frames(), ()) == [(None, "")]


def test_a_logical_streams_bytes_count_its_messages_as_sent_plain(tmp_path: Path) -> None:
    """What a logical stream received counts its messages whole, 25-byte header included, as
    the server sends them uncompressed: so the ratio to the wire is 1 for a plain stream (its
    many small messages would read 0.4 by their payloads) and the gain when compressed."""
    plain = transaction_frames()
    encoder = StreampackEncoder("zstd")
    compressed = [bytes(encoder.encode(frame)) for frame in plain]
    for name, frames in (("plain", plain), ("zstd", compressed)):
        received = [e for e in loop_events(tmp_path / name, frames, ("zstd",))
                    if isinstance(e, Received)]
        assert sum(e.wal_bytes for e in received) == sum(map(len, plain))
        assert sum(e.wire_bytes for e in received) == sum(map(len, frames))
