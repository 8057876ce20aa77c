"""The progress line: its text (pure), its terminal handling, and ``stream --progress`` run under
a pseudo-terminal against a real server, read back through a terminal emulator (pyte)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator
from pathlib import Path

import pyte
import pytest
from support.servers import PgServer
from support.streams import RECEIVEWAL, start_receivewal, stop, wait_for
from support.tcpproxy import TcpProxy

from receivewal.daemon.monitor import Monitor
from receivewal.daemon.progress import ERASE, ClearingStream, ProgressLine, Sample, format_progress
from receivewal.wal.lsn import parse_lsn

MB = 1 << 20
LINE = re.compile(
    r"received (?P<received>\S+)  server (?P<server>\S+)  wire (?P<wire>[\d.]+ \w+)/s  "
    r"WAL (?P<wal>[\d.]+ \w+)/s  ratio (?P<ratio>[\d.]+)x  "
    r"(?P<catch_up>caught up|behind (?P<behind>[\d.]+ \w+)  ETA (?P<eta>\d+:\d\d:\d\d|-))$"
)
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z \[(info|warning|debug|error) *\] ")


# -- the text (pure) ---------------------------------------------------------------------------


def test_line_shows_position_rates_ratio_and_eta_at_the_closing_pace() -> None:
    """Over 2 s the gap to the server closed from 60 MB to 40 MB: 10 MB/s, so 4 s to go."""
    first = Sample(100.0, parse_lsn("0/1000000"), parse_lsn("0/1000000") + 60 * MB, 0, 0)
    last = Sample(102.0, parse_lsn("0/1000000") + 30 * MB, parse_lsn("0/1000000") + 70 * MB,
                  10 * MB, 30 * MB)
    text = format_progress([first, last])
    assert text == ("received 0/2E00000  server 0/5600000  wire 5.0 MB/s  WAL 15.0 MB/s  "
                    "ratio 3.00x  behind 40.0 MB  ETA 0:00:04")
    assert LINE.match(text)
    assert format_progress([first, last], "plain") == text.replace("WAL 15.0", "plain 15.0")


def test_line_says_caught_up_and_eta_unknown_while_falling_behind() -> None:
    at = parse_lsn("0/3000000")
    assert format_progress([Sample(1.0, at, at, 0, 0), Sample(2.0, at, at, 0, 0)]).endswith(
        "caught up")
    falling = [Sample(1.0, at, at + MB, 0, 0), Sample(2.0, at, at + 2 * MB, 0, 0)]
    assert format_progress(falling).endswith("behind 2.0 MB  ETA -")


def test_line_before_anything_is_known() -> None:
    assert format_progress([Sample(1.0, None, None, 0, 0)]) == (
        "received -  server -  wire -  WAL -  ratio -  behind -  ETA -")


# -- the terminal ------------------------------------------------------------------------------


class Tty:
    """A pseudo-terminal: ``slave`` as a text stream, everything written read from ``master``."""

    def __init__(self) -> None:
        self.master, slave = pty.openpty()
        self.slave = os.fdopen(slave, "w")

    def output(self) -> str:
        self.slave.flush()
        os.set_blocking(self.master, False)
        try:
            return os.read(self.master, 65536).decode()
        except BlockingIOError:
            return ""

    def close(self) -> None:
        self.slave.close()
        os.close(self.master)


@pytest.fixture
def tty() -> Iterator[Tty]:
    terminal = Tty()
    yield terminal
    terminal.close()


def test_a_write_to_stderr_erases_the_line_first_and_the_next_update_draws_it_again(
    tty: Tty,
) -> None:
    line = ProgressLine(tty.slave)
    at = parse_lsn("0/3000000")
    line.update(1.0, Sample(1.0, at, at, 0, 0))
    assert tty.output().endswith("received 0/3000000  server 0/3000000  wire -  WAL -  "
                                 "ratio -  caught up\x1b[K")
    line.out.write("2026-01-01T00:00:00Z [info     ] segment_completed\n")
    assert tty.output() == ERASE + "2026-01-01T00:00:00Z [info     ] segment_completed\r\n"
    line.update(1.1, Sample(1.1, at, at, 0, 0))  # within the draw interval, but erased
    assert "received 0/3000000" in tty.output()
    line.update(1.2, Sample(1.2, at, at, 0, 0))  # shown and within the interval: not redrawn
    assert tty.output() == ""
    line.close()
    assert tty.output() == ERASE


def test_for_terminal_takes_stderr_only_when_it_is_a_terminal(
    tty: Tty, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stderr", open(os.devnull, "w"))  # noqa: SIM115
    assert ProgressLine.for_terminal() is None
    sys.stderr.close()
    monkeypatch.setattr(sys, "stderr", tty.slave)
    line = ProgressLine.for_terminal()
    assert line is not None
    assert isinstance(current_stderr(), ClearingStream)
    line.close()
    assert current_stderr() is tty.slave


def current_stderr() -> object:
    return sys.stderr


@pytest.mark.parametrize(("receiver", "carried"), [("wal", "WAL"), ("logical", "plain")])
def test_a_monitors_line_names_what_its_receiver_carries(
    tty: Tty, monkeypatch: pytest.MonkeyPatch, receiver: str, carried: str,
) -> None:
    """A logical receiver's messages are counted as sent plain: its line says so."""
    monkeypatch.setattr(sys, "stderr", tty.slave)
    monitor = Monitor(None, environ={}, progress=True, receiver=receiver)
    try:
        monitor.streaming_started(1, parse_lsn("0/3000000"))
        monitor.tick(1.0)
        assert f"  {carried} -  ratio" in tty.output()
    finally:
        monitor.close()


