"""The row changes' fast path (logical/rowlines.py) writes exactly the reference's bytes: the
same messages through a consumer with it and one without it (the decoder, the assembler and
records.py alone) give identical change log files, on varied rows (quotes, backslashes,
controls, unicode, NULLs, unchanged TOAST, old keys and rows, binary values, odd column
names), streamed transactions with subtransactions aborted and two-phase ones; and a message
it does not take (malformed, not UTF-8, a relation never announced) fails with the
reference's error, naming the LSN. Each test runs with the compiled line of a plain row
(receivewal/logical/_rows.c) and with its pure-Python twin, which give the same answers on
random bytes. No server."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import logical_wire as w
from support.changelog import Message, open_store

from receivewal.errors import ProtocolError
from receivewal.logical import rowlines
from receivewal.logical.consumer import ChangeLogConsumer, PluginSettings
from receivewal.logical.pgoutput import PgoutputOptions
from receivewal.wal.nativescan import load_native

T0 = 849_000_000_000_000
INT4, TEXT, BYTEA, FLOAT8, UUID, UNKNOWN = 23, 25, 17, 701, 2950, 99999
REL = 16384
COLUMNS: list[tuple[bool | int, str, int, int]] = [
    (True, "id", INT4, -1), (False, 'na"me\\', TEXT, -1), (False, "bödy%s", TEXT, -1),
    (True, "k", TEXT, -1)]
PLAIN = w.relation(REL, "public", "items", COLUMNS)
ODD = w.relation(REL + 1, 'sch"ema', "t\u00e4ble\n",
                 [(True, "a", INT4, -1), (False, "a", TEXT, -1)])
BIN = w.relation(REL + 2, "public", "bin", [(True, "id", INT4, -1), (False, "b", BYTEA, -1)])
VALUES = [b"1", b"plain", b'say "hi"', b"back\\slash", b"tab\tnew\nline\x01\x1f", b"%s %b %%",
          "caf\u00e9 \u2028 \U0001f600".encode(), b"\x7f", b""]
TYPED = w.relation(REL + 4, "public", "typed", [
    (True, "id", INT4, -1), (False, "t", TEXT, -1), (False, "f", FLOAT8, -1),
    (False, "u", UUID, -1), (False, "x", UNKNOWN, -1)])
EVERYTHING = PgoutputOptions(4, streaming="parallel", two_phase=True, binary=True,
                             messages=True)


@pytest.fixture(params=["c", "python"])
def row_reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The line of a plain row the fast path uses: compiled (skipped only where
    receivewal.logical._rows is not built) or pure Python."""
    if request.param == "c":
        native = load_native("receivewal.logical._rows")
        if native is None:
            pytest.skip("the C extension receivewal.logical._rows is not built here")
        monkeypatch.setattr(rowlines, "plain_text_line", native.plain_text_line)
    else:
        monkeypatch.setattr(rowlines, "plain_text_line", rowlines.python_plain_text_line)
    return str(request.param)


def write(directory: Path, messages: list[Message], options: PgoutputOptions, *,
          fast: bool) -> tuple[bytes, str | None]:
    """The change log's bytes after ``messages`` (and the error they raised, if any)."""
    directory.mkdir()
    store = open_store(directory)
    consumer = ChangeLogConsumer(store, PluginSettings("pgoutput", options))
    assert consumer.rows is not None
    if not fast:
        consumer.rows = None
    error = None
    try:
        for lsn, payload in messages:
            consumer.receive(lsn, payload)
    except ProtocolError as exc:
        error = str(exc)
    consumer.flush()
    consumer.close()
    store.close()
    return b"".join(path.read_bytes() for path in sorted(directory.iterdir())
                    if path.is_file()), error


def same_both_ways(tmp: Path, messages: list[Message],
                   options: PgoutputOptions = EVERYTHING) -> tuple[bytes, str | None]:
    fast = write(tmp / "fast", messages, options, fast=True)
    reference = write(tmp / "reference", messages, options, fast=False)
    assert fast == reference
    return fast


