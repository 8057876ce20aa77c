"""The pgoutput (protocol versions 1 to 4) and pglogical_output decoders, on messages built
from the documented layouts: every message decodes to its dataclass, anything the agreed
protocol does not allow, anything damaged or unknown is the project's ProtocolError naming
the LSN, and random bytes raise nothing else. Real servers' output is decoded in
test_logical_stream.py and test_logical_pglogical.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import logical_wire as w

from receivewal.errors import ConfigurationError, ProtocolError
from receivewal.logical import outputmessages as m
from receivewal.logical.pglogical import PglogicalDecoder, startup_parameters
from receivewal.logical.pgoutput import PgoutputDecoder, PgoutputOptions, highest_proto_version

LSN = 0x1_016B_3748
AT = "1/16B3748"  # how the errors name it
V1 = PgoutputOptions(1)
V2 = PgoutputOptions(2, streaming="on", binary=True, messages=True)
V3 = PgoutputOptions(3, streaming="on", two_phase=True, binary=True, messages=True)
V4 = PgoutputOptions(4, streaming="parallel", two_phase=True, binary=True, messages=True)
ROW = [("t", b"1"), ("n", None), ("u", None), ("b", b"\x00\x00\x00\x07")]
TUPLE = m.TupleData("tnub", (b"1", None, None, b"\x00\x00\x00\x07"))


def decode(options: PgoutputOptions, *payloads: bytes) -> list[m.LogicalMessage]:
    decoder = PgoutputDecoder(options)
    return [decoder.decode(LSN, payload) for payload in payloads]


# -- every message, as documented ---------------------------------------------------------------
@pytest.mark.parametrize(("payload", "expected"), [
    (w.begin(0x1000, 42, 700), m.Begin(0x1000, 42, 700)),
    (w.commit(0x1000, 0x1030, 42), m.Commit(0x1000, 0x1030, 42)),
    (w.origin(0x99, "node_a"), m.Origin(0x99, "node_a")),
    (w.relation(16384, "public", "t", [(True, "id", 23, -1), (False, "v", 1043, 14)],
                identity="f"),
     m.Relation(None, 16384, "public", "t", "f",
                (m.RelationColumn(True, "id", 23, -1), m.RelationColumn(False, "v", 1043, 14)))),
    (w.type_message(16500, "public", "mood"), m.Type(None, 16500, "public", "mood")),
    (w.insert(16384, [("t", b"1"), ("n", None)]),
     m.Insert(None, 16384, m.TupleData("tn", (b"1", None)))),
    (w.update(16384, [("t", b"2"), ("u", None)]),
     m.Update(None, 16384, None, None, m.TupleData("tu", (b"2", None)))),
    (w.update(16384, [("t", b"2")], old=[("t", b"1")], old_kind="K"),
     m.Update(None, 16384, "K", m.TupleData("t", (b"1",)), m.TupleData("t", (b"2",)))),
    (w.update(16384, [("t", b"2")], old=[("t", b"1")], old_kind="O"),
     m.Update(None, 16384, "O", m.TupleData("t", (b"1",)), m.TupleData("t", (b"2",)))),
    (w.delete(16384, [("t", b"1"), ("n", None)], old_kind="O"),
     m.Delete(None, 16384, "O", m.TupleData("tn", (b"1", None)))),
    (w.truncate([16384, 16390], cascade=True, restart_identity=True),
     m.Truncate(None, (16384, 16390), cascade=True, restart_identity=True)),
    (w.truncate([16384]), m.Truncate(None, (16384,), cascade=False, restart_identity=False)),
])
def test_protocol_1_messages_decode_as_documented(payload: bytes,
                                                  expected: m.LogicalMessage) -> None:
    """Begin, Commit, Origin, Relation (with its replica identity and columns), Type,
    Insert, Update without, with the old key and with the old row, Delete, Truncate with
    its cascade and restart identity flags."""
    assert decode(V1, payload) == [expected]


def test_message_needs_the_messages_option() -> None:
    """Message (pg_logical_emit_message) decodes when the messages option was asked for;
    without it the server never sends one, so receiving one is an error."""
    payload = w.message(0x2000, "app", b"\x00hello", transactional=False)
    assert decode(PgoutputOptions(1, messages=True), payload) == [
        m.Message(None, False, 0x2000, "app", b"\x00hello")]
    with pytest.raises(ProtocolError, match=f"pgoutput Message at {AT}: not part of the "
                                            "agreed protocol"):
        decode(V1, payload)


def test_tuple_data_kinds_null_unchanged_toast_text_and_binary() -> None:
    """TupleData's four kinds: n (NULL), u (unchanged TOAST, no value), t and b with a length;
    b only where binary transfer was agreed."""
    assert decode(V2, w.insert(1, ROW)) == [m.Insert(None, 1, TUPLE)]
    with pytest.raises(ProtocolError, match=f"pgoutput Insert at {AT}: column 4 is binary, "
                                            "which was not agreed"):
        decode(V1, w.insert(1, ROW))


def test_protocol_2_streams_carry_the_xid_on_every_change() -> None:
    """Inside Stream Start .. Stream Stop, Relation, Type, every change and Message start
    with the (sub)transaction's id; Stream Commit and Stream Abort (without abort LSN and time
    before protocol 4's parallel streaming) come outside a block."""
    got = decode(V2, w.stream_start(800, True),
                 w.relation(1, "public", "t", [(True, "id", 23, -1)], xid=801),
                 w.type_message(16500, "public", "mood", xid=801),
                 w.insert(1, [("t", b"1")], xid=801),
                 w.update(1, [("t", b"2")], old=[("t", b"1")], xid=800),
                 w.delete(1, [("t", b"2")], xid=800),
                 w.truncate([1], xid=800),
                 w.message(0x50, "p", b"x", transactional=True, xid=801),
                 w.stream_stop(),
                 w.stream_start(800, False), w.stream_stop(),
                 w.stream_abort(800, 801),
                 w.stream_commit(800, 0x1000, 0x1030, 9))
    assert got == [
        m.StreamStart(800, True),
        m.Relation(801, 1, "public", "t", "d", (m.RelationColumn(True, "id", 23, -1),)),
        m.Type(801, 16500, "public", "mood"),
        m.Insert(801, 1, m.TupleData("t", (b"1",))),
        m.Update(800, 1, "K", m.TupleData("t", (b"1",)), m.TupleData("t", (b"2",))),
        m.Delete(800, 1, "K", m.TupleData("t", (b"2",))),
        m.Truncate(800, (1,), cascade=False, restart_identity=False),
        m.Message(801, True, 0x50, "p", b"x"),
        m.StreamStop(), m.StreamStart(800, False), m.StreamStop(),
        m.StreamAbort(800, 801, None, None),
        m.StreamCommit(800, 0x1000, 0x1030, 9)]