# -- receivewal stream --progress on a real terminal ----------------------------------------


class Terminal:
    """A process on a pseudo-terminal of ``columns`` x ``lines`` (wide: no log line wraps),
    its output played into a
    pyte screen as a terminal would show it; every state of the cursor's line is kept."""

    def __init__(self, argv: list[str], columns: int = 400, lines: int = 60) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
        self.master = master
        self.screen = pyte.Screen(columns, lines)
        self.stream = pyte.ByteStream(self.screen)
        self.lock = threading.Lock()
        self.raw = bytearray()
        self.cursor_lines: list[str] = []
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                                     start_new_session=True)
        os.close(slave)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the process and its terminal are gone
                return
            if not data:
                return
            with self.lock:
                self.raw += data
                self.stream.feed(data)
                self.cursor_lines.append(self.screen.display[self.screen.cursor.y].rstrip())

    def lines(self) -> list[str]:
        with self.lock:
            return [line.rstrip() for line in self.screen.display if line.strip()]

    def progress(self) -> re.Match[str] | None:
        """The progress line on the screen now (the cursor's line), parsed."""
        with self.lock:
            return LINE.match(self.screen.display[self.screen.cursor.y].rstrip())

    def stop(self) -> int:
        code = stop(self.proc, signal.SIGTERM)
        self.thread.join(timeout=10)
        os.close(self.master)
        return code


def test_stream_progress_on_a_terminal_shows_the_catch_up_and_never_garbles_a_log_line(
    pg: PgServer, archive_dir: Path
) -> None:
    """A backlog of WAL behind a slot, fetched over a 12 MB/s link: the line shows the
    received LSN, the server's WAL end, both rates, the ratio and an ETA while catching up,
    then "caught up" at the server's position; every other line on the screen is a whole log
    line, and the progress line is gone after the stop."""
    pg.sql("SELECT pg_create_physical_replication_slot('rw', true)")
    pg.generate_wal(segments=3)
    proxy = TcpProxy(pg.port, bytes_per_second=12 * MB)
    dsn = f"host=127.0.0.1 port={proxy.port} user=postgres dbname=postgres"
    term = Terminal([*RECEIVEWAL, "stream", "--progress", "-D", str(archive_dir), "-d", dsn,
                     "-S", "rw"])
    try:
        def catching_up() -> bool:
            match = term.progress()
            return match is not None and match["eta"] not in (None, "-")
        wait_for(catching_up, timeout=30, what="the progress line with an ETA")
        match = term.progress()
        assert match is not None
        assert parse_lsn(match["server"]) - parse_lsn(match["received"]) > MB
        assert float(match["wire"].split()[0]) > 0
        assert float(match["ratio"]) >= 1.0  # this server sends plain XLogData: 1.00x

        def caught_up() -> bool:
            match = term.progress()
            return match is not None and match["catch_up"] == "caught up" and (
                match["received"] == pg.sql("SELECT pg_current_wal_flush_lsn()"))
        wait_for(caught_up, timeout=60, what="the progress line to say caught up")
        match = term.progress()
        assert match is not None
        assert match["server"] == match["received"]
    finally:
        code = term.stop()
        proxy.close()
    assert code == 0, term.raw.decode(errors="replace")
    lines = term.lines()
    assert [line for line in lines if not LOG_LINE.match(line)] == [], lines
    assert any("segment_completed" in line for line in lines)
    assert any("stop_requested" in line for line in lines)
    assert not any(LINE.search(line) for line in lines)  # erased at the stop
    # While streaming, the line was drawn many times, never on the same line as a log event
    # (the cursor's line after every read; a read may end in the middle of a write).
    drawn = [line for line in term.cursor_lines if "received 0/" in line]
    assert len(drawn) > 3
    assert not [line for line in drawn if "Z [" in line], drawn


@pytest.mark.shared_server
def test_no_progress_text_with_json_logs_or_off_a_terminal(
    pg: PgServer, archive_dir: Path, tmp_path: Path
) -> None:
    """--progress with --log-format json on a terminal, and with stderr in a file: only JSON
    lines come out."""
    term = Terminal([*RECEIVEWAL, "stream", "--progress", "--log-format", "json",
                     "-D", str(archive_dir), "-d", pg.dsn])
    try:  # the monitor has ticked (and would have drawn) before the second segment's event
        wait_for(lambda: b"streaming_started" in term.raw, timeout=30, what="streaming")
        pg.generate_wal(segments=2)
        wait_for(lambda: term.raw.count(b"segment_completed") >= 2, timeout=30,
                 what="two segments completed")
    finally:
        assert term.stop() == 0
    output = term.raw.decode().replace("\r\n", "\n")
    assert "received 0/" not in output
    assert "\x1b[K" not in output
    events = [json.loads(line) for line in output.splitlines() if line]
    assert "streaming_started" in [e["event"] for e in events]

    log = tmp_path / "log"
    proc = start_receivewal("stream", "--progress", "-D", str(archive_dir), "-d", pg.dsn,
                            stderr_path=log)
    try:
        wait_for(lambda: "streaming_started" in log.read_text(), what="streaming")
    finally:
        assert stop(proc) == 0
    text = log.read_text()
    assert "received 0/" not in text
    assert all(json.loads(line) for line in text.splitlines())
