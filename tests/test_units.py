"""Pure parts: LSNs, file names, write planning, start choice, messages, timelines, settings."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from receivewal.archive.layout import (
    before_its_timeline,
    check_continuity,
    choose_start,
    on_path,
    plan_writes,
    resume_order,
)
from receivewal.commands.pg_receivewal import UsageError
from receivewal.daemon.proctitle import argument_area, scrubbed_area
from receivewal.daemon.settings import Settings
from receivewal.daemon.supervisor import backoff_delay
from receivewal.errors import (
    ArchiveError,
    ConfigurationError,
    ConnectionLost,
    ProtocolError,
    ReceivewalError,
    ServerError,
    WalRemovedError,
)
from receivewal.logs import configure_logging, get_logger
from receivewal.replication.commands import parse_size
from receivewal.replication.connection import build_conninfo
from receivewal.replication.messages import (
    PrimaryKeepalive,
    XLogData,
    build_hot_standby_feedback,
    build_standby_status_update,
    build_xlogdata,
    parse_copy_data,
)
from receivewal.secrets import redacted
from receivewal.wal.lsn import check_segment_size, format_lsn, parse_lsn
from receivewal.wal.names import (
    SegmentFile,
    history_file_name,
    parse_history_file_name,
    parse_segment_file_name,
    wal_file_name,
)
from receivewal.wal.timeline import (
    check_follows,
    describe_fork,
    parse_history,
    timeline_of,
    timeline_spans,
)

SEG = 16 << 20


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_lsn_text_round_trips(lsn: int) -> None:
    """format_lsn and parse_lsn are inverse."""
    assert parse_lsn(format_lsn(lsn)) == lsn


@pytest.mark.parametrize("bad", ["", "0", "0/", "/1", "G/1", "0/123456789", "1/2/3"])
def test_bad_lsn_is_a_configuration_error(bad: str) -> None:
    """Anything but X/X is refused with the offending text in the message."""
    with pytest.raises(ConfigurationError, match="invalid LSN"):
        parse_lsn(bad)


def test_segment_sizes() -> None:
    """Powers of two from 1 MiB to 1 GiB only."""
    assert check_segment_size(1 << 20) == 1 << 20
    assert check_segment_size(1 << 30) == 1 << 30
    for bad in (1 << 19, 1 << 31, 3 << 20):
        with pytest.raises(ConfigurationError):
            check_segment_size(bad)


def test_show_sizes_parse() -> None:
    """SHOW wal_segment_size output in its units."""
    assert parse_size("16MB") == SEG
    assert parse_size("1GB") == 1 << 30
    assert parse_size("1024kB") == 1 << 20
    with pytest.raises(ServerError):
        parse_size("16 parsecs")


@given(st.integers(0, 0xFFFFFFFF), st.integers(0, 2**40), st.sampled_from([1 << 20, SEG, 1 << 30]))
def test_segment_names_round_trip(timeline: int, segno: int, size: int) -> None:
    """wal_file_name and parse_segment_file_name are inverse, with every suffix."""
    if timeline == 0:
        timeline = 1
    segno %= (0x100000000 // size) * 0xFFFFFFFF
    name = wal_file_name(timeline, segno, size)
    for suffix, compression, partial in [("", "", False), (".partial", "", True),
                                         (".gz", "gzip", False), (".lz4.partial", "lz4", True),
                                         (".zst", "zstd", False)]:
        parsed = parse_segment_file_name(name + suffix, size)
        assert parsed == SegmentFile(segno, timeline, compression, partial)
        assert parsed.file_name(size) == name + suffix


def test_segment_name_examples() -> None:
    """Names as PostgreSQL writes them, and names that are not segments."""
    assert wal_file_name(1, 0x5B, SEG) == "00000001000000000000005B"
    assert wal_file_name(2, 256, SEG) == "000000020000000100000000"
    assert parse_segment_file_name("000000010000000000000100", SEG) is None  # seg part too big
    assert parse_segment_file_name("00000001000000000000005b", SEG) is None  # lower case
    assert parse_segment_file_name("000000010000000000000001.tmp", SEG) is None
    assert history_file_name(10) == "0000000A.history"
    assert parse_history_file_name("0000000A.history") == 10
    assert parse_history_file_name("0000000A.partial") is None


@given(st.integers(0, 2**36), st.integers(0, 3 * SEG))
def test_plan_writes_covers_payload_and_respects_boundaries(start: int, length: int) -> None:
    """Pieces are contiguous, cover the payload exactly and never cross a segment end."""
    plans = plan_writes(start, length, SEG)
    assert sum(p.length for p in plans) == length
    position = start
    for plan in plans:
        assert plan.segno * SEG + plan.offset == position
        assert plan.offset + plan.length <= SEG
        assert plan.length > 0
        position += plan.length


def test_continuity_names_both_lsns() -> None:
    """A gap or overlap is refused with both positions in the message."""
    with pytest.raises(ProtocolError, match=r"gap.*0/3000010.*0/3000000"):
        check_continuity(0x3000000, 0x3000010)
    with pytest.raises(ProtocolError, match=r"overlap.*0/2FFFFF0.*0/3000000"):
        check_continuity(0x3000000, 0x2FFFFF0)
    check_continuity(0x3000000, 0x3000000)


def test_resume_order_tie_breaks() -> None:
    """Highest segment, then highest timeline, then complete over partial."""
    files = [SegmentFile(5, 1), SegmentFile(5, 1, partial=True), SegmentFile(4, 3)]
    assert max(files, key=resume_order) == SegmentFile(5, 1)
    files.append(SegmentFile(5, 2, partial=True))
    assert max(files, key=resume_order) == SegmentFile(5, 2, partial=True)


def test_start_choice_follows_pg_receivewal() -> None:
    """Archive first (restream a partial, else the next segment), then slot, then server."""
    server = (0x7123456, 3)
    start = choose_start(SegmentFile(5, 2, partial=True), (0x1000000, 1), server, SEG)
    assert (start.lsn, start.timeline, start.source) == (5 * SEG, 2, "archive")
    start = choose_start(SegmentFile(5, 2), None, server, SEG)
    assert (start.lsn, start.timeline) == (6 * SEG, 2)
    start = choose_start(None, (0x2345678, 1), server, SEG)
    assert (start.lsn, start.timeline, start.source) == (0x2000000, 1, "slot")
    start = choose_start(None, None, server, SEG)
    assert (start.lsn, start.timeline, start.source) == (0x7000000, 3, "server")


def test_messages_round_trip() -> None:
    """XLogData and keepalive decode; status and feedback have the protocol's sizes."""
    frame = build_xlogdata(0x1000000, 0x2000000, 12345, b"abc")
    msg = parse_copy_data(frame)
    assert isinstance(msg, XLogData)
    assert (msg.wal_start, msg.wal_end, msg.send_time, bytes(msg.payload)) == \
        (0x1000000, 0x2000000, 12345, b"abc")
    assert msg.end == 0x1000003
    keepalive = parse_copy_data(struct.pack(">cQqB", b"k", 77, 88, 1))
    assert keepalive == PrimaryKeepalive(77, 88, True)
    status = build_standby_status_update(1, 2, 0, 99, True)
    assert len(status) == 34
    assert struct.unpack(">cQQQqB", status) == (b"r", 1, 2, 0, 99, 1)
    feedback = build_hot_standby_feedback(99)
    assert len(feedback) == 25
    assert struct.unpack(">cqIIII", feedback) == (b"h", 99, 0, 0, 0, 0)
    for bad in (b"w" + b"\0" * 10, b"k\0", b"z" + b"\0" * 30, b""):
        with pytest.raises(ProtocolError):
            parse_copy_data(bad)


