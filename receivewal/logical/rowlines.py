"""pgoutput's row changes straight to change log lines: the hot path of a logical stream.

Insert, Update and Delete are nearly every message of a busy stream. :class:`RowLines` reads
such a message and writes its line (format 1, :mod:`receivewal.logical.changelines`) in one go,
without the message dataclasses, the dict and the JSON encoder of the reference path
(:class:`~receivewal.logical.pgoutput.PgoutputDecoder`,
:class:`~receivewal.logical.assembly.Assembler`, :func:`receivewal.logical.changelines.row`). It
takes a message only when it is exactly right: a row of text, binary (when agreed), NULL and
unchanged TOAST values of a relation announced with distinct column names, inside a
transaction (or a stream block), every byte read. Anything else (a malformed or unexpected
message, a relation never announced, text that is not UTF-8, a binary value that is not one of
its type, a column count that is not the relation's) it leaves untouched to the reference
path, which takes it or raises its error
naming the LSN; it changes nothing before it is sure. The line is byte for byte the
reference's (tests/test_logical_rowlines.py compares the two on varied rows): a JSON string
of a UTF-8 value is its bytes in quotes unless a byte needs escaping (``"``, ``\\``, controls),
and json's own escaping is used for a value that has one.
"""

from __future__ import annotations

import base64
import functools
import re
from json.encoder import encode_basestring  # json's own (C): what JSONEncoder uses
from typing import TYPE_CHECKING

from receivewal.logical.binary import binary_to_text
from receivewal.wal.lsn import lsn_halves
from receivewal.wal.nativescan import load_native, pure_python_forced

if TYPE_CHECKING:
    from receivewal.logical.assembly import Assembler
    from receivewal.logical.pgoutput import PgoutputDecoder
    from receivewal.logical.relations import RelationInfo

_INSERT, _UPDATE, _DELETE = b"IUD"
_ROW_CHANGES = frozenset(b"IUD")
_NEW, _KEY, _OLD = b"NKO"
_TEXT, _BINARY, _NULL, _UNCHANGED = b"tbnu"
_ESCAPED = re.compile(rb'[\x00-\x1f"\\]')  # the bytes json escapes (ensure_ascii=False)


def _json(text: str) -> bytes:
    """``text`` as json.dumps(..., ensure_ascii=False) writes it."""
    return str(encode_basestring(text)).encode()


class _Shape:
    """What every line of one relation version repeats, rendered once: the JSON of its
    names, and the pieces of a line whose values are all plain text or NULL (an Insert's, an
    Update's without an old row) around its LSN, xid and values (see
    :func:`python_plain_text_line`)."""

    __slots__ = ("count", "distinct", "insert_table", "key_flags", "keys", "name",
                 "names", "quoted_keys", "table", "type_ids", "update_table")

    def __init__(self, info: RelationInfo) -> None:
        names = [column.name for column in info.columns]
        self.count = len(names)
        self.name = info.name
        self.names = names
        self.distinct = len(set(names)) == len(names)  # else a dict of the row merges two
        self.key_flags = [column.key for column in info.columns]
        self.type_ids = [column.type_id for column in info.columns]
        self.keys = [_json(name) + b":" for name in names]  # '"id":'
        self.table = b',"schema":' + _json(info.schema) + b',"table":' + _json(info.table)
        # '"id":"', ',"v":"', ...: each value follows its key, a quote follows each value
        self.quoted_keys = tuple((b"," if number else b"") + key + b'"'
                                 for number, key in enumerate(self.keys))
        self.insert_table = self.table + b',"new":{'
        self.update_table = self.table + b',"old":null,"new":{'


_INSERT_LEAD, _UPDATE_LEAD = b'{"op":"insert","lsn":"', b'{"op":"update","lsn":"'
_INSERT_TAIL, _UPDATE_TAIL = b"}}\n", b'},"unchanged_toast":[]}\n'