def txn(xid: int, commit_lsn: int, *changes: bytes, zero: bool = False) -> list[Message]:
    """Begin, changes (at the next LSNs; at 0/0 every other one with ``zero``), Commit."""
    lsn = commit_lsn - 0x1000
    out = [(lsn, w.begin(commit_lsn, T0, xid))]
    out += [(0 if zero and i % 2 else lsn + 8 * (i + 1), change)
            for i, change in enumerate(changes)]
    return [*out, (commit_lsn + 0x30, w.commit(commit_lsn, commit_lsn + 0x30, T0))]


def row(*values: bytes | str | None) -> list[w.Column]:
    """Columns: bytes as text, None as NULL, "u" as unchanged TOAST."""
    return [("n", None) if v is None else ("u", None) if v == "u" else
            ("t", v) for v in values]  # type: ignore[misc]


@pytest.mark.usefixtures("row_reader")
def test_varied_rows_give_the_reference_bytes(tmp_path: Path) -> None:
    """Inserts, updates (old key, old row, none; unchanged TOAST), deletes of every value in
    VALUES, in relations whose names need escaping (and one whose two columns share a name),
    with changes at 0/0 in between: the same file, byte for byte."""
    changes = [PLAIN, ODD]
    for i, value in enumerate(VALUES):
        changes += [
            w.insert(REL, row(str(i).encode(), value, None, value)),
            w.insert(REL, row(str(i).encode(), "u", value, b"k")),
            w.update(REL, row(b"2", value, "u", b"k"), old=row(b"1", None, None, value)),
            w.update(REL, row(b"2", value, value, b"k"), old=row(b"1", value, b"x", b"k"),
                     old_kind="O"),
            w.update(REL, row(b"3", None, None, value)),
            w.update(REL, row(b"4", value, value, value)),
            w.update(REL + 1, row(b"4", value)),
            w.update(REL, row(b"3", "u", "u", value), old=row(b"3", "u", b"\xff", value)),
            w.delete(REL, row(str(i).encode(), None, None, value)),
            w.delete(REL, row(str(i).encode(), value, None, value), old_kind="O"),
            w.insert(REL + 1, row(b"1", value)),
        ]
    data, error = same_both_ways(tmp_path, txn(700, 0x100000, *changes, zero=True))
    assert error is None
    assert data.count(b'"op":"insert"') == 3 * len(VALUES)
    assert '"b\u00f6dy%s":"caf\u00e9 \u2028 \U0001f600"'.encode() in data
    assert b'"na\\"me\\\\":"tab\\tnew\\nline\\u0001\\u001f"' in data


