"""The PostgreSQL wire protocol as the relay needs it (pure: bytes in, bytes out).

Startup packets (parse, decide what goes upstream, build), the FATAL ErrorResponse the relay
sends itself and the Authentication filter. The upstream's byte stream, reframed and
compressed, is :mod:`receivewal.relay.backend`; the sockets are in
:mod:`receivewal.relay.server`, :mod:`~receivewal.relay.client` and
:mod:`~receivewal.relay.pump`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from receivewal.errors import ConfigurationError
from receivewal.replication.negotiation import parse_compression_list, take_streampack_option

PROTOCOL_3 = 196608
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
MAX_STARTUP_PACKET = 10_000  # the server's own limit
PROTOCOL_OPTION_PREFIX = b"_pq_."

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
    negotiation: bytes = b""
    """The NegotiateProtocolVersion to send the client first (empty when it asked for 3.0
    without protocol options): the relay speaks 3.0 on both legs, whatever the client asked."""
    unrecognized: tuple[str, ...] = ()
    """The client's ``_pq_`` protocol options, taken out of the packet."""


def format_version(code: int) -> str:
    """A startup packet's version word as ``major.minor``."""
    return f"{code >> 16}.{code & 0xFFFF}"


def unsupported_protocol(code: int) -> str | None:
    """The server's own refusal of a startup packet that is not protocol 3 (None for 3.x)."""
    if code >> 16 == PROTOCOL_3 >> 16:
        return None
    return (f"unsupported frontend protocol {format_version(code)}: server supports "
            f"{format_version(PROTOCOL_3)} to {format_version(PROTOCOL_3)}")


def build_negotiate_protocol_version(unrecognized: tuple[str, ...]) -> bytes:
    """NegotiateProtocolVersion as a 3.0 server sends it: 3.0, then the options it ignored."""
    names = b"".join(name.encode("utf-8", "surrogateescape") + b"\x00" for name in unrecognized)
    return b"v" + struct.pack(">III", 12 + len(names), PROTOCOL_3, len(unrecognized)) + names


def parse_startup_parameters(body: bytes) -> list[tuple[bytes, bytes]]:
    """The name/value pairs of a protocol 3.0 startup packet (after length and version), as
    the bytes the client sent: the server does not assume an encoding here, nor does the
    relay."""
    fields = body.split(b"\x00")
    if len(fields) < 2 or fields[-1] != b"" or fields[-2] != b"":
        raise ConfigurationError("malformed startup packet: parameters not terminated")
    pairs = fields[:-2]
    if len(pairs) % 2:
        raise ConfigurationError("malformed startup packet: a parameter without a value")
    return [(pairs[i], pairs[i + 1]) for i in range(0, len(pairs), 2)]


def pack_startup_packet(pairs: list[tuple[bytes, bytes]]) -> bytes:
    """A protocol 3.0 startup packet carrying ``pairs`` byte for byte."""
    body = b"".join(name + b"\x00" + value + b"\x00" for name, value in pairs) + b"\x00"
    return struct.pack(">II", 8 + len(body), PROTOCOL_3) + body


def build_startup_packet(parameters: dict[str, str]) -> bytes:
    """A protocol 3.0 startup packet carrying ``parameters`` (UTF-8)."""
    return pack_startup_packet([(k.encode(), v.encode()) for k, v in parameters.items()])


def build_error_response(message: str, code: str = "08006") -> bytes:
    """A FATAL ErrorResponse, as the server sends before closing a connection."""
    fields = b"".join(tag + value.encode() + b"\x00" for tag, value in (
        (b"S", "FATAL"), (b"V", "FATAL"), (b"C", code), (b"M", message)))
    fields += b"\x00"
    return b"E" + struct.pack(">I", 4 + len(fields)) + fields


def _without_streampack_option(
    pairs: list[tuple[bytes, bytes]],
) -> tuple[list[tuple[bytes, bytes]], str | None]:
    """The pairs with ``pg_streampack.requested`` taken out of ``options``, and its value.

    The rest of ``options`` keeps its bytes (undecodable ones round-trip as surrogates).
    """
    out: list[tuple[bytes, bytes]] = []
    request: str | None = None
    for name, value in pairs:
        if name == b"options":
            remaining, taken = take_streampack_option(value.decode("utf-8", "surrogateescape"))
            if taken is not None:
                request = taken
                if remaining is None:
                    continue
                out.append((name, remaining.encode("utf-8", "surrogateescape")))
                continue
        out.append((name, value))
    return out, request


def decide_startup(body: bytes, offered: tuple[str, ...],
                   version: int = PROTOCOL_3) -> StartupDecision:
    """Take the streampack request out of a startup packet and choose the algorithm.

    ``body`` follows the version word ``version`` (any 3.x). The packet goes upstream as
    protocol 3.0 without ``_pq_`` options; when the client asked for more, the decision
    carries the NegotiateProtocolVersion to answer it with. Every other byte of the packet is
    forwarded as the client sent it. Raises ConfigurationError with the server's message when
    the request is invalid.
    """
    pairs = parse_startup_parameters(body)
    options = [name for name, _ in pairs if name.startswith(PROTOCOL_OPTION_PREFIX)]
    kept, request = _without_streampack_option(
        [(name, value) for name, value in pairs if name not in options])
    requested: tuple[str, ...] = ()
    if request is not None:
        try:
            requested = parse_compression_list(request) if request.strip() else ()
        except ConfigurationError as exc:
            raise ConfigurationError(
                f'invalid value for parameter "pg_streampack.requested": "{request}"'
            ) from exc
    replication_value = dict(pairs).get(b"replication", b"false").decode("latin-1")
    replication = replication_value.lower() not in _REPLICATION_FALSE
    algorithm = next((name for name in requested if name in offered), None)
    packet = (pack_startup_packet(kept) if request is not None or options
              else struct.pack(">II", 8 + len(body), PROTOCOL_3) + body)
    unrecognized = tuple(name.decode("utf-8", "surrogateescape") for name in options)
    return StartupDecision(
        packet=packet,
        replication=replication,
        requested=requested,
        algorithm=algorithm if replication else None,
        negotiation=(build_negotiate_protocol_version(unrecognized)
                     if version != PROTOCOL_3 or unrecognized else b""),
        unrecognized=unrecognized,
    )


AUTH_OK = 0
AUTH_SASL = 10
CHANNEL_BINDING_MECHANISMS = (b"SCRAM-SHA-256-PLUS",)


def strip_channel_binding(message: bytes) -> bytes:
    """An Authentication message (``R``) with the SCRAM mechanisms that bind to the TLS
    channel removed from an AuthenticationSASL list; any other message unchanged.

    Channel binding ties SCRAM to the TLS session the server sees, and the client's session
    ends at the relay: offered through the relay, libpq either fails on a plain client leg
    ("server offered SCRAM-SHA-256-PLUS authentication over a non-SSL connection") or binds to
    the wrong session.
    """
    if len(message) < 9 or int.from_bytes(message[5:9], "big") != AUTH_SASL:
        return message
    names = message[9:].split(b"\x00")
    kept = [n for n in names[:-2] if n not in CHANNEL_BINDING_MECHANISMS]
    body = struct.pack(">I", AUTH_SASL) + b"".join(n + b"\x00" for n in kept) + b"\x00"
    return b"R" + struct.pack(">I", 4 + len(body)) + body
