"""One typed event stream: what a session reports reaches every consumer as numbers, in order."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support.servers import PgServer

from receivewal.commands.pg_receivewal import PgReceivewalMessages
from receivewal.daemon.events import (
    CompressionKnown,
    CompressionStats,
    CompressionSummary,
    Connected,
    EndposReached,
    Event,
    Flushed,
    FlushReported,
    Keepalive,
    Received,
    SegmentCompleted,
    StreamingStarted,
    Tick,
    Written,
)
from receivewal.daemon.lifecycle import Connecting, Stopped, Stopping
from receivewal.daemon.settings import Settings
from receivewal.daemon.state import read_state
from receivewal.daemon.supervisor import Supervisor
from receivewal.replication.connection import build_conninfo
from receivewal.wal.lsn import parse_lsn
from receivewal.wal.names import is_wal_file_name, parse_segment_file_name
from receivewal.walreceiver.receiver import WalReceiver
from receivewal.walreceiver.startpoint import (
    ArchiveWarning,
    FileModeChosen,
    SegmentFileRejected,
    SlotState,
)

PACKAGE = Path(__file__).parent.parent / "receivewal"
SEGMENT = 16 * 1024 * 1024
PROGRESS = (Tick, Received, Written, Keepalive, Flushed, FlushReported,  # as often as they come
            CompressionStats)


@pytest.mark.shared_server
@pytest.mark.server
def test_a_listener_gets_the_sessions_facts_in_order(pg: PgServer, archive_dir: Path) -> None:
    """A scripted listener of a real session: connected, streaming, each completed segment with
    the LSN it ends at, endpos, stopping; the monitor's flushed position (the state file) and
    the slot's restart_lsn are what the last Flushed and FlushReported events said."""
    pg.sql("SELECT pg_create_physical_replication_slot('s', true)")
    pg.generate_wal(2)
    endpos = parse_lsn(pg.endpos_inside_the_wal())
    seen: list[Event] = []
    settings = Settings(directory=archive_dir, conninfo=build_conninfo(pg.dsn), slot="s",
                        endpos=endpos, no_loop=True)
    assert Supervisor(settings, WalReceiver(settings), prompt=None,
                      listeners=(seen.append,)).run() == 0

    facts = [event for event in seen if not isinstance(event, PROGRESS)]
    kinds = [type(event) for event in facts]
    assert kinds[:7] == [Connecting, FileModeChosen, ArchiveWarning, SlotState, Connected,
                         StreamingStarted, CompressionKnown]
    assert kinds[-4:] == [EndposReached, Stopped, CompressionSummary, Stopping]
    completed = [event for event in facts[7:-4] if isinstance(event, SegmentCompleted)]
    assert len(completed) == len(facts) - 11
    files = sorted(n for n in (p.name for p in archive_dir.iterdir()) if is_wal_file_name(n))
    assert [event.segment for event in completed] == files
    assert len(files) >= 2
    for event in completed:
        parsed = parse_segment_file_name(event.segment, SEGMENT)
        assert parsed is not None
        assert event.end_lsn == (parsed.segno + 1) * SEGMENT

    received = [event.end_lsn for event in seen if isinstance(event, Received)]
    assert received == sorted(received)
    end = facts[-4]
    assert isinstance(end, EndposReached)
    assert end.lsn == received[-1] >= endpos
    flushed = [event.lsn for event in seen if isinstance(event, Flushed)]
    assert flushed == sorted(flushed)
    assert flushed[-1] == end.lsn
    state = read_state(archive_dir)
    assert state is not None
    assert state.flushed_lsn == flushed[-1]  # the monitor kept what the events said
    reported = [event for event in seen if isinstance(event, FlushReported)]
    assert reported[-1].flush == flushed[-1]
    assert pg.sql("SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = 's'") == \
        f"{reported[-1].flush >> 32:X}/{reported[-1].flush & 0xFFFFFFFF:X}"