@pytest.mark.usefixtures("row_reader")
def test_binary_values_streams_and_two_phase_give_the_reference_bytes(tmp_path: Path) -> None:
    """Binary values (left to the reference), two streamed transactions interleaved with
    changes of subtransactions, one of them aborted, a relation announced inside a stream, a
    two-phase transaction prepared and committed: the same file, byte for byte."""
    messages: list[Message] = [
        *txn(700, 0x10000, PLAIN, BIN, w.insert(REL + 2, [("t", b"1"), ("b", b"\x00\x01")]),
             w.insert(REL, row(b"1", b"a", b"b", b"c"))),
        (0x20000, w.stream_start(800, True)),
        (0x20008, w.relation(REL + 3, "public", "s", [(True, "id", INT4, -1)], xid=800)),
        (0x20010, w.insert(REL + 3, row(b"1"), xid=800)),
        (0x20018, w.insert(REL, row(b"2", b'"q"', None, b"k"), xid=801)),
        (0x20020, w.stream_stop()),
        (0x20028, w.stream_start(900, True)),
        (0x20030, w.insert(REL, row(b"9", b"x", b"y", b"z"), xid=900)),
        (0x20038, w.stream_stop()),
        (0x20040, w.stream_start(800, False)),
        (0x20048, w.update(REL, row(b"2", "u", b"\xc3\xa9", b"k"), xid=802)),
        (0x20050, w.delete(REL, row(b"2", None, None, b"k"), xid=800)),
        (0x20058, w.stream_stop()),
        (0x20060, w.stream_abort(800, 802, 0x20060, T0)),
        (0x20068, w.stream_commit(800, 0x20070, 0x20078, T0)),
        (0x20080, w.stream_abort(900, 900, 0x20080, T0)),
        (0x30000, w.begin_prepare(0x30100, 0x30130, T0, 1000, "g1")),
        (0x30008, w.insert(REL, row(b"5", b"p", None, b"k"))),
        (0x30100, w.prepare(0x30100, 0x30130, T0, 1000, "g1")),
        (0x30200, w.commit_prepared(0x30200, 0x30230, T0, 1000, "g1")),
    ]
    data, error = same_both_ways(tmp_path, messages)
    assert error is None
    assert b'"op":"prepare"' in data
    assert b'"xid":800' in data
    assert b'"id":"9"' not in data  # the aborted stream
    assert "\u00e9".encode() not in data  # the aborted subtransaction's update


@pytest.mark.usefixtures("row_reader")
@pytest.mark.parametrize(("name", "bad"), [
    ("not UTF-8", w.insert(REL, row(b"1", b"\xff", None, b"k"))),
    ("fewer columns", w.insert(REL, row(b"1", b"a", None))),
    ("never announced", w.insert(REL + 9, row(b"1", b"a", None, b"k"))),
    ("truncated", w.insert(REL, row(b"1", b"a", None, b"k"))[:-1]),
    ("bytes left over", w.delete(REL, row(b"1", None, None, b"k")) + b"\0"),
    ("unchanged in an old row", w.update(REL, row(b"1", b"a", None, b"k"),
                                         old=row(b"1", "u", None, b"k"), old_kind="O")),
    ("binary not agreed", w.insert(REL, [("t", b"1"), ("b", b"a"), ("n", None), ("n", None)])),
    ("no new tuple", w.update(REL, row(b"1", b"a", None, b"k"))[:5] + b"X"),
])
def test_a_bad_row_change_fails_as_the_reference_fails(tmp_path: Path, name: str,
                                                       bad: bytes) -> None:
    """A row change the fast path must not take: the reference's error, naming its LSN;
    the transaction before it written, its own never."""
    good = txn(700, 0x10000, PLAIN, w.insert(REL, row(b"1", b"a", None, b"k")))
    messages = [*good, *txn(701, 0x20000, w.insert(REL, row(b"2", b"b", None, b"k")), bad)]
    data, error = same_both_ways(tmp_path, messages, PgoutputOptions(1))
    assert error is not None
    assert "at 0/1F010: " in error, (name, error)
    assert b'"xid":700' in data
    assert b'"xid":701' not in data


_text = st.binary(max_size=12) | st.text(max_size=6).map(str.encode)
_value = st.none() | st.just("u") | _text


Change = tuple[str, list[bytes | str | None]]


@pytest.mark.usefixtures("row_reader")
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.sampled_from("IUOD"), st.lists(_value, min_size=4,
                                                                  max_size=4)), max_size=6))
def test_random_rows_give_the_reference_bytes_or_its_error(
        tmp_path_factory: pytest.TempPathFactory, rows: list[Change]) -> None:
    """Random values (random bytes: often not UTF-8) in random row changes: the fast path
    writes what the reference writes, or fails where and as it fails."""
    changes = [PLAIN]
    for kind, values in rows:
        columns = row(*values)
        if kind == "I":
            changes.append(w.insert(REL, columns))
        elif kind == "D":
            changes.append(w.delete(REL, columns, old_kind="O"))
        else:
            changes.append(w.update(REL, columns, old=columns, old_kind="K" if kind == "U"
                                    else "O"))
    same_both_ways(tmp_path_factory.mktemp("rows"), txn(700, 0x10000, *changes))