HISTORY = "1\t0/3000000\tno recovery target specified\n\n# comment\n2\t0/5000A00\tbefore 2\n"


def test_history_parsing_and_timeline_lookup() -> None:
    """History lines give each parent's end; an LSN maps to the timeline that wrote it."""
    entries = parse_history(HISTORY, 3)
    assert [(e.timeline, e.switchpoint) for e in entries] == [(1, 0x3000000), (2, 0x5000A00)]
    assert timeline_of(0x2FFFFFF, entries, 3) == 1
    assert timeline_of(0x3000000, entries, 3) == 2
    assert timeline_of(0x6000000, entries, 3) == 3
    for bad in ("x\t0/1\treason\n", "1\tnope\n", "2\t0/1\n1\t0/2\n", "3\t0/1\n"):
        with pytest.raises(ArchiveError):
            parse_history(bad, 3)


def test_archive_must_lie_on_the_server_history() -> None:
    """An archive on an ancestor timeline is fine up to the fork, refused past it or off it."""
    entries = parse_history(HISTORY, 3)
    check_follows(1, 0x3000000, entries, 3)
    check_follows(3, 0x9000000, entries, 3)
    with pytest.raises(ArchiveError, match="forked from it at 0/3000000"):
        check_follows(1, 0x4000000, entries, 3)
    with pytest.raises(ArchiveError, match="not in the history"):
        check_follows(4, 0x1000000, [], 5)
    with pytest.raises(ArchiveError, match="ahead"):
        check_follows(4, 0x1000000, entries, 3)


