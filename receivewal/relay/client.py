"""One client of the relay (asyncio): encryption negotiation, then the upstream connection.

:func:`negotiate` answers SSLRequest/GSSENCRequest on the raw socket and reads the startup
packet, over TLS when the client asked for it and the relay has a certificate.
:class:`RelaySession` then connects upstream and pumps bytes both ways: the upstream's through
an :class:`~receivewal.relay.pump.UpstreamPump` and its
:class:`~receivewal.relay.backend.BackendStream`.

The negotiation reads the raw socket exactly as many bytes as each packet has, so no byte a
client sends after its SSLRequest can be taken for part of the TLS session (the buffered
plaintext injection PostgreSQL fixed in CVE-2021-23214): the TLS layer reads them as TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from receivewal.errors import ConfigurationError, ReceivewalError
from receivewal.logs import get_logger
from receivewal.relay.backend import BackendStream
from receivewal.relay.config import RelaySettings
from receivewal.relay.protocol import (
    CANCEL_REQUEST,
    GSSENC_REQUEST,
    MAX_STARTUP_PACKET,
    SSL_REQUEST,
    build_error_response,
    decide_startup,
    format_version,
    unsupported_protocol,
)
from receivewal.relay.pump import UpstreamPump
from receivewal.replication.streampack import StreampackEncoder

RECV_SIZE = 256 * 1024
HANDSHAKE_TIMEOUT = 30.0


def relay_log() -> Any:
    # Bound on use, not at import: binding freezes structlog's configuration of that moment.
    return get_logger(component="relay")


class ClientGone(ReceivewalError):  # noqa: N818 - a state: the client went away
    """The client closed its connection before the relay was done with it."""


class UpstreamError(ReceivewalError):
    """The upstream could not be reached, or not with the TLS that was required."""


@dataclass
class Client:
    """A client after the encryption negotiation: its streams and first real packet."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    packet: bytes
    """The startup packet (or CancelRequest), length word included."""
    tls: bool

    @property
    def code(self) -> int:
        return int.from_bytes(self.packet[4:8], "big")


async def read_packet(read_exactly: Callable[[int], Awaitable[bytes]]) -> bytes:
    """One length-prefixed startup-phase packet, length word included."""
    header = await read_exactly(4)
    (length,) = struct.unpack(">I", header)
    if not 8 <= length <= MAX_STARTUP_PACKET:
        raise ClientGone(f"invalid startup packet length {length}")
    return header + await read_exactly(length - 4)