def test_the_dropin_words_a_completed_segment_from_the_event_not_the_log() -> None:
    """"finished segment at" is the segment's end as the event carries it (the writer may
    already be past it); the drop-in's log renderer knows no event by name: a log line of
    the same fact would be worded by its level alone (and the drop-in logs no typed event)."""
    messages = PgReceivewalMessages(1)
    event = SegmentCompleted("000000010000000000000002", 1, lsn=parse_lsn("0/3000040"),
                             end_lsn=parse_lsn("0/3000000"))
    assert messages.event_line(event) == "finished segment at 0/3000000 (timeline 1)"
    assert messages.message("info", {"event": "segment_completed", **event.log_fields()}) \
        is None
    assert PgReceivewalMessages(0).event_line(event) is None  # progress only with -v
    rejected = SegmentFileRejected("000000010000000000000003", "has 8192 bytes, should be 0 "
                                   "or 16777216")
    assert PgReceivewalMessages(0).event_line(rejected) == \
        'warning: segment file "000000010000000000000003" has 8192 bytes, should be 0 or ' \
        '16777216, skipping'
    assert messages.message("warning", {"event": "segment_file_rejected",
                                        **rejected.log_fields()}) == \
        "warning: segment_file_rejected: file=000000010000000000000003 reason=has 8192 " \
        "bytes, should be 0 or 16777216"


def test_the_dropin_reads_events_only() -> None:
    """The drop-in's words come from typed events: its module names no log event (no string
    equal to a typed event's log name), and it runs the supervisor without the event log."""
    typed = {kind.name for kind in Event.__subclasses__() if kind.name is not None}
    source = PACKAGE / "commands" / "pg_receivewal.py"
    named = [node.value for node in ast.walk(ast.parse(source.read_text()))
             if isinstance(node, ast.Constant) and node.value in typed]
    assert named == []
    runs = [node for _, node in calls(source) if isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Call)
            and getattr(node.func.value.func, "id", None) == "Supervisor"]
    assert len(runs) == 1
    keywords = {kw.arg: kw.value for kw in runs[0].func.value.keywords}  # type: ignore[attr-defined]
    assert isinstance(keywords["log_events"], ast.Constant)
    assert keywords["log_events"].value is False


def calls(path: Path) -> list[tuple[str, ast.Call]]:
    """Every call in ``path`` with the name of the function it is made in ("" at the top)."""
    found: list[tuple[str, ast.Call]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef) else where
            if isinstance(child, ast.Call):
                found.append((where, child))
            visit(child, inner)

    visit(ast.parse(path.read_text(), str(path)), "")
    return found


def test_the_dropin_reads_no_lsn_back_from_text_but_its_endpos_option() -> None:
    """The drop-in's messages come from typed events: the only LSN it parses is -E's."""
    parsing = [(where, node.func.id) for where, node in calls(PACKAGE / "commands" /
                                                              "pg_receivewal.py")
               if isinstance(node.func, ast.Name) and node.func.id in ("parse_lsn", "scan_lsn")]
    assert parsing == [("parse_endpos", "scan_lsn")]


def test_no_module_logs_a_typed_events_line_itself() -> None:
    """Each typed event's log line is written by the stream's log consumer alone: no module
    calls ``log.info("segment_completed", ...)`` (or any other typed event's name)."""
    typed = {kind.name for kind in Event.__subclasses__() if kind.name is not None}
    assert {"segment_completed", "streaming_started", "failed", "reconnecting",
            "segment_file_rejected", "stopped", "compression_summary"} <= typed
    direct = [
        f"{path.relative_to(PACKAGE)}: {node.args[0].value}"
        for path in sorted(PACKAGE.rglob("*.py")) for _, node in calls(path)
        if isinstance(node.func, ast.Attribute)
        and node.func.attr in ("debug", "info", "warning", "error", "critical")
        and node.args and isinstance(node.args[0], ast.Constant)
        and node.args[0].value in typed
    ]
    assert direct == []
