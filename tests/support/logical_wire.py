"""Logical replication messages built by hand from the documented layouts, for the tests.

pgoutput's (PostgreSQL's "Logical Replication Message Formats", protocol versions 1 to 4)
and pglogical_output's native protocol (pglogical's doc/protocol.txt and its
pglogical_proto_native.c). PostgreSQL 15 cannot send protocol 4, so its messages are tested
with these bytes; so are damaged messages. Big-endian integers, C strings ending in a zero
byte. ``xid`` is given for a message sent inside a stream block.
"""

from __future__ import annotations

import struct


def _s(text: str) -> bytes:
    return text.encode() + b"\0"


def _xid(xid: int | None) -> bytes:
    return b"" if xid is None else struct.pack(">I", xid)


# -- TupleData ----------------------------------------------------------------------------------
Column = tuple[str, bytes | None]  # kind and bytes: ("t", b"1"), ("n", None), ("u", None)


def tuple_data(columns: list[Column]) -> bytes:
    out = struct.pack(">H", len(columns))
    for kind, value in columns:
        out += kind.encode()
        if kind in "tb":
            assert value is not None
            out += struct.pack(">i", len(value)) + value
    return out


# -- pgoutput -----------------------------------------------------------------------------------
def begin(final_lsn: int, commit_time: int, xid: int) -> bytes:
    return b"B" + struct.pack(">Qqi", final_lsn, commit_time, xid)


def commit(commit_lsn: int, end_lsn: int, commit_time: int, flags: int = 0) -> bytes:
    return b"C" + struct.pack(">BQQq", flags, commit_lsn, end_lsn, commit_time)


def origin(origin_lsn: int, name: str) -> bytes:
    return b"O" + struct.pack(">Q", origin_lsn) + _s(name)


def relation(relation_id: int, namespace: str, name: str,
             columns: list[tuple[bool | int, str, int, int]], *, identity: str = "d",
             xid: int | None = None) -> bytes:
    """columns: (key, or the flags byte; name, type OID, type modifier)."""
    out = b"R" + _xid(xid) + struct.pack(">I", relation_id) + _s(namespace) + _s(name)
    out += identity.encode() + struct.pack(">H", len(columns))
    for key, column, type_id, modifier in columns:
        out += struct.pack(">B", int(key)) + _s(column) + struct.pack(">Ii", type_id, modifier)
    return out


def type_message(type_id: int, namespace: str, name: str, *, xid: int | None = None) -> bytes:
    return b"Y" + _xid(xid) + struct.pack(">I", type_id) + _s(namespace) + _s(name)


def insert(relation_id: int, new: list[Column], *, xid: int | None = None) -> bytes:
    return b"I" + _xid(xid) + struct.pack(">I", relation_id) + b"N" + tuple_data(new)


def update(relation_id: int, new: list[Column], *, old: list[Column] | None = None,
           old_kind: str = "K", xid: int | None = None) -> bytes:
    out = b"U" + _xid(xid) + struct.pack(">I", relation_id)
    if old is not None:
        out += old_kind.encode() + tuple_data(old)
    return out + b"N" + tuple_data(new)


def delete(relation_id: int, old: list[Column], *, old_kind: str = "K",
           xid: int | None = None) -> bytes:
    return b"D" + _xid(xid) + struct.pack(">I", relation_id) + old_kind.encode() + \
        tuple_data(old)


def truncate(relation_ids: list[int], *, cascade: bool = False, restart_identity: bool = False,
             xid: int | None = None) -> bytes:
    flags = int(cascade) | int(restart_identity) << 1
    return b"T" + _xid(xid) + struct.pack(">IB", len(relation_ids), flags) + \
        b"".join(struct.pack(">I", r) for r in relation_ids)


def message(lsn: int, prefix: str, content: bytes, *, transactional: bool,
            xid: int | None = None) -> bytes:
    return b"M" + _xid(xid) + struct.pack(">BQ", int(transactional), lsn) + _s(prefix) + \
        struct.pack(">I", len(content)) + content


def stream_start(xid: int, first: bool) -> bytes:
    return b"S" + struct.pack(">IB", xid, int(first))


def stream_stop() -> bytes:
    return b"E"