_row_bytes = st.lists(st.tuples(st.sampled_from(b"tnub"), st.binary(max_size=6)), max_size=4)


@settings(max_examples=300, deadline=None)
@given(columns=_row_bytes, prefix=st.binary(max_size=3), cut=st.integers(0, 3),
       extra=st.integers(-1, 1), printable=st.booleans())
def test_the_compiled_line_is_pythons(
        *, columns: list[tuple[int, bytes]], prefix: bytes, cut: int, extra: int,
        printable: bool) -> None:
    """plain_text_line of C and of Python on TupleData built at random (any kind, any bytes,
    printable ones and well-formed NULLs often, the message cut short, a column count off by
    one, keys and pieces with % in them, every position): equal."""
    native = load_native("receivewal.logical._rows")
    if native is None:
        pytest.skip("the C extension receivewal.logical._rows is not built here")
    body = len(columns).to_bytes(2, "big")
    for kind, raw in columns:
        value = bytes(0x20 + b % 0x60 for b in raw) if printable else raw
        body += bytes([kind])
        if kind in b"tb" or not printable:  # else NULL and unchanged TOAST, as sent
            body += len(value).to_bytes(4, "big") + value
    data = prefix + body
    data = data[:len(data) - cut] if cut else data
    keys = tuple(b'%s"k%d":"' % (b"," if i else b"", i) for i in range(len(columns) + extra))
    lsn, xid = (1 << 64) - 1 - len(data), (1 << 32) - 1 - cut
    for position in range(len(data) + 2):
        arguments = (data, position, keys, b'{"op":"%d","lsn":"', lsn, xid, b',"t%":{', b"}}\n")
        assert native.plain_text_line(*arguments) == \
            rowlines.python_plain_text_line(*arguments), arguments


@pytest.mark.usefixtures("row_reader")
@pytest.mark.parametrize("bad", [False, True])
def test_binary_rows_give_the_reference_bytes_or_its_error(tmp_path: Path, bad: bool) -> None:
    """Binary values of converted types (int4, text with quotes and unicode, float8, uuid)
    and of a type not converted ({"binary_b64": ...}), in inserts, updates with an old row and
    deletes; with ``bad``, an int4 of 3 bytes: the reference's bytes, or its error at the
    same LSN with the transaction before it written."""
    def b(*values: bytes | str | None) -> list[w.Column]:
        return [("n", None) if v is None else ("u", None) if v == "u" else
                ("b", v) for v in values]  # type: ignore[misc]
    uuid = bytes(range(16))
    changes = [TYPED,
               w.insert(REL + 4, b(b"\0\0\0\1", 'q"\\ \u00e9\n'.encode(),
                                   b"\x3f\xf0\0\0\0\0\0\0", uuid, b"\xff\x00")),
               w.insert(REL + 4, b(b"\0\0\0\2", None, None, None, None)),
               w.update(REL + 4, b(b"\0\0\0\2", b"x", "u", uuid, b""),
                        old=b(b"\0\0\0\2", None, None, None, b"\x01"), old_kind="O"),
               w.delete(REL + 4, b(b"\0\0\0\1", None, None, None, None))]
    if bad:
        changes.append(w.insert(REL + 4, b(b"\0\0\1", None, None, None, None)))
    messages = [*txn(700, 0x10000, PLAIN, w.insert(REL, row(b"1", b"a", None, b"k"))),
                *txn(701, 0x20000, *changes)]
    data, error = same_both_ways(tmp_path, messages, PgoutputOptions(2, binary=True))
    assert b'"binary_b64":"/wA="' in data or bad
    assert (error is not None) == bad
    assert (b'"xid":701' in data) != bad