class RowLines:
    """Takes the plain row changes of one pgoutput connection (see the module's docstring)."""

    def __init__(self, decoder: PgoutputDecoder, assembler: Assembler) -> None:
        self.decoder = decoder
        self.assembler = assembler
        self._shapes: dict[int, _Shape] = {}  # by relation version

    def take(self, lsn: int, data: bytes) -> bool:  # noqa: PLR0911, PLR0912 - the hot path
        """Write the line of the row change ``data`` that came at ``lsn``; False (nothing
        done) when it is not one this path takes."""
        tag = data[0]
        if tag not in _ROW_CHANGES:
            return False
        assembler = self.assembler
        stream = assembler.stream
        if self.decoder.in_stream != (stream is not None):
            return False
        if stream is None:
            xid, position, txn = 0, 1, assembler.current
        else:  # a change inside a stream block carries its (sub)transaction's id
            xid, position = int.from_bytes(data[1:5], "big"), 5
            txn = assembler.streams[stream] if xid else None
        if txn is None or len(data) < position + 5:
            return False
        info = assembler.relations.lookup(int.from_bytes(data[position:position + 4], "big"),
                                          stream)
        if info is None:
            return False
        shape = self._shapes.get(info.version)
        if shape is None:
            shape = self._shapes[info.version] = _Shape(info)
        if not shape.distinct:
            return False
        position += 4
        # sure once the rows are read: then the reference's bookkeeping (Assembler.feed)
        written = lsn or assembler.position
        line = None
        if tag == _INSERT and data[position] == _NEW:
            line = plain_text_line(data, position + 1, shape.quoted_keys, _INSERT_LEAD,
                                   written, txn.xid, shape.insert_table, _INSERT_TAIL)
        elif tag == _UPDATE and data[position] == _NEW:
            line = plain_text_line(data, position + 1, shape.quoted_keys, _UPDATE_LEAD,
                                   written, txn.xid, shape.update_table, _UPDATE_TAIL)
        if line is None:
            rows = _rows(tag, data, position, shape, binary=self.decoder.options.binary)
            if rows is None:
                return False
            line = _line(tag, written, txn.xid, shape, rows)
        if lsn:
            assembler.position = lsn
            current = assembler.current
            if current is not None and not current.lsn:
                current.lsn = lsn
        if xid and xid != txn.xid and xid not in txn.subtransactions:
            txn.subtransactions[xid] = txn.buffer.mark()
        if shape.name not in txn.first_versions:
            txn.first_versions[shape.name] = info
        txn.buffer.add(info.version, line)
        return True


def python_plain_text_row(data: bytes, position: int, count: int,
                          ) -> tuple[bytes | None, ...] | None:
    """The values of the TupleData at ``position`` (None: NULL) when it ends the message,
    has ``count`` columns, every one NULL or text of printable ASCII that JSON needs not
    escape; else None."""
    read = _values(data, position, count)
    if read is None or read[2] != len(data) or _UNCHANGED in read[0]:
        return None
    raws = read[1]
    blob = b"".join(raw for raw in raws if raw is not None)
    if not blob.isascii() or _ESCAPED.search(blob):
        return None
    return tuple(raws)


def python_plain_text_line(  # noqa: PLR0917 - the compiled function's arguments
        data: bytes, position: int, keys: tuple[bytes, ...], lead: bytes, lsn: int, xid: int,
        table: bytes, tail: bytes) -> bytes | None:
    """The line of a plain row (:func:`python_plain_text_row` of ``len(keys)`` columns):
    ``lead``, the LSN, ``","xid":``, the xid, ``table``, each key with its value and a
    closing quote (a NULL: the key without its opening quote, then ``null``), ``tail``; None
    when the row is not plain."""
    values = python_plain_text_row(data, position, len(keys))
    if values is None:
        return None
    if None not in values:
        return _line_format(lead, table, keys, tail) % (*lsn_halves(lsn), xid,
                                                        *values)
    members = b"".join(key[:-1] + b"null" if value is None else key + value + b'"'
                       for key, value in zip(keys, values, strict=True))
    return b'%b%X/%X","xid":%d%b%b%b' % (lead, *lsn_halves(lsn), xid, table,
                                          members, tail)


@functools.lru_cache(maxsize=256)
def _line_format(lead: bytes, table: bytes, keys: tuple[bytes, ...], tail: bytes) -> bytes:
    """:func:`python_plain_text_line`'s line as one %-format of the LSN, xid and values."""
    def literal(text: bytes) -> bytes:
        return text.replace(b"%", b"%%")
    return (literal(lead) + b'%X/%X","xid":%d' + literal(table)
            + b"".join(literal(key) + b'%b"' for key in keys) + literal(tail))


# the same function compiled (receivewal/logical/_rows.c), when it is built and not forced off
_native = None if pure_python_forced() else load_native("receivewal.logical._rows")
plain_text_line = python_plain_text_line if _native is None else _native.plain_text_line


Rows = tuple[tuple[bytes, list[str]] | None, tuple[bytes, list[str]] | None]  # old, new