async def open_accepted(sock: socket.socket, context: ssl.SSLContext | None,
                        ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Streams over an accepted socket; the server side of a TLS handshake with a context."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=RECV_SIZE)
    protocol = asyncio.StreamReaderProtocol(reader)
    transport, _ = await loop.connect_accepted_socket(
        lambda: protocol, sock, ssl=context,
        ssl_handshake_timeout=HANDSHAKE_TIMEOUT if context is not None else None)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def _startup_inside_tls(reader: asyncio.StreamReader) -> bytes:
    packet = await read_packet(reader.readexactly)
    if int.from_bytes(packet[4:8], "big") in (SSL_REQUEST, GSSENC_REQUEST):
        raise ClientGone("an encryption request inside TLS")
    return packet


async def negotiate(sock: socket.socket, context: ssl.SSLContext | None) -> Client:
    """Answer encryption requests ('S' and TLS with a context, else 'N'); return the client
    with its startup packet."""
    loop = asyncio.get_running_loop()

    async def raw_exactly(size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = await loop.sock_recv(sock, size - len(data))
            if not chunk:
                raise ClientGone("the client closed the connection during startup")
            data += chunk
        return data

    while True:
        packet = await read_packet(raw_exactly)
        code = int.from_bytes(packet[4:8], "big")
        if code == SSL_REQUEST and context is not None:
            await loop.sock_sendall(sock, b"S")
            reader, writer = await open_accepted(sock, context)
            try:
                packet = await _startup_inside_tls(reader)
            except BaseException:  # closes the TLS transport on any way out, then re-raises
                writer.close()
                raise
            return Client(reader, writer, packet, tls=True)
        if code in (SSL_REQUEST, GSSENC_REQUEST):
            await loop.sock_sendall(sock, b"N")  # no (more) encryption: go on in plaintext
            continue
        reader, writer = await open_accepted(sock, None)
        return Client(reader, writer, packet, tls=False)


async def close_writer(writer: asyncio.StreamWriter | None) -> None:
    if writer is None:
        return
    writer.close()
    with contextlib.suppress(OSError):  # includes TLS errors and timeouts
        await asyncio.wait_for(writer.wait_closed(), 5)


async def refuse(writer: asyncio.StreamWriter, message: str, code: str) -> None:
    """Send a FATAL ErrorResponse (the connection is closed by the caller)."""
    writer.write(build_error_response(message, code))
    await writer.drain()


class RelaySession:
    """One client connection and its upstream connection."""

    def __init__(self, settings: RelaySettings, ssl_context: ssl.SSLContext | None,
                 client: Client, log: Any) -> None:
        self.settings = settings
        self.ssl_context = ssl_context
        self.client = client
        self.upstream_writer: asyncio.StreamWriter | None = None
        """The upstream until :meth:`_pump` hands it to :attr:`pump`."""
        self.pump: UpstreamPump | None = None
        self.stream: BackendStream | None = None
        self.log = log

    async def run(self) -> None:
        """Relay until either side closes; never raises (but can be cancelled)."""
        try:
            await self._run()
        except (OSError, ClientGone, asyncio.IncompleteReadError) as exc:  # incl. TLS, timeouts
            self.log.debug("relay_connection_error", error=str(exc) or type(exc).__name__)
        finally:
            await close_writer(self.client.writer)
            await close_writer(self.upstream_writer)
            if self.pump is not None:
                await self.pump.close()
            stats = self.stream.stats() if self.stream is not None else None
            self.log.info("relay_client_disconnected",
                          **({"streampack": stats.as_dict()} if stats else {}))

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The upstream connection; None when there is none (the client has been told)."""
        try:
            return await self._connect_upstream()
        except (OSError, UpstreamError, asyncio.IncompleteReadError) as exc:
            reason = str(exc) or type(exc).__name__
            self.log.warning("relay_upstream_unreachable", error=reason)
            await refuse(self.client.writer,
                         f"receivewal relay could not connect to the upstream server: {reason}",
                         "08006")
            return None

    async def _connect_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the upstream with TLS as ``--upstream-sslmode`` says."""
        host, port = self.settings.upstream_host, self.settings.upstream_port
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 30)
        self.upstream_writer = writer
        if self.ssl_context is None:
            return reader, writer
        writer.write(struct.pack(">II", 8, SSL_REQUEST))
        await writer.drain()
        answer = await asyncio.wait_for(reader.readexactly(1), 30)
        if answer == b"S":
            await writer.start_tls(self.ssl_context, server_hostname=host,
                                   ssl_handshake_timeout=HANDSHAKE_TIMEOUT)
        elif answer != b"N":
            raise UpstreamError(f"unexpected answer {answer!r} to the SSL request")
        elif self.settings.upstream_sslmode != "prefer":
            raise UpstreamError("the upstream server does not support SSL, but sslmode "
                                f"{self.settings.upstream_sslmode} requires it")
        return reader, writer

    async def _run(self) -> None:
        packet, code = self.client.packet, self.client.code
        if code == CANCEL_REQUEST:
            # Forwarded as is, with the TLS every upstream connection has (a cancel key is a
            # secret too); whatever comes back passes back.
            self.log.debug("relay_forwarding_cancel_request")
            if (upstream := await self._open_upstream()) is not None:
                upstream[1].write(packet)
                await self._pump(upstream[1], BackendStream(None, authenticating=False))
            return
        unsupported = unsupported_protocol(code)
        if unsupported is not None:  # never passed through: no way around the TLS path
            self.log.warning("relay_startup_refused", reason=unsupported)
            await refuse(self.client.writer, unsupported, "0A000")
            return
        try:
            decision = decide_startup(packet[8:], self.settings.offered, code)
        except ConfigurationError as exc:
            self.log.warning("relay_startup_refused", reason=str(exc))
            await refuse(self.client.writer, str(exc), "22023")
            return
        if (upstream := await self._open_upstream()) is None:
            return
        writer = upstream[1]
        encoder = (StreampackEncoder(decision.algorithm, self.settings.min_size,
                                     self.settings.zstd_level)
                   if decision.algorithm else None)
        self.log.info("relay_client_connected", replication=decision.replication,
                      requested=",".join(decision.requested) or None,
                      compression=decision.algorithm, client_tls=self.client.tls,
                      upstream_tls=writer.get_extra_info("sslcontext") is not None)
        if decision.negotiation:
            self.log.info("relay_protocol_downgraded", requested=format_version(code),
                          options=",".join(decision.unrecognized) or None)
            self.client.writer.write(decision.negotiation)
        writer.write(decision.packet)
        await self._pump(writer, BackendStream(encoder))

    async def _pump(self, upstream: asyncio.StreamWriter, stream: BackendStream) -> None:
        """Relay until either side closes. Called with nothing read from the upstream since
        the last write to it (the pump takes its transport over)."""
        self.stream = stream
        pump = self.pump = UpstreamPump.take_over(upstream, stream, self.client.writer)
        self.upstream_writer = None  # closed through the pump now
        client_reader = self.client.reader

        async def to_upstream() -> None:
            while data := await client_reader.read(RECV_SIZE):
                pump.send(data)
                await pump.drained()

        task = asyncio.create_task(to_upstream())
        try:
            await asyncio.wait([task, pump.ended], return_when=asyncio.FIRST_COMPLETED)
        finally:
            task.cancel()
            results = await asyncio.gather(task, return_exceptions=True)
        for error in (*results, pump.error):
            if isinstance(error, Exception) and not isinstance(error, asyncio.CancelledError):
                self.log.debug("relay_connection_error", error=str(error) or repr(error))
