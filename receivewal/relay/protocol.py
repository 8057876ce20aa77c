"""The PostgreSQL wire protocol as the relay needs it (pure: bytes in, bytes out).

Startup packets (parse, decide what goes upstream, build), the FATAL ErrorResponse the relay
sends itself, and :class:`BackendStream`, which reframes the upstream's byte stream and
compresses XLogData inside COPY BOTH with :class:`~receivewal.replication.streampack.
StreampackEncoder`. The sockets are in :mod:`receivewal.relay.server`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from receivewal.errors import ConfigurationError
from receivewal.replication.streampack import (
    StreampackEncoder,
    StreampackStats,
    parse_compression_list,
    take_streampack_option,
)

PROTOCOL_3 = 196608
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
MAX_STARTUP_PACKET = 10_000  # the server's own limit

_REPLICATION_FALSE = {"false", "off", "no", "0"}


@dataclass(frozen=True, slots=True)
class StartupDecision:
    """What to forward to the upstream for one client startup packet, and how to compress."""

    packet: bytes
    """The startup packet to send upstream (the streampack option removed)."""
    replication: bool
    requested: tuple[str, ...]
    algorithm: str | None
    """The algorithm chosen for this connection, None for plain."""


def parse_startup_parameters(body: bytes) -> dict[str, str]:
    """The name/value pairs of a protocol 3.0 startup packet (after length and version)."""
    fields = body.split(b"\x00")
    if len(fields) < 2 or fields[-1] != b"" or fields[-2] != b"":
        raise ConfigurationError("malformed startup packet: parameters not terminated")
    pairs = fields[:-2]
    if len(pairs) % 2:
        raise ConfigurationError("malformed startup packet: a parameter without a value")
    return {pairs[i].decode("utf-8", "replace"): pairs[i + 1].decode("utf-8", "replace")
            for i in range(0, len(pairs), 2)}


def build_startup_packet(parameters: dict[str, str]) -> bytes:
    """A protocol 3.0 startup packet carrying ``parameters``."""
    body = b"".join(k.encode() + b"\x00" + v.encode() + b"\x00" for k, v in parameters.items())
    body += b"\x00"
    return struct.pack(">II", 8 + len(body), PROTOCOL_3) + body


def build_error_response(message: str, code: str = "08006") -> bytes:
    """A FATAL ErrorResponse, as the server sends before closing a connection."""
    fields = b"".join(tag + value.encode() + b"\x00" for tag, value in (
        (b"S", "FATAL"), (b"V", "FATAL"), (b"C", code), (b"M", message)))
    fields += b"\x00"
    return b"E" + struct.pack(">I", 4 + len(fields)) + fields


def decide_startup(body: bytes, offered: tuple[str, ...]) -> StartupDecision:
    """Take the streampack request out of a startup packet and choose the algorithm.

    Raises ConfigurationError with the server's message when the request is invalid.
    """
    parameters = parse_startup_parameters(body)
    remaining, request = take_streampack_option(parameters.get("options"))
    requested: tuple[str, ...] = ()
    if request is not None:
        try:
            requested = parse_compression_list(request) if request.strip() else ()
        except ConfigurationError as exc:
            raise ConfigurationError(
                f'invalid value for parameter "pg_streampack.requested": "{request}"'
            ) from exc
    if remaining is None:
        parameters.pop("options", None)
    else:
        parameters["options"] = remaining
    replication = parameters.get("replication", "false").lower() not in _REPLICATION_FALSE
    algorithm = next((name for name in requested if name in offered), None)
    return StartupDecision(
        packet=build_startup_packet(parameters),
        replication=replication,
        requested=requested,
        algorithm=algorithm if replication else None,
    )


class BackendStream:
    """Reframes the upstream's byte stream into messages and compresses XLogData (pure).

    ``feed`` takes bytes as they arrive and returns the bytes to send to the client. Only
    ``d`` (CopyData) messages starting with ``w`` received between CopyBothResponse (``W``) and
    the end of that COPY are compressed; every other byte passes unchanged.
    """

    def __init__(self, encoder: StreampackEncoder | None) -> None:
        self.encoder = encoder
        self.copy_both = False
        self._buffer = bytearray()

    def feed(self, data: bytes) -> bytes:
        """Bytes received from the upstream in, bytes for the client out."""
        if self.encoder is None:
            return data
        buf = self._buffer
        buf += data
        out: list[bytes] = []
        pos = 0
        while len(buf) - pos >= 5:
            kind = buf[pos]
            end = pos + 1 + int.from_bytes(buf[pos + 1 : pos + 5], "big")
            if end > len(buf):
                break
            if kind == 0x64 and self.copy_both and end > pos + 5 and buf[pos + 5] == 0x77:
                frame = self.encoder.encode(bytes(buf[pos + 5 : end]))
                out.append(b"d" + struct.pack(">I", 4 + len(frame)) + frame)
            else:
                out.append(bytes(buf[pos:end]))
                if kind == 0x57:  # CopyBothResponse
                    self.copy_both = True
                elif kind in b"cCEZ":  # CopyDone, CommandComplete, ErrorResponse, ReadyForQuery
                    self.copy_both = False
            pos = end
        del buf[:pos]
        return b"".join(out)

    def stats(self) -> StreampackStats | None:
        """The encoder's statistics (None for a plain connection)."""
        return self.encoder.stats() if self.encoder is not None else None