def test_protocol_3_two_phase_messages() -> None:
    """Begin Prepare, Prepare, Commit Prepared, Rollback Prepared, and Stream Prepare for a
    streamed transaction."""
    got = decode(V3, w.begin_prepare(0x100, 0x130, 5, 900, "gid-1"),
                 w.prepare(0x100, 0x130, 5, 900, "gid-1"),
                 w.commit_prepared(0x200, 0x230, 6, 900, "gid-1"),
                 w.rollback_prepared(0x330, 0x360, 7, 8, 901, "gid-2"),
                 w.stream_prepare(0x400, 0x430, 9, 902, "gid-3"))
    assert got == [m.BeginPrepare(0x100, 0x130, 5, 900, "gid-1"),
                   m.Prepare(0x100, 0x130, 5, 900, "gid-1"),
                   m.CommitPrepared(0x200, 0x230, 6, 900, "gid-1"),
                   m.RollbackPrepared(0x330, 0x360, 7, 8, 901, "gid-2"),
                   m.StreamPrepare(0x400, 0x430, 9, 902, "gid-3")]


def test_protocol_4_stream_abort_carries_the_abort_lsn_and_time_with_parallel_streaming() -> None:
    """With streaming = parallel (protocol 4) Stream Abort has the abort's LSN and time; with
    streaming on it has not, even at protocol 4, and the longer form is then an error."""
    assert decode(V4, w.stream_abort(800, 801, 0x5000, 77)) == [
        m.StreamAbort(800, 801, 0x5000, 77)]
    on = PgoutputOptions(4, streaming="on")
    assert decode(on, w.stream_abort(800, 801)) == [m.StreamAbort(800, 801, None, None)]
    with pytest.raises(ProtocolError, match="16 unexpected bytes after its last field"):
        decode(on, w.stream_abort(800, 801, 0x5000, 77))
    with pytest.raises(ProtocolError, match="message ends inside its abort LSN"):
        decode(V4, w.stream_abort(800, 801))


