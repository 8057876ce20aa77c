"""``receivewal relay``: speak pg_streampack for a primary that cannot load the module.

The relay sits next to the primary (a managed service, an old server) and accepts the
connections receivers would make to it. For each client it:

1. reads the startup packet. An SSLRequest or GSSENCRequest is answered ``N``, so the client
   continues in plaintext: **the relay does no TLS toward clients** (run it where the link to
   the receiver is trusted, or tunnel it). Toward the upstream it does TLS as libpq's
   ``sslmode`` says (``--upstream-sslmode``, default ``prefer``; ``verify-ca``/``verify-full``
   check the certificate against ``--upstream-sslrootcert``); no client certificates and no
   GSSAPI encryption. A CancelRequest is forwarded to the upstream unchanged, in plaintext as
   libpq sends it;
2. takes ``-c pg_streampack.requested=LIST`` out of the ``options`` startup parameter and picks
   the first algorithm of the client's list that the relay offers (the client's order wins, as
   with the module). A list the module would refuse (unknown or repeated names) is refused with
   the server's own message, ``invalid value for parameter "pg_streampack.requested"``;
3. forwards the startup packet, minus that option, and then the whole authentication exchange,
   unchanged in both directions (any authentication method that works without TLS works);
4. passes every message through, except that the XLogData CopyData frames the upstream sends in
   COPY BOTH mode (after START_REPLICATION) are compressed exactly as the module's sender does
   (:class:`~receivewal.streampack.StreampackEncoder`: same layout, same ``min_size`` rule, one
   compression state per client connection that survives a timeline switch and the next
   START_REPLICATION on that connection).

Non-replication connections (no ``replication`` startup parameter) are passed through unchanged
(minus the streampack option) and never compressed, so tools like psql work through the relay.

One asyncio event loop serves all connections. Protocol decisions (startup packet parsing, the
choice of algorithm, reframing and compressing the upstream's messages) are pure code below;
the socket work is confined to :class:`RelaySession` and :class:`Relay`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import ssl
import struct
from dataclasses import dataclass
from typing import Any

import click

from receivewal.errors import ConfigurationError, ReceivewalError
from receivewal.logs import configure_logging, get_logger
from receivewal.replication.negotiation import parse_compression_list, take_streampack_option
from receivewal.replication.streampack import StreampackEncoder, StreampackStats

PROTOCOL_3 = 196608
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
MAX_STARTUP_PACKET = 10_000  # the server's own limit
STARTUP_TIMEOUT = 60.0
RECV_SIZE = 256 * 1024

_REPLICATION_FALSE = {"false", "off", "no", "0"}


def _log() -> Any:
    # Bound on use, not at import: binding freezes structlog's configuration of that moment.
    return get_logger(component="relay")


# -- pure protocol logic ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RelaySettings:
    """What ``receivewal relay`` was asked to do."""

    listen_host: str
    listen_port: int
    upstream_host: str
    upstream_port: int
    offered: tuple[str, ...] = ("zstd", "lz4")
    min_size: int = 32
    zstd_level: int = 1
    upstream_sslmode: str = "prefer"
    upstream_sslrootcert: str | None = None


@dataclass(frozen=True, slots=True)
class StartupDecision:
    """What to forward to the upstream for one client startup packet, and how to compress."""

    packet: bytes
    """The startup packet to send upstream (the streampack option removed)."""
    replication: bool
    requested: tuple[str, ...]
    algorithm: str | None
    """The algorithm chosen for this connection, None for plain."""


def parse_address(text: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` (``[v6addr]:PORT`` for IPv6)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigurationError(f"invalid address {text!r}: expected HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


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


# -- sockets (asyncio) -----------------------------------------------------------------------


class ClientGone(ReceivewalError):  # noqa: N818 - a state: the client went away
    """The client closed its connection before the relay was done with it."""


class UpstreamError(ReceivewalError):
    """The upstream could not be reached, or not with the TLS that was required."""


UPSTREAM_SSLMODES = ("disable", "prefer", "require", "verify-ca", "verify-full")


def upstream_ssl_context(sslmode: str, rootcert: str | None) -> ssl.SSLContext | None:
    """The TLS context for the upstream connection, following libpq's ``sslmode`` meanings.

    ``prefer`` and ``require`` encrypt without checking the certificate, ``verify-ca`` checks
    it against ``rootcert`` (the system's CAs without one), ``verify-full`` also the host name.
    """
    if sslmode not in UPSTREAM_SSLMODES:
        raise ConfigurationError(f"invalid upstream sslmode {sslmode!r} "
                                 f"(one of {', '.join(UPSTREAM_SSLMODES)})")
    if sslmode == "disable":
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if sslmode in ("prefer", "require"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    context.check_hostname = sslmode == "verify-full"
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        if rootcert:
            context.load_verify_locations(rootcert)
        else:
            context.load_default_certs()
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"cannot load upstream root certificate {rootcert}: {exc}") \
            from exc
    return context


async def _close(writer: asyncio.StreamWriter | None) -> None:
    if writer is None:
        return
    writer.close()
    with contextlib.suppress(OSError):  # includes TLS errors and timeouts
        await asyncio.wait_for(writer.wait_closed(), 5)


class RelaySession:
    """One client connection and its upstream connection."""

    def __init__(self, settings: RelaySettings, ssl_context: ssl.SSLContext | None,
                 client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                 ) -> None:
        self.settings = settings
        self.ssl_context = ssl_context
        self.client_reader = client_reader
        self.client_writer = client_writer
        self.upstream_writer: asyncio.StreamWriter | None = None
        self.stream: BackendStream | None = None
        peer = client_writer.get_extra_info("peername") or ("?", 0)
        self.log = _log().bind(client=f"{peer[0]}:{peer[1]}")

    async def run(self) -> None:
        """Relay until either side closes; never raises (but can be cancelled)."""
        try:
            await self._run()
        except (OSError, ClientGone, asyncio.IncompleteReadError) as exc:  # incl. TLS, timeouts
            self.log.debug("relay_connection_error", error=str(exc) or type(exc).__name__)
        finally:
            await _close(self.client_writer)
            await _close(self.upstream_writer)
            stats = self.stream.stats() if self.stream is not None else None
            self.log.info("relay_client_disconnected",
                          **({"streampack": stats.as_dict()} if stats else {}))

    async def _read_startup(self) -> tuple[int, bytes]:
        while True:
            (length,) = struct.unpack(">I", await self.client_reader.readexactly(4))
            if not 8 <= length <= MAX_STARTUP_PACKET:
                raise ClientGone(f"invalid startup packet length {length}")
            packet = await self.client_reader.readexactly(length - 4)
            (code,) = struct.unpack_from(">I", packet)
            if code in (SSL_REQUEST, GSSENC_REQUEST):
                self.client_writer.write(b"N")  # no encryption: the client goes on in plaintext
                await self.client_writer.drain()
                continue
            return code, struct.pack(">I", length) + packet

    async def _connect_upstream(self, tls: bool) -> tuple[asyncio.StreamReader,
                                                           asyncio.StreamWriter]:
        host, port = self.settings.upstream_host, self.settings.upstream_port
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 30)
        self.upstream_writer = writer
        if not tls or self.ssl_context is None:
            return reader, writer
        writer.write(struct.pack(">II", 8, SSL_REQUEST))
        await writer.drain()
        answer = await asyncio.wait_for(reader.readexactly(1), 30)
        if answer == b"S":
            await writer.start_tls(self.ssl_context, server_hostname=host,
                                   ssl_handshake_timeout=30)
        elif answer != b"N":
            raise UpstreamError(f"unexpected answer {answer!r} to the SSL request")
        elif self.settings.upstream_sslmode != "prefer":
            raise UpstreamError("the upstream server does not support SSL, but sslmode "
                                f"{self.settings.upstream_sslmode} requires it")
        return reader, writer

    async def _refuse(self, message: str, code: str) -> None:
        self.client_writer.write(build_error_response(message, code))
        await self.client_writer.drain()

    async def _run(self) -> None:
        code, packet = await asyncio.wait_for(self._read_startup(), STARTUP_TIMEOUT)
        if code != PROTOCOL_3:
            # A CancelRequest (or a protocol the upstream refuses itself): forward it as is, in
            # plaintext like libpq's cancel, and pass back whatever comes.
            self.log.debug("relay_forwarding_special_packet", code=code)
            reader, writer = await self._connect_upstream(tls=False)
            writer.write(packet)
            await self._pump(reader, writer, BackendStream(None))
            return
        try:
            decision = decide_startup(packet[8:], self.settings.offered)
        except ConfigurationError as exc:
            self.log.warning("relay_startup_refused", reason=str(exc))
            await self._refuse(str(exc), "22023")
            return
        try:
            reader, writer = await self._connect_upstream(tls=True)
        except (OSError, UpstreamError, asyncio.IncompleteReadError) as exc:
            reason = str(exc) or type(exc).__name__
            self.log.warning("relay_upstream_unreachable", error=reason)
            await self._refuse(
                f"receivewal relay could not connect to the upstream server: {reason}", "08006")
            return
        encoder = (StreampackEncoder(decision.algorithm, self.settings.min_size,
                                     self.settings.zstd_level)
                   if decision.algorithm else None)
        self.log.info("relay_client_connected", replication=decision.replication,
                      requested=",".join(decision.requested) or None,
                      compression=decision.algorithm,
                      upstream_tls=writer.get_extra_info("sslcontext") is not None)
        writer.write(decision.packet)
        await self._pump(reader, writer, BackendStream(encoder))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    stream: BackendStream) -> None:
        self.stream = stream

        async def to_upstream() -> None:
            while data := await self.client_reader.read(RECV_SIZE):
                writer.write(data)
                await writer.drain()

        async def to_client() -> None:
            while data := await reader.read(RECV_SIZE):
                out = stream.feed(data)
                if out:
                    self.client_writer.write(out)
                    await self.client_writer.drain()

        tasks = [asyncio.create_task(to_upstream()), asyncio.create_task(to_client())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception) and not isinstance(result, asyncio.CancelledError):
                self.log.debug("relay_connection_error", error=str(result) or repr(result))
        del done


class Relay:
    """Accepts clients and runs a :class:`RelaySession` for each, until :meth:`stop`.

    One asyncio event loop serves every connection (the upstream TLS needs no locking that
    way); compression runs on the loop, which is fine for the handful of receivers a primary
    has.
    """

    def __init__(self, settings: RelaySettings) -> None:
        self.settings = settings
        self.ssl_context = upstream_ssl_context(settings.upstream_sslmode,
                                                settings.upstream_sslrootcert)
        self._listener = socket.create_server(
            (settings.listen_host, settings.listen_port), backlog=64,
            family=socket.AF_INET6 if ":" in settings.listen_host else socket.AF_INET,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._stop_requested = False
        self._sessions: set[asyncio.Task[Any]] = set()

    @property
    def address(self) -> tuple[str, int]:
        """The address the relay listens on (the real port when 0 was asked for)."""
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    def serve_forever(self, stop_signals: tuple[signal.Signals, ...] = ()) -> None:
        """Accept clients until :meth:`stop` (or one of ``stop_signals``); then close all."""
        asyncio.run(self._serve(stop_signals))

    def stop(self) -> None:
        """Ask :meth:`serve_forever` to return (safe from any thread)."""
        self._stop_requested = True
        if self._loop is not None and self._stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._stopping.set)

    async def _serve(self, stop_signals: tuple[signal.Signals, ...]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        for signum in stop_signals:
            self._loop.add_signal_handler(signum, self._on_signal, signum)
        if self._stop_requested:
            self._stopping.set()
        server = await asyncio.start_server(self._handle, sock=self._listener, backlog=64)
        _log().info("relay_listening", listen=f"{self.address[0]}:{self.address[1]}",
                    upstream=f"{self.settings.upstream_host}:{self.settings.upstream_port}",
                    upstream_sslmode=self.settings.upstream_sslmode,
                    offered=",".join(self.settings.offered) or None,
                    min_size=self.settings.min_size, zstd_level=self.settings.zstd_level)
        async with server:
            await self._stopping.wait()
            server.close()
            for task in list(self._sessions):
                task.cancel()
            await asyncio.gather(*self._sessions, return_exceptions=True)
        _log().info("relay_stopped")

    def _on_signal(self, signum: signal.Signals) -> None:
        _log().info("relay_stopping", signal=signum.name)
        self.stop()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._sessions.add(task)
        try:
            await RelaySession(self.settings, self.ssl_context, reader, writer).run()
        finally:
            self._sessions.discard(task)


# -- command line -----------------------------------------------------------------------------


def build_relay_settings(listen: str, upstream: str, *, compression: str = "zstd,lz4",
                         min_size: int = 32, zstd_level: int = 1,
                         upstream_sslmode: str = "prefer",
                         upstream_sslrootcert: str | None = None) -> RelaySettings:
    """Validated settings for ``receivewal relay`` (raises ConfigurationError)."""
    listen_host, listen_port = parse_address(listen)
    upstream_host, upstream_port = parse_address(upstream)
    offered = parse_compression_list(compression)
    if offered:
        StreampackEncoder(offered[0], min_size, zstd_level)  # validates min size and level
    upstream_ssl_context(upstream_sslmode, upstream_sslrootcert)  # validates the TLS settings
    return RelaySettings(listen_host, listen_port, upstream_host, upstream_port, offered,
                         min_size, zstd_level, upstream_sslmode, upstream_sslrootcert)


@click.command("relay")
@click.option("--listen", required=True, metavar="HOST:PORT",
              help="Address to accept receivers on (no TLS toward clients).")
@click.option("--upstream", required=True, metavar="HOST:PORT", help="The primary to relay.")
@click.option("--upstream-sslmode", type=click.Choice(UPSTREAM_SSLMODES), default="prefer",
              show_default=True, help="TLS toward the upstream, as libpq's sslmode.")
@click.option("--upstream-sslrootcert", type=click.Path(dir_okay=False),
              help="CA certificates for --upstream-sslmode verify-ca/verify-full.")
@click.option("--compression", default="zstd,lz4", show_default=True,
              help="pg_streampack algorithms offered to clients, or none.")
@click.option("--min-size", type=int, default=32, show_default=True,
              help="WAL payloads smaller than this many bytes are sent plain.")
@click.option("--zstd-level", type=int, default=1, show_default=True,
              help="zstd compression level (the module uses 1).")
@click.option("-v", "--verbose", count=True, help="More log output (debug events).")
def relay_command(*, listen: str, upstream: str, upstream_sslmode: str,
                  upstream_sslrootcert: str | None, compression: str, min_size: int,
                  zstd_level: int, verbose: int) -> int:
    """Relay a primary to receivers, compressing its WAL stream with pg_streampack.

    No TLS toward clients: run it where the link to the receivers is trusted.
    """
    configure_logging(verbose)
    try:
        settings = build_relay_settings(
            listen, upstream, compression=compression, min_size=min_size,
            zstd_level=zstd_level, upstream_sslmode=upstream_sslmode,
            upstream_sslrootcert=upstream_sslrootcert)
        relay = Relay(settings)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {listen}: {exc}") from exc
    relay.serve_forever(stop_signals=(signal.SIGTERM, signal.SIGINT))
    return 0