def test_segments_on_a_server_history_and_another_branch() -> None:
    """Along the history 1 until 0/3000A00, 2 until 0/5000000, 3: timeline 1's files up to the
    fork's segment, timeline 2's from it to its end, 3's from 0/5000000; timeline 1 past its
    fork is another branch (kept, never resumed from); a timeline 2 file from before 0/3000A00
    proves the archive's timeline 2 is not the server's."""
    spans = timeline_spans(parse_history("1\t0/3000A00\tx\n2\t0/5000000\ty\n", 3), 3)
    assert [(s.timeline, s.begin, s.end) for s in spans] == \
        [(1, 0, 0x3000A00), (2, 0x3000A00, 0x5000000), (3, 0x5000000, None)]

    def on(tli: int, segno: int) -> bool:
        return on_path(SegmentFile(segno, tli), spans, SEG)

    assert [on(1, n) for n in (1, 2, 3, 4)] == [True, True, True, False]
    assert [on(2, n) for n in (2, 3, 4, 5)] == [False, True, True, False]
    assert [on(3, n) for n in (4, 5, 9)] == [False, True, True]
    assert not on(4, 5)
    assert before_its_timeline([SegmentFile(n, 1) for n in range(1, 9)]
                               + [SegmentFile(3, 2), SegmentFile(6, 2)], spans, SEG) is None
    found = before_its_timeline([SegmentFile(2, 2)], spans, SEG)
    assert found is not None
    assert (found[0], found[1].timeline) == (SegmentFile(2, 2), 2)
    assert describe_fork(3, parse_history("1\t0/3000A00\tx\n2\t0/5000000\ty\n", 3)) == \
        "timeline 3 forked from timeline 2 at 0/5000000 (after timeline 1 until 0/3000A00)"


def test_settings_refuse_what_pg_receivewal_refuses(tmp_path: Path) -> None:
    """Option conflicts are configuration errors with pg_receivewal's wording."""
    base: dict[str, Any] = {"directory": tmp_path, "conninfo": ""}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"synchronous": True, "sync": False}, "cannot use --synchronous together with --no-sync"),
        ({"create_slot": True, "drop_slot": True, "slot": "s"}, "together with --drop-slot"),
        ({"create_slot": True}, "needs a slot"),
        ({"slot": "Bad-Name"}, "is invalid"),
        ({"reserve_wal": True, "slot": "s"}, "--reserve-wal goes with --create-slot"),
        ({"directory": None}, "no target directory specified"),
        ({"status_interval": -1}, "invalid status interval"),
    ]
    for extra, message in cases:
        with pytest.raises(ConfigurationError, match=message):
            Settings(**{**base, **extra}).validate()
    assert Settings(directory=None, conninfo="", slot="s", drop_slot=True).validate()