# -- what the agreed protocol does not allow -----------------------------------------------------
@pytest.mark.parametrize(("options", "payload", "name", "why"), [
    (V1, w.stream_start(1, True), "Stream Start", "protocol version 1 without streaming"),
    (V1, w.stream_stop(), "Stream Stop", "without streaming"),
    (PgoutputOptions(2), w.stream_commit(1, 2, 3, 4), "Stream Commit", "without streaming"),
    (V1, w.stream_abort(1, 1), "Stream Abort", "without streaming"),
    (V2, w.begin_prepare(1, 2, 3, 4, "g"), "Begin Prepare", "without two_phase"),
    (V2, w.prepare(1, 2, 3, 4, "g"), "Prepare", "without two_phase"),
    (V2, w.commit_prepared(1, 2, 3, 4, "g"), "Commit Prepared", "without two_phase"),
    (V2, w.rollback_prepared(1, 2, 3, 4, 5, "g"), "Rollback Prepared", "without two_phase"),
    (PgoutputOptions(3, two_phase=True), w.stream_prepare(1, 2, 3, 4, "g"), "Stream Prepare",
     "without streaming"),
])
def test_messages_of_a_protocol_not_agreed_are_errors(options: PgoutputOptions, payload: bytes,
                                                      name: str, why: str) -> None:
    """A stream or two-phase message the client did not ask for is an error naming it and
    the LSN, never decoded by guessing."""
    with pytest.raises(ProtocolError, match=f"pgoutput {name} at {AT}: not part of the agreed "
                                            f"protocol .*{why}"):
        decode(options, payload)


@pytest.mark.parametrize(("payloads", "problem"), [
    ([w.stream_start(1, True), w.stream_start(2, True)], "Stream Start .*inside a stream"),
    ([w.stream_start(1, True), w.begin(1, 2, 3)], "Begin .*inside a stream"),
    ([w.stream_start(1, True), w.stream_commit(1, 2, 3, 4)], "Stream Commit .*inside a stream"),
    ([w.stream_stop()], "Stream Stop .*no stream block is open"),
    ([w.insert(1, [("t", b"1")], xid=5)], "Insert .*expected the new tuple"),
])
def test_stream_blocks_nest_as_the_protocol_says(payloads: list[bytes], problem: str) -> None:
    """Stream blocks do not nest, transactions and their ends do not start inside one, and a
    change outside a block has no xid (its bytes would be read as something else)."""
    with pytest.raises(ProtocolError, match=problem):
        decode(V3, *payloads)


