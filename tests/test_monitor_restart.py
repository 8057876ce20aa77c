"""What STATUS and the state file call "flushed" after a restart: what is really durable.

The flushed position has one holder, the segment writer. A plain .partial keeps the bytes the
last run made durable while it is restreamed, so the writer's durable position starts there,
told by the WAL archive's receiver (from the last run's state file, then from each session to
the next); the monitor only keeps what the Flushed events say."""

from __future__ import annotations

import socket
from pathlib import Path

from support.scripted import ScriptedConnection, status_updates
from support.stopflag import Stop

from receivewal.archive.compression import NO_COMPRESSION, CompressSpec
from receivewal.archive.directory import Archive
from receivewal.archive.layout import StartPoint
from receivewal.archive.writer import open_segment_writer
from receivewal.daemon.events import EventStream
from receivewal.daemon.monitor import Monitor
from receivewal.daemon.settings import Settings
from receivewal.replication.commands import ServerInfo
from receivewal.wal.lsn import format_lsn, parse_lsn
from receivewal.walreceiver.receiver import WalReceiver
from receivewal.walreceiver.startpoint import Start

SEGMENT = 16 << 20
SEGMENT_START, DURABLE = parse_lsn("0/4000000"), parse_lsn("0/4C77B68")


def run_until_stop(directory: Path, timeline: int, flushed: int) -> None:
    """One run of the daemon as the monitor sees it: streaming, a flush, a stop."""
    with Monitor(directory, environ={}) as monitor:
        monitor.streaming_started(timeline, SEGMENT_START)
        monitor.flushed(flushed)
        monitor.stopping()


def notifications(systemd: socket.socket) -> list[str]:
    """Every message systemd got so far."""
    told = []
    systemd.settimeout(0.2)
    try:
        while True:
            told.append(systemd.recv(4096).decode())
    except TimeoutError:
        return told


def test_a_restreamed_plain_partial_keeps_what_the_last_run_made_durable(
        tmp_path: Path) -> None:
    """The writer restreaming a plain .partial is durable up to what the last run said, while
    what it reports flushed starts at the segment again; once it flushes past that, both are
    its own. A compressed .partial is rewritten from its start: it keeps nothing."""
    archive = Archive(tmp_path, sync=False)
    plain = open_segment_writer(archive, SEGMENT, 1, SEGMENT_START, NO_COMPRESSION,
                                kept=DURABLE)
    try:
        assert (plain.flushed, plain.durable) == (SEGMENT_START, DURABLE)
        plain.write(SEGMENT_START, bytes(DURABLE - SEGMENT_START + 8192))
        assert plain.flush(wait=True) == plain.durable == DURABLE + 8192
    finally:
        plain.close()
    compressed = open_segment_writer(archive, SEGMENT, 1, SEGMENT_START, CompressSpec("zstd"),
                                     kept=DURABLE)
    try:
        assert compressed.durable == SEGMENT_START
    finally:
        compressed.close()


def test_restart_does_not_report_less_than_the_plain_partial_holds(tmp_path: Path) -> None:
    """The last run's state file says 0/4C77B68 was durable on timeline 1: the next run's
    first session restreams the plain .partial from its start, reports the segment's start to
    the server as flushed, and says 0/4C77B68 to the monitor (STATUS, the state file); its
    next session takes over from the first, and another timeline gets nothing of it."""
    run_until_stop(tmp_path, 1, DURABLE)
    receiver = WalReceiver(Settings(directory=tmp_path, conninfo="", slot="s",
                                    status_interval=0))
    events = EventStream()
    receiver.open(events)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
            systemd.bind(str(tmp_path / "notify"))
            monitor = Monitor(tmp_path, environ={"NOTIFY_SOCKET": str(tmp_path / "notify")})
            events.subscribe(monitor)
            with monitor:
                stop = Stop()
                conn = ScriptedConnection([], stop)
                session = receiver.session(conn, events, stop)
                session.start = Start(ServerInfo("1", 1, DURABLE, SEGMENT, 0o600, 150000),
                                      StartPoint(SEGMENT_START, 1, "archive"))
                assert session.run() == "stopped"
                assert status_updates(conn)[0] == (SEGMENT_START, SEGMENT_START, 0)
                assert monitor.snapshot().flushed_lsn == DURABLE
                told = notifications(systemd)
                assert any(line.startswith("READY=1") for line in told)
                flushed = [line for line in told if "flushed" in line]
                assert flushed == [f"STATUS=Streaming timeline 1, flushed {format_lsn(DURABLE)}"]
                assert session.durable == (1, DURABLE)
                assert receiver.session(conn, events, stop).previous == (1, DURABLE)
    finally:
        receiver.close()
        receiver.release()
    run_until_stop(tmp_path, 2, DURABLE)  # the last run was on another timeline
    other = WalReceiver(Settings(directory=tmp_path, conninfo=""))
    other.open(EventStream())
    try:
        assert other.session(conn, events, stop).previous == (2, DURABLE)
    finally:
        other.release()