def _rows(tag: int, data: bytes, position: int, shape: _Shape, *, binary: bool,
          ) -> Rows | None:
    """The old and new rows of a row change whose tuples start at ``position``, rendered;
    None if not plain."""
    action = data[position]
    old = None
    if tag != _INSERT and action in (_KEY, _OLD):
        read = _row(data, position + 1, shape, key_only=action == _KEY, old=True,
                    binary=binary)
        if read is None or read[2] >= len(data):
            return None
        old, position = read[:2], read[2]
        action = data[position]
    if tag == _DELETE:
        return (old, None) if old is not None and position == len(data) else None
    if action != _NEW:
        return None
    read = _row(data, position + 1, shape, key_only=False, old=False, binary=binary)
    if read is None or read[2] != len(data):
        return None
    return old, read[:2]


def _line(tag: int, lsn: int, xid: int, shape: _Shape, rows: Rows) -> bytes:
    old, new = rows
    head = b'{"op":"%b","lsn":"%X/%X","xid":%d%b' % (
        b"insert" if tag == _INSERT else b"update" if tag == _UPDATE else b"delete",
        *lsn_halves(lsn), xid, shape.table)
    if tag == _INSERT:
        assert new is not None
        values, unchanged = new
        if unchanged:
            return b'%b,"new":{%b},"unchanged_toast":%b}\n' % (head, values, _names(unchanged))
        return b'%b,"new":{%b}}\n' % (head, values)
    old_json = b"null" if old is None else b"{%b}" % old[0]
    if tag == _DELETE:
        return b'%b,"old":%b}\n' % (head, old_json)
    assert new is not None
    return b'%b,"old":%b,"new":{%b},"unchanged_toast":%b}\n' % (
        head, old_json, new[0], _names(new[1]))


def _names(names: list[str]) -> bytes:
    return b"[" + b",".join(_json(name) for name in names) + b"]"


def _row(data: bytes, position: int, shape: _Shape, *, key_only: bool, old: bool,
         binary: bool) -> tuple[bytes, list[str], int] | None:
    """The ``{...}`` members of the TupleData at ``position``, its unchanged TOAST columns
    and where it ends; None when it is not plain (see the module's docstring)."""
    read = _values(data, position, shape.count, binary=binary)
    if read is None:
        return None
    kinds, raws, position = read
    rendered = _render(shape, kinds, raws, key_only=key_only, old=old)
    return None if rendered is None else (*rendered, position)


def _binary(type_id: int | None, raw: bytes) -> bytes | None:
    """A binary value's JSON as records.py writes it: its text where binary.py converts the
    type, else ``{"binary_b64": ...}``; None when it is not a valid value of its type (the
    reference path raises the error)."""
    try:
        text = None if type_id is None else binary_to_text(type_id, raw)
    except ValueError:
        return None
    if text is None:
        return b'{"binary_b64":"%b"}' % base64.b64encode(raw)
    return _json(text)


def _values(data: bytes, position: int, count: int, *, binary: bool = False,
            ) -> tuple[bytearray, list[bytes | None], int] | None:
    """A TupleData's kinds, values (None: NULL, unchanged) and end, when it has ``count``
    columns of text (or binary, when ``binary`` was agreed), NULL or unchanged TOAST all
    there; else None."""
    end = len(data)
    if position + 2 > end or int.from_bytes(data[position:position + 2], "big") != count:
        return None
    position += 2
    kinds = bytearray()
    raws: list[bytes | None] = []
    for _ in range(count):
        if position >= end:
            return None
        kind = data[position]
        if kind == _TEXT or (kind == _BINARY and binary):
            length = int.from_bytes(data[position + 1:position + 5], "big", signed=True)
            position += 5
            if position > end or length < 0 or position + length > end:
                return None
            raws.append(data[position:position + length])
            position += length
        elif kind in (_NULL, _UNCHANGED):
            raws.append(None)
            position += 1
        else:
            return None
        kinds.append(kind)
    return kinds, raws, position


def _render(shape: _Shape, kinds: bytearray, raws: list[bytes | None], *, key_only: bool,
            old: bool) -> tuple[bytes, list[str]] | None:
    """A row's members and unchanged TOAST columns, value by value (records.row's rules)."""
    members: list[bytes] = []
    unchanged: list[str] = []
    for number, (kind, raw) in enumerate(zip(kinds, raws, strict=True)):
        if key_only and not shape.key_flags[number]:
            continue
        if kind == _UNCHANGED:
            if old:
                return None
            unchanged.append(shape.names[number])
        elif raw is None:
            members.append(shape.keys[number] + b"null")
        elif kind == _BINARY:
            value = _binary(shape.type_ids[number], raw)
            if value is None:
                return None
            members.append(shape.keys[number] + value)
        elif raw.isascii() and not _ESCAPED.search(raw):
            members.append(b'%b"%b"' % (shape.keys[number], raw))
        else:
            try:
                text = raw.decode()
            except UnicodeDecodeError:
                return None
            members.append(shape.keys[number] + _json(text))
    return b",".join(members), unchanged