@pytest.mark.parametrize(("payload", "problem"), [
    (b"Z\x00", "unknown message type 'Z' \\(0x5a\\)"),
    (b"\x01", "unknown message type 0x01"),
    (b"", "empty message"),
    (w.commit(1, 2, 3, flags=1), "Commit at .*: unknown flags 0x1"),
    (w.begin(0, 2, 3), "Begin at .*: its final LSN is not set"),
    (w.begin(1, 2, 0), "Begin at .*: its transaction id is invalid"),
    (w.relation(1, "s", "t", [(True, "a", 23, -1)], identity="x"), "unknown replica identity"),
    (w.relation(1, "s", "t", [(2, "a", 23, -1)]), "unknown flags 0x2 on column 1"),
    (w.insert(1, [("t", b"1")]).replace(b"N", b"X", 1), "expected the new tuple"),
    (w.insert(1, [("t", b"1")]).replace(b"\x00\x01t", b"\x00\x01x"), "unknown kind 'x'"),
    (w.update(1, [("t", b"1")]).replace(b"N", b"Q", 1), "expected the new tuple"),
    (w.delete(1, [("t", b"1")]).replace(b"K", b"N", 1), "expected the old key"),
    (b"T\x00\x00\x00\x01\x04\x00\x00\x00\x01", "unknown options 0x4"),
    (w.truncate([1, 2])[:-4], "2 relations announced, 1 sent"),
    (w.message(1, "p", b"x", transactional=True)[:1] + b"\x03" +
     w.message(1, "p", b"x", transactional=True)[2:], "unknown flags 0x3"),
    (w.stream_start(1, True)[:-1] + b"\x02", "first segment flag is 2"),
    (w.origin(1, "n")[:-1], "no terminating zero byte"),
    (w.begin(1, 2, 3) + b"\0", "1 unexpected bytes after its last field"),
    (w.insert(1, [("t", b"\xff\xfe")]).replace(b"t\x00\x00\x00\x02", b"t\xff\xff\xff\xfe"),
     "column 1 has a negative length"),
    (w.relation(1, "s\xe9", "t", []).replace("s\xe9".encode(), b"s\xe9"), "not valid UTF-8"),
])
def test_damaged_or_unknown_bytes_are_errors_naming_the_lsn(payload: bytes,
                                                            problem: str) -> None:
    """An unknown type, flags, kind or action byte, an unset LSN or xid, counts that the bytes
    do not hold, a string without its end, bytes left over: each an error naming the LSN."""
    with pytest.raises(ProtocolError, match=f"at {AT}: .*{problem}|{problem}") as caught:
        decode(V3, payload)
    assert AT in str(caught.value)


@pytest.mark.parametrize("payload", [
    w.begin(1, 2, 3), w.commit(1, 2, 3), w.origin(5, "node"),
    w.relation(1, "public", "t", [(True, "id", 23, -1), (False, "v", 25, -1)]),
    w.type_message(16500, "public", "mood"), w.insert(1, ROW),
    w.update(1, ROW, old=ROW, old_kind="O"), w.delete(1, ROW), w.truncate([1, 2, 3]),
    w.message(9, "prefix", b"content", transactional=False),
    w.begin_prepare(1, 2, 3, 4, "g"), w.prepare(1, 2, 3, 4, "g"),
    w.commit_prepared(1, 2, 3, 4, "g"), w.rollback_prepared(1, 2, 3, 4, 5, "g"),
    w.stream_commit(1, 2, 3, 4), w.stream_abort(1, 2, 3, 4), w.stream_prepare(1, 2, 3, 4, "g"),
])
def test_every_message_cut_short_is_an_error_naming_the_lsn(payload: bytes) -> None:
    """Each message cut at every byte short of its end raises the protocol error with the
    LSN (never IndexError, struct.error or a message decoded from what was there)."""
    for size in range(len(payload)):
        with pytest.raises(ProtocolError, match=AT):
            decode(V4, payload[:size])


OPTIONS = st.sampled_from([V1, V2, V3, V4, PgoutputOptions(4, streaming="on", messages=True)])


@settings(max_examples=400, deadline=None)
@given(options=OPTIONS, in_stream=st.booleans(),
       payload=st.one_of(st.binary(max_size=64),
                         st.sampled_from(b"BCORYIUDTMSEcAbPKrp").flatmap(
                             lambda tag: st.binary(max_size=48).map(lambda b: bytes([tag]) + b))))
def test_random_bytes_raise_only_the_protocol_error(options: PgoutputOptions, in_stream: bool,
                                                    payload: bytes) -> None:
    """Garbage, and garbage behind every valid message type byte, inside a stream block or
    not: the decoder returns a message or raises ProtocolError, nothing else."""
    decoder = PgoutputDecoder(options)
    decoder.in_stream = in_stream and options.streaming != "off"
    assert_decodes_or_names_the_lsn(decoder, payload)


