"""The change log's lines, format 1 (pure): one JSON object per line, as docs/changelog.md
describes them.

Every line has ``op``; LSNs are written as PostgreSQL prints them (``"0/16B3748"``), times
as ISO 8601 in UTC with microseconds, column values as PostgreSQL's text output (NULL as null;
binary values of the common types converted by :mod:`receivewal.logical.binary`, others kept
as ``{"binary_b64": ...}``, pglogical's internal format as ``{"internal_b64": ...}``). A value
or a row that cannot be what the server meant (a row with fewer or more columns than its
relation, text that is not UTF-8, a binary value of the wrong size) is a ProtocolError naming
the LSN it came at.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from receivewal.errors import ProtocolError
from receivewal.logical import outputmessages as m
from receivewal.logical.binary import binary_to_text
from receivewal.logical.pgtime import iso_utc
from receivewal.logical.relations import RelationInfo
from receivewal.wal.lsn import format_lsn, parse_lsn

FORMAT = 1
Value = str | dict[str, str] | None
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)


def encode(record: dict[str, Any]) -> bytes:
    """One line: the JSON object and a newline, in UTF-8."""
    return (_ENCODER.encode(record) + "\n").encode()


def header(extra: dict[str, Any]) -> bytes:
    """The first line of every file: the format and what the receiver was asked for."""
    return encode({"op": "header", "format": FORMAT, **extra})


def relation(info: RelationInfo) -> bytes:
    return encode({"op": "relation", "lsn": format_lsn(info.lsn), "schema": info.schema,
                   "table": info.table,
                   "columns": [{"name": column.name, "type": column.type, "key": column.key}
                               for column in info.columns]})


def relation_shape(info: RelationInfo) -> bytes:
    """What a relation line says of ``info``, apart from its LSN (equal shapes: one line)."""
    return encode({"schema": info.schema, "table": info.table,
                   "columns": [{"name": column.name, "type": column.type, "key": column.key}
                               for column in info.columns]})


def recorded_shape(record: dict[str, Any]) -> bytes:
    """:func:`relation_shape` of a relation line read back."""
    return encode({"schema": record["schema"], "table": record["table"],
                   "columns": record["columns"]})


_RUN_ENDS = {"commit": "end_lsn", "prepare": "end_lsn", "commit_prepared": "end_lsn",
             "rollback_prepared": "rollback_end_lsn"}
_RUN_STARTS = ("begin", "begin_prepare")


def run_end(record: dict[str, Any]) -> int | None:
    """Where the run that ``record`` ends ends in the WAL (what a resumed stream is compared
    with), None when it ends no run: a commit's or a prepare's end LSN, a rollback's, a
    non-transactional message's LSN plus one, a gap's LSN (where the slot had been confirmed
    to)."""
    op = record.get("op")
    if op in _RUN_ENDS:
        return parse_lsn(record[_RUN_ENDS[op]])
    if op == "message" and record.get("transactional") is False:
        return parse_lsn(record["lsn"]) + 1
    if op == "gap":
        return parse_lsn(record["lsn"])
    return None


def starts_run(record: dict[str, Any]) -> bool:
    """Whether ``record`` opens a run that a later line ends (begin, begin_prepare)."""
    return record.get("op") in _RUN_STARTS


def gap(lsn: int, from_lsn: int, slot: str, recorded_at: str) -> bytes:
    """A gap accepted with --accept-gap: what committed after ``from_lsn`` (where the log
    ended) and up to ``lsn`` (where the slot had been confirmed to) is not in the log."""
    return encode({"op": "gap", "lsn": format_lsn(lsn), "from_lsn": format_lsn(from_lsn),
                   "slot": slot, "recorded_at": recorded_at})


def begin(lsn: int, xid: int, commit_lsn: int, commit_time: int) -> bytes:
    return encode({"op": "begin", "lsn": format_lsn(lsn), "xid": xid,
                   "commit_lsn": format_lsn(commit_lsn), "commit_time": iso_utc(commit_time)})


def commit(lsn: int, xid: int, commit_lsn: int, end_lsn: int, commit_time: int) -> bytes:
    return encode({"op": "commit", "lsn": format_lsn(lsn), "xid": xid,
                   "commit_lsn": format_lsn(commit_lsn), "end_lsn": format_lsn(end_lsn),
                   "commit_time": iso_utc(commit_time)})


def origin(lsn: int, xid: int, message: m.Origin) -> bytes:
    return encode({"op": "origin", "lsn": format_lsn(lsn), "xid": xid, "name": message.name,
                   "origin_lsn": format_lsn(message.origin_lsn)})


def begin_prepare(lsn: int, xid: int, gid: str, *, prepare_lsn: int, end_lsn: int,
                  prepare_time: int) -> bytes:
    return encode({"op": "begin_prepare", "lsn": format_lsn(lsn), "xid": xid, "gid": gid,
                   "prepare_lsn": format_lsn(prepare_lsn), "end_lsn": format_lsn(end_lsn),
                   "prepare_time": iso_utc(prepare_time)})


def prepare(lsn: int, message: m.Prepare | m.StreamPrepare) -> bytes:
    return encode({"op": "prepare", "lsn": format_lsn(lsn), "xid": message.xid,
                   "gid": message.gid, "prepare_lsn": format_lsn(message.prepare_lsn),
                   "end_lsn": format_lsn(message.end_lsn),
                   "prepare_time": iso_utc(message.prepare_time)})


def commit_prepared(lsn: int, message: m.CommitPrepared) -> bytes:
    return encode({"op": "commit_prepared", "lsn": format_lsn(lsn), "xid": message.xid,
                   "gid": message.gid, "commit_lsn": format_lsn(message.commit_lsn),
                   "end_lsn": format_lsn(message.end_lsn),
                   "commit_time": iso_utc(message.commit_time)})


def rollback_prepared(lsn: int, message: m.RollbackPrepared) -> bytes:
    return encode({"op": "rollback_prepared", "lsn": format_lsn(lsn), "xid": message.xid,
                   "gid": message.gid, "prepare_end_lsn": format_lsn(message.prepare_end_lsn),
                   "rollback_end_lsn": format_lsn(message.rollback_end_lsn),
                   "prepare_time": iso_utc(message.prepare_time),
                   "rollback_time": iso_utc(message.rollback_time)})


def message(lsn: int, xid: int | None, decoded: m.Message) -> bytes:
    return encode({"op": "message", "lsn": format_lsn(lsn), "xid": xid,
                   "transactional": decoded.transactional, "prefix": decoded.prefix,
                   "content_b64": base64.b64encode(decoded.content).decode()})


def insert(lsn: int, xid: int, info: RelationInfo, change: m.Insert) -> bytes:
    new, unchanged = row(lsn, info, change.new, key_only=False)
    record: dict[str, Any] = {"op": "insert", "lsn": format_lsn(lsn), "xid": xid,
                              "schema": info.schema, "table": info.table, "new": new}
    if unchanged:
        record["unchanged_toast"] = unchanged
    return encode(record)


def update(lsn: int, xid: int, info: RelationInfo, change: m.Update) -> bytes:
    old = None
    if change.old is not None:
        old, _ = row(lsn, info, change.old, key_only=change.old_kind == "K", old=True)
    new, unchanged = row(lsn, info, change.new, key_only=False)
    return encode({"op": "update", "lsn": format_lsn(lsn), "xid": xid, "schema": info.schema,
                   "table": info.table, "old": old, "new": new, "unchanged_toast": unchanged})


def delete(lsn: int, xid: int, info: RelationInfo, change: m.Delete) -> bytes:
    old, _ = row(lsn, info, change.old, key_only=change.old_kind == "K", old=True)
    return encode({"op": "delete", "lsn": format_lsn(lsn), "xid": xid, "schema": info.schema,
                   "table": info.table, "old": old})


def truncate(lsn: int, xid: int, tables: list[RelationInfo], change: m.Truncate) -> bytes:
    return encode({"op": "truncate", "lsn": format_lsn(lsn), "xid": xid,
                   "tables": [[info.schema, info.table] for info in tables],
                   "cascade": change.cascade, "restart_identity": change.restart_identity})


def row(lsn: int, info: RelationInfo, data: m.TupleData, *, key_only: bool, old: bool = False,
        ) -> tuple[dict[str, Value], list[str]]:
    """A row as ``{column: value}`` and the names of its unchanged TOAST columns (left out of
    the object). A key (``K``) row keeps the replica identity's columns only: the others are
    placeholders."""
    columns = info.columns
    if len(data.kinds) != len(columns):
        raise _error(lsn, f"a row of {info.schema}.{info.table} has {len(data.kinds)} columns, "
                          f"its relation {len(columns)}")
    values: dict[str, Value] = {}
    unchanged: list[str] = []
    for column, kind, raw in zip(columns, data.kinds, data.values, strict=True):
        if key_only and not column.key:
            continue
        if kind == m.UNCHANGED_TOAST:
            if old:
                raise _error(lsn, f"the old row of {info.schema}.{info.table} has an unchanged "
                                  f"TOAST value in {column.name}")
            unchanged.append(column.name)
        elif raw is None:
            values[column.name] = None
        elif kind == m.TEXT:
            values[column.name] = _text(lsn, info, column.name, raw)
        elif kind == m.BINARY:
            values[column.name] = _binary(lsn, info, column.type_id, column.name, raw)
        else:
            values[column.name] = {"internal_b64": base64.b64encode(raw).decode()}
    return values, unchanged


def _text(lsn: int, info: RelationInfo, name: str, raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise _error(lsn, f"{info.schema}.{info.table}.{name} is not valid UTF-8 "
                          f"({exc.reason})") from None


def _binary(lsn: int, info: RelationInfo, type_id: int | None, name: str, raw: bytes) -> Value:
    try:
        text = None if type_id is None else binary_to_text(type_id, raw)
    except ValueError as exc:
        raise _error(lsn, f"{info.schema}.{info.table}.{name}: {exc}") from None
    return {"binary_b64": base64.b64encode(raw).decode()} if text is None else text


def _error(lsn: int, problem: str) -> ProtocolError:
    return ProtocolError(f"change at {format_lsn(lsn)}: {problem}")