def test_report_flush_only_with_slot_or_synchronous(tmp_path: Path) -> None:
    """pg_receivewal's rule for reporting a flush position."""
    assert not Settings(directory=tmp_path, conninfo="").report_flush
    assert Settings(directory=tmp_path, conninfo="", slot="s").report_flush
    assert Settings(directory=tmp_path, conninfo="", synchronous=True).report_flush


def test_backoff_is_capped_exponential_with_jitter() -> None:
    """Doubles from the base, never exceeds the cap, jitter stays within 20%."""
    assert backoff_delay(1, 5, 60, rand=lambda: 0.5) == 5
    assert backoff_delay(3, 5, 60, rand=lambda: 0.5) == 20
    assert backoff_delay(10, 5, 60, rand=lambda: 1.0) == 60
    assert backoff_delay(2, 5, 60, rand=lambda: 0.0) == 8
    assert backoff_delay(5, 0, 0) == 0


def test_conninfo_forces_physical_replication_and_redacts() -> None:
    """-d may be a URI or key/value string; replication=true wins; passwords never shown."""
    info = build_conninfo("postgresql://u:secret@db.example:5433/app?replication=database",
                          host="other")
    assert "replication=true" in info
    assert "host=other" in info
    assert "secret" not in redacted(info)
    assert "fallback_application_name=receivewal" in info
    with pytest.raises(ConfigurationError, match="invalid connection string"):
        build_conninfo("host='unterminated")


def test_one_redaction_for_connection_strings_uris_and_messages() -> None:
    """The same function hides passwords in conninfo strings, URIs and error messages."""
    assert redacted("host=db password=s3cret user=x") == "host=db password=**** user=x"
    assert redacted("password = 'a b\\' c' port=1") == "password = **** port=1"
    assert redacted("postgresql://rep:s3cret@db1/x") == "postgresql://rep:****@db1/x"
    assert "s3cret" not in redacted("host=db sslpassword=s3cret")


def test_whether_an_error_is_retried_is_its_class_attribute_alone() -> None:
    """The supervisor retries exactly the errors whose class says retryable; a server's
    refusal is retryable (it always was retried), bad options and a foreign archive are not;
    the drop-in's usage error is one of the project's errors."""
    assert ServerError("x").retryable
    assert WalRemovedError("x").retryable
    assert ConnectionLost("x").retryable
    assert not ConfigurationError("x").retryable
    assert not ArchiveError("x").retryable
    assert issubclass(UsageError, ReceivewalError)


def test_loggers_made_at_import_follow_later_configuration(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A module-level logger still logs JSON to stderr after configure_logging, not to stdout."""
    early = get_logger(component="early")
    configure_logging(0, json=True)
    early.info("hello", answer=42)
    early.debug("not at info level")
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["answer"] == 42


def test_scrubbed_argument_area_keeps_its_length_and_drops_every_password() -> None:
    """The argument strings as the kernel keeps them: passwords of every form redacted, the
    area the same size (zero-filled), even when "****" is longer than the password."""
    area = (b"python3\0-m\0receivewal\0stream\0-d\0host=db password='a b' user=x\0"
            b"--dbname=postgresql://rep:s3cret@db1/x\0-D\0/arch\0")
    clean = scrubbed_area(area)
    assert len(clean) == len(area)
    assert clean.rstrip(b"\0").split(b"\0") == [
        b"python3", b"-m", b"receivewal", b"stream", b"-d", b"host=db password=**** user=x",
        b"--dbname=postgresql://rep:****@db1/x", b"-D", b"/arch"]
    short = b"x\0password=p\0"
    assert scrubbed_area(short) == b"x\0password=*\0"
    assert scrubbed_area(b"stream\0-D\0/arch\0") == b"stream\0-D\0/arch\0"


def test_argument_area_is_read_from_proc_stat_fields_48_and_49() -> None:
    fields = [str(n) for n in range(3, 53)]  # field n holds n; the name has spaces and parens
    assert argument_area("7 (a (b) c) " + " ".join(fields)) == (48, 49)
    assert argument_area("7 (x) " + " ".join("0" for _ in fields)) is None