def stream_commit(xid: int, commit_lsn: int, end_lsn: int, commit_time: int) -> bytes:
    return b"c" + struct.pack(">IBQQq", xid, 0, commit_lsn, end_lsn, commit_time)


def stream_abort(xid: int, subxid: int, abort_lsn: int | None = None,
                 abort_time: int | None = None) -> bytes:
    out = b"A" + struct.pack(">II", xid, subxid)
    if abort_lsn is not None:
        assert abort_time is not None
        out += struct.pack(">Qq", abort_lsn, abort_time)
    return out


def begin_prepare(prepare_lsn: int, end_lsn: int, prepare_time: int, xid: int,
                  gid: str) -> bytes:
    return b"b" + struct.pack(">QQqI", prepare_lsn, end_lsn, prepare_time, xid) + _s(gid)


def prepare(prepare_lsn: int, end_lsn: int, prepare_time: int, xid: int, gid: str, *,
            tag: bytes = b"P") -> bytes:
    return tag + struct.pack(">BQQqI", 0, prepare_lsn, end_lsn, prepare_time, xid) + _s(gid)


def stream_prepare(prepare_lsn: int, end_lsn: int, prepare_time: int, xid: int,
                   gid: str) -> bytes:
    return prepare(prepare_lsn, end_lsn, prepare_time, xid, gid, tag=b"p")


def commit_prepared(commit_lsn: int, end_lsn: int, commit_time: int, xid: int,
                    gid: str) -> bytes:
    return b"K" + struct.pack(">BQQqI", 0, commit_lsn, end_lsn, commit_time, xid) + _s(gid)


def rollback_prepared(  # noqa: PLR0917 - the message's fields, in the protocol's order
        prepare_end_lsn: int, rollback_end_lsn: int, prepare_time: int, rollback_time: int,
        xid: int, gid: str) -> bytes:
    return b"r" + struct.pack(">BQQqqI", 0, prepare_end_lsn, rollback_end_lsn, prepare_time,
                              rollback_time, xid) + _s(gid)


# -- pglogical_output (native protocol 1) -------------------------------------------------------
def pgl_startup(parameters: list[tuple[str, str]], version: int = 1) -> bytes:
    return b"S" + bytes([version]) + b"".join(_s(k) + _s(v) for k, v in parameters)


def pgl_begin(final_lsn: int, commit_time: int, xid: int) -> bytes:
    return b"B\0" + struct.pack(">QqI", final_lsn, commit_time, xid)


def pgl_commit(commit_lsn: int, end_lsn: int, commit_time: int) -> bytes:
    return b"C\0" + struct.pack(">QQq", commit_lsn, end_lsn, commit_time)


def pgl_origin(origin_lsn: int, name: str) -> bytes:
    return b"O\0" + struct.pack(">QB", origin_lsn, len(name) + 1) + _s(name)


def pgl_relation(relation_id: int, namespace: str, name: str,
                 columns: list[tuple[bool, str]]) -> bytes:
    out = b"R\0" + struct.pack(">I", relation_id)
    out += bytes([len(namespace) + 1]) + _s(namespace) + bytes([len(name) + 1]) + _s(name)
    out += b"A" + struct.pack(">H", len(columns))
    for key, column in columns:
        out += b"C" + bytes([int(key)]) + b"N" + struct.pack(">H", len(column) + 1) + _s(column)
    return out


def pgl_tuple(columns: list[Column]) -> bytes:
    out = b"T" + struct.pack(">H", len(columns))
    for kind, value in columns:
        out += kind.encode()
        if kind == "t":
            assert value is not None
            out += struct.pack(">i", len(value) + 1) + value + b"\0"
        elif kind in "bi":
            assert value is not None
            out += struct.pack(">i", len(value)) + value
    return out


def pgl_insert(relation_id: int, new: list[Column]) -> bytes:
    return b"I\0" + struct.pack(">I", relation_id) + b"N" + pgl_tuple(new)


def pgl_update(relation_id: int, new: list[Column], old: list[Column] | None = None) -> bytes:
    out = b"U\0" + struct.pack(">I", relation_id)
    if old is not None:
        out += b"K" + pgl_tuple(old)
    return out + b"N" + pgl_tuple(new)


def pgl_delete(relation_id: int, old: list[Column]) -> bytes:
    return b"D\0" + struct.pack(">I", relation_id) + b"K" + pgl_tuple(old)