def assert_decodes_or_names_the_lsn(decoder: PgoutputDecoder | PglogicalDecoder,
                                    payload: bytes) -> None:
    """``payload`` decodes, or raises ProtocolError naming the LSN (anything else fails)."""
    try:
        decoder.decode(LSN, payload)
    except ProtocolError as exc:
        problem = str(exc)
    else:
        return
    assert AT in problem


@st.composite
def tuples(draw: st.DrawFn, binary: bool) -> list[w.Column]:
    kinds = draw(st.lists(st.sampled_from("ntub" if binary else "ntu"), max_size=6))
    return [(kind, draw(st.binary(max_size=12)) if kind in "tb" else None) for kind in kinds]


@settings(max_examples=200, deadline=None)
@given(relation_id=st.integers(1, 2**32 - 1), xid=st.integers(1, 2**32 - 1),
       new=tuples(True), old=tuples(True))
def test_changes_round_trip(relation_id: int, xid: int, new: list[w.Column],
                            old: list[w.Column]) -> None:
    """Random rows in Insert, Update and Delete, inside a stream block, decode back to what
    was built."""
    def data(columns: list[w.Column]) -> m.TupleData:
        return m.TupleData("".join(k for k, _ in columns), tuple(v for _, v in columns))

    decoder = PgoutputDecoder(V3)
    decoder.decode(LSN, w.stream_start(xid, True))
    assert decoder.decode(LSN, w.insert(relation_id, new, xid=xid)) == \
        m.Insert(xid, relation_id, data(new))
    assert decoder.decode(LSN, w.update(relation_id, new, old=old, old_kind="O", xid=xid)) == \
        m.Update(xid, relation_id, "O", data(old), data(new))
    assert decoder.decode(LSN, w.delete(relation_id, old, xid=xid)) == \
        m.Delete(xid, relation_id, "K", data(old))


# -- the options themselves ----------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "problem"), [
    ({"proto_version": 5}, "not one of 1 to 4"),
    ({"proto_version": 1, "streaming": "on"}, "streaming needs .* 2 or later"),
    ({"proto_version": 3, "streaming": "parallel"}, "parallel streaming needs .* 4"),
    ({"proto_version": 2, "two_phase": True}, "two-phase needs .* 3 or later"),
    ({"proto_version": 2, "streaming": "yes"}, "off, on or parallel"),
    ({"proto_version": 4, "origin": "some"}, "any or none"),
])
def test_impossible_option_combinations_are_refused(kwargs: dict[str, object],
                                                    problem: str) -> None:
    """The options are checked when made: a decoder never runs with a combination no server
    would accept."""
    with pytest.raises(ConfigurationError, match=problem):
        PgoutputOptions(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("server", "version"), [(130011, 1), (140010, 2), (150018, 3),
                                                 (160004, 4), (170000, 4)])
def test_the_highest_protocol_version_by_server(server: int, version: int) -> None:
    """1 before 14, 2 on 14, 3 on 15, 4 from 16."""
    assert highest_proto_version(server) == version


def test_options_a_server_cannot_give_are_named() -> None:
    """Protocol 4 or origin on PostgreSQL 15, binary on 13: refused before connecting."""
    assert "version 4 needs PostgreSQL 16" in (PgoutputOptions(4).server_problem(150018) or "")
    assert "origin option needs PostgreSQL 16" in (
        PgoutputOptions(3, origin="none").server_problem(150018) or "")
    assert "binary option needs PostgreSQL 14" in (
        PgoutputOptions(1, binary=True).server_problem(130000) or "")
    assert V3.server_problem(150018) is None


def test_start_options_quote_publication_names() -> None:
    """publication_names is a list of quoted identifiers, so that a name with a comma, a
    quote or capitals reaches pgoutput as it is."""
    assert V4.start_options(["orders", 'Odd "pub", x']) == [
        ("proto_version", "4"), ("publication_names", '"orders","Odd ""pub"", x"'),
        ("streaming", "parallel"), ("two_phase", "on"), ("binary", "on"), ("messages", "on")]
    assert PgoutputOptions(1).start_options(["p"]) == [("proto_version", "1"),
                                                       ("publication_names", '"p"')]


