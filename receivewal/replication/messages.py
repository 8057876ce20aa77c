"""Codecs for the CopyData messages of physical streaming replication (pure).

Layouts are the replication protocol's (all integers big-endian):

- XLogData ``w``: walStart u64, walEnd u64, sendTime i64, then WAL bytes.
- Primary keepalive ``k``: walEnd u64, sendTime i64, replyRequested u8.
- Standby status update ``r``: write u64, flush u64, apply u64, sendTime i64, replyRequested u8.
- Hot standby feedback ``h``: sendTime i64, xmin u32, xmin epoch u32, catalog_xmin u32,
  catalog_xmin epoch u32.

Times are microseconds since 2000-01-01 00:00 UTC, PostgreSQL's epoch.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from receivewal.errors import ProtocolError

XLOGDATA_TAG = 0x77  # "w": the first byte of an XLogData message
KEEPALIVE_TAG = 0x6B  # "k"

XLOGDATA_HEADER = struct.Struct(">cQQq")  # 25 bytes
KEEPALIVE = struct.Struct(">cQqB")  # 18 bytes
STATUS_UPDATE = struct.Struct(">cQQQqB")  # 34 bytes
HOT_STANDBY_FEEDBACK = struct.Struct(">cqIIII")  # 25 bytes

POSTGRES_EPOCH_UNIX = 946_684_800  # 2000-01-01 00:00:00 UTC in Unix seconds


@dataclass(frozen=True, slots=True)
class XLogData:
    """A chunk of WAL starting at ``wal_start``; ``wal_end`` is the server's end of WAL."""

    wal_start: int
    wal_end: int
    send_time: int
    payload: bytes | memoryview

    @property
    def end(self) -> int:
        """The LSN just past this message's WAL bytes."""
        return self.wal_start + len(self.payload)


@dataclass(frozen=True, slots=True)
class PrimaryKeepalive:
    """The server's heartbeat, telling its end of WAL and whether it wants a reply now."""

    wal_end: int
    send_time: int
    reply_requested: bool


_SEND_TIME_MASK = (1 << 63) - 1  # sendTime without its top bit (pg_streampack's flag)


def parse_xlogdata(frame: bytes | memoryview,
                   payload: bytes | memoryview | None = None) -> XLogData:
    """The XLogData message in ``frame``: the one place its header is read.

    Its WAL bytes are the rest of ``frame``, or ``payload`` when they came in another form:
    pg_streampack restores them, and the flag in sendTime's top bit is then cleared.
    """
    if len(frame) < XLOGDATA_HEADER.size:
        raise ProtocolError(f"XLogData message too short: {len(frame)} bytes")
    _, start, end, send_time = XLOGDATA_HEADER.unpack_from(frame)
    if payload is None:
        return XLogData(start, end, send_time, memoryview(frame)[XLOGDATA_HEADER.size :])
    return XLogData(start, end, send_time & _SEND_TIME_MASK, payload)


def parse_copy_data(
    data: bytes | memoryview,
    xlogdata: Callable[[bytes | memoryview], XLogData] = parse_xlogdata,
) -> XLogData | PrimaryKeepalive:
    """Decode one CopyData payload received during physical replication.

    The one place a received message's kind is looked at. ``xlogdata`` reads an XLogData
    message (default :func:`parse_xlogdata`): a pg_streampack decoder's ``decode`` restores
    compressed ones.
    """
    try:
        kind = data[0]
    except IndexError:
        kind = None
    if kind == XLOGDATA_TAG:
        return xlogdata(data)
    if kind == KEEPALIVE_TAG:
        if len(data) < KEEPALIVE.size:
            raise ProtocolError(f"keepalive message too short: {len(data)} bytes")
        _, end, send_time, reply = KEEPALIVE.unpack_from(data)
        return PrimaryKeepalive(end, send_time, bool(reply))
    raise ProtocolError(f"unrecognized streaming header: {bytes(data[:1])!r}")


def build_xlogdata(wal_start: int, wal_end: int, send_time: int,
                   payload: bytes | memoryview) -> bytes:
    """Encode an XLogData message (used by the relay and by tests)."""
    return XLOGDATA_HEADER.pack(b"w", wal_start, wal_end, send_time) + payload


def build_standby_status_update(
    write: int, flush: int, apply: int, send_time: int, reply_requested: bool = False
) -> bytes:
    """Encode a standby status update (``r``, 34 bytes)."""
    return STATUS_UPDATE.pack(b"r", write, flush, apply, send_time, int(reply_requested))


def build_hot_standby_feedback(
    send_time: int, xmin: int = 0, xmin_epoch: int = 0, catalog_xmin: int = 0,
    catalog_xmin_epoch: int = 0,
) -> bytes:
    """Encode hot standby feedback (``h``); all zeros means "hold nothing back"."""
    return HOT_STANDBY_FEEDBACK.pack(b"h", send_time, xmin, xmin_epoch, catalog_xmin,
                                     catalog_xmin_epoch)


def postgres_time(unix_seconds: float) -> int:
    """Convert a Unix time to PostgreSQL's microseconds since 2000-01-01."""
    return int((unix_seconds - POSTGRES_EPOCH_UNIX) * 1_000_000)


def unix_time(postgres_us: int) -> float:
    """Convert PostgreSQL's microseconds since 2000-01-01 to a Unix time."""
    return postgres_us / 1_000_000 + POSTGRES_EPOCH_UNIX
