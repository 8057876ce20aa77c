"""What STATUS and the state file call "flushed" after a restart: what is really durable."""

from __future__ import annotations

import socket
from pathlib import Path

from receivewal.daemon.monitor import Monitor
from receivewal.wal.lsn import format_lsn, parse_lsn

SEGMENT_START, DURABLE = parse_lsn("0/4000000"), parse_lsn("0/4C77B68")


def run_until_stop(directory: Path, timeline: int, flushed: int) -> None:
    """One run of the daemon as the monitor sees it: streaming, a flush, a stop."""
    with Monitor(directory, environ={}) as monitor:
        monitor.streaming_started(timeline, SEGMENT_START)
        monitor.flushed(flushed)
        monitor.stopping()


def restreamed(directory: Path, timeline: int, *, keeps_partials: bool = True,
               notify: str | None = None) -> Monitor:
    """The next run: it restreams the .partial segment, and the first status report's flush
    position is that segment's start (nothing of it fsynced by this run yet)."""
    monitor = Monitor(directory, environ={"NOTIFY_SOCKET": notify} if notify else {},
                      keeps_partials=keeps_partials)
    monitor.streaming_started(timeline, SEGMENT_START)
    monitor.flushed(SEGMENT_START)
    monitor.tick(0)
    return monitor


def test_restart_does_not_report_less_than_the_plain_partial_holds(tmp_path: Path) -> None:
    """The plain .partial keeps the bytes the last run fsynced while the segment is restreamed
    over them: flushed stays at 0/4C77B68 instead of going back to the segment start."""
    run_until_stop(tmp_path, 1, DURABLE)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(str(tmp_path / "notify"))
        systemd.settimeout(5)
        with restreamed(tmp_path, 1, notify=str(tmp_path / "notify")) as monitor:
            assert monitor.snapshot().flushed_lsn == DURABLE
            assert systemd.recv(4096).startswith(b"READY=1\n")
            assert systemd.recv(4096).decode() == \
                f"STATUS=Streaming timeline 1, flushed {format_lsn(DURABLE)}"
            monitor.flushed(DURABLE + 8192)
            assert monitor.snapshot().flushed_lsn == DURABLE + 8192


def test_a_rewritten_compressed_partial_or_another_timeline_gets_no_floor(
        tmp_path: Path) -> None:
    """A compressed .partial is rewritten from its start, and another timeline's WAL is not
    this timeline's: then only what this run fsynced counts."""
    run_until_stop(tmp_path, 1, DURABLE)
    with restreamed(tmp_path, 1, keeps_partials=False) as monitor:
        assert monitor.snapshot().flushed_lsn == SEGMENT_START
    run_until_stop(tmp_path, 1, DURABLE)
    with restreamed(tmp_path, 2) as monitor:
        assert monitor.snapshot().flushed_lsn == SEGMENT_START