# -- pglogical_output --------------------------------------------------------------------------
STARTUP = [("max_proto_version", "1"), ("min_proto_version", "1"), ("coltypes", "f"),
           ("pg_version_num", "150018"), ("binary.binary_basetypes", "f"),
           ("binary.internal_basetypes", "f"), ("forward_changeset_origins", "t")]


def pgl(*payloads: bytes, startup: list[tuple[str, str]] | None = None,
        ) -> list[m.LogicalMessage]:
    """Decode the Startup message (``STARTUP`` unless given; none for ``[]``), then
    ``payloads``."""
    decoder = PglogicalDecoder()
    first = [] if startup == [] else [w.pgl_startup(startup or STARTUP)]
    return [decoder.decode(LSN, payload) for payload in (*first, *payloads)]


def test_pglogical_startup_and_change_messages() -> None:
    """The Startup message's parameters in order, then Begin, Origin, the relation's
    metadata (names counted with their zero byte, key flags, no types), Insert, Update with
    and without the old key, Delete, Commit; text values lose their zero byte."""
    got = pgl(w.pgl_begin(0x100, 5, 700), w.pgl_origin(0x55, "upstream"),
              w.pgl_relation(16384, "public", "t", [(True, "id"), (False, "v")]),
              w.pgl_insert(16384, [("t", b"1"), ("n", None)]),
              w.pgl_update(16384, [("t", b"1"), ("u", None)]),
              w.pgl_update(16384, [("t", b"2"), ("t", b"x")], old=[("t", b"1"), ("n", None)]),
              w.pgl_delete(16384, [("t", b"2"), ("n", None)]),
              w.pgl_commit(0x100, 0x130, 5))
    assert got[0] == m.Startup(1, tuple(STARTUP))
    assert got[0].get("pg_version_num") == "150018"
    assert got[1:] == [
        m.Begin(0x100, 5, 700), m.Origin(0x55, "upstream"),
        m.Relation(None, 16384, "public", "t", None,
                   (m.RelationColumn(True, "id", None, None),
                    m.RelationColumn(False, "v", None, None))),
        m.Insert(None, 16384, m.TupleData("tn", (b"1", None))),
        m.Update(None, 16384, None, None, m.TupleData("tu", (b"1", None))),
        m.Update(None, 16384, "K", m.TupleData("tn", (b"1", None)),
                 m.TupleData("tt", (b"2", b"x"))),
        m.Delete(None, 16384, "K", m.TupleData("tn", (b"2", None))),
        m.Commit(0x100, 0x130, 5)]


@pytest.mark.parametrize(("payloads", "startup", "problem"), [
    ([w.pgl_begin(1, 2, 3)], [], "Begin at .*: the Startup message must come first"),
    ([w.pgl_startup(STARTUP)], STARTUP, "Startup at .*must come first, and only once"),
    ([], [("max_proto_version", "2"), ("min_proto_version", "1")], "max_proto_version is '2'"),
    ([], [*STARTUP[:2], ("coltypes", "t")], "coltypes is on"),
    ([b"B\x01" + w.pgl_begin(1, 2, 3)[2:]], None, "unknown flags 0x1"),
    ([w.pgl_insert(1, [("b", b"\0\0\0\1")])], None, "kind 'b', not granted by the Startup"),
    ([w.pgl_insert(1, [("i", b"\0\0\0\1")])], None, "kind 'i', not granted by the Startup"),
    ([w.pgl_insert(1, [("x", None)])], None, "kind 'x', unknown"),
    ([w.pgl_insert(1, [("t", b"a")]).replace(b"a\0", b"ab")], None,
     "text does not end with a zero byte"),
    ([w.pgl_relation(1, "s", "t", [(True, "a")]).replace(b"A", b"Q", 1)], None,
     "expected the attributes block"),
    ([w.pgl_relation(1, "s", "t", [])[:6] + b"\x03s\0\0" + w.pgl_relation(1, "s", "t", [])[9:]],
     None, "namespace is not a string of 2 bytes"),
    ([b"X\0"], None, "unknown message type 0x58"),
])
def test_pglogical_errors_name_the_lsn(payloads: list[bytes],
                                       startup: list[tuple[str, str]] | None,
                                       problem: str) -> None:
    """Anything but the Startup message first, a protocol version other than 1, column
    types, reserved flags, a binary value the Startup message did not grant, an unknown
    kind or block, a name whose count is wrong: errors naming the LSN."""
    with pytest.raises(ProtocolError, match=problem) as caught:
        pgl(*payloads, startup=startup)
    assert AT in str(caught.value)


def test_pglogical_binary_values_once_granted() -> None:
    """binary.binary_basetypes = t in the Startup message allows send/receive values."""
    granted = [*STARTUP[:4], ("binary.binary_basetypes", "t")]
    assert pgl(w.pgl_insert(1, [("b", b"\0\0\0\1")]), startup=granted)[1] == \
        m.Insert(None, 1, m.TupleData("b", (b"\0\0\0\1",)))


@settings(max_examples=300, deadline=None)
@given(payload=st.one_of(st.binary(max_size=64), st.sampled_from(b"SBCORIUD").flatmap(
    lambda tag: st.binary(max_size=48).map(lambda b: bytes([tag]) + b))), started=st.booleans())
def test_pglogical_random_bytes_raise_only_the_protocol_error(payload: bytes,
                                                              started: bool) -> None:
    """Before or after the Startup message, garbage is a ProtocolError or a message."""
    decoder = PglogicalDecoder()
    if started:
        decoder.decode(LSN, w.pgl_startup(STARTUP))
    assert_decodes_or_names_the_lsn(decoder, payload)


def test_pglogical_startup_parameters() -> None:
    """The START_REPLICATION options pglogical_output needs: the parameter format, protocol
    1 at both ends, the native format in UTF-8, the replication sets; other nodes'
    transactions; binary asks for the send/receive format of the server's major version,
    spelled as the plugin compares it (PG_VERSION_NUM / 100)."""
    assert startup_parameters(["default", "extra"]) == [
        ("startup_params_format", "1"), ("min_proto_version", "1"), ("max_proto_version", "1"),
        ("proto_format", "native"), ("expected_encoding", "UTF8"),
        ("pglogical.replication_set_names", "default,extra")]
    assert startup_parameters(["default"], binary=True, forward_origins=True,
                              server_version=150018)[-3:] == [
        ("pglogical.forward_origins", "all"), ("binary.want_binary_basetypes", "1"),
        ("binary.basetypes_major_version", "1500")]


def _read_both(data: bytes, binary: bool) -> tuple[object, object]:
    """read_tuple's hot path and the field-by-field reader on the same bytes: each one's
    result and where it left the reader, or its error's words."""
    from receivewal.logical import pgoutput  # noqa: PLC0415 - the two readers compared
    from receivewal.logical.cursor import MessageReader  # noqa: PLC0415

    outcomes: list[object] = []
    for read in (pgoutput.read_tuple, pgoutput._read_tuple_checked):
        reader = MessageReader(data, 0x1234, "pgoutput Insert")
        try:
            outcomes.append((read(reader, binary=binary), reader.tell()[1]))
        except ProtocolError as exc:
            outcomes.append(str(exc))
    return outcomes[0], outcomes[1]


@settings(max_examples=400)
@given(columns=st.lists(st.one_of(
    st.tuples(st.sampled_from("nu"), st.just(b"")),
    st.tuples(st.sampled_from("tb"), st.binary(max_size=12))), max_size=6),
    cut=st.integers(0, 80), noise=st.binary(max_size=4), binary=st.booleans())
def test_a_rows_hot_path_reads_what_the_careful_reader_reads(
        columns: list[tuple[str, bytes | None]], cut: int, noise: bytes, binary: bool) -> None:
    """read_tuple reads a row in one go and falls back to the field-by-field reader for
    anything not exactly right: on whole rows, rows cut short and rows with bytes changed,
    both give the same values and position, or the same error naming the LSN."""
    whole = w.tuple_data(columns)
    for data in (whole, whole[:cut], noise + whole, whole[:2] + noise + whole[2:]):
        fast, careful = _read_both(data, binary)
        assert fast == careful
