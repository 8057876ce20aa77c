"""``receivewal relay``: speak pg_streampack for a primary that cannot load the module.

The relay sits next to the primary (a managed service, an old server) and accepts the
connections receivers would make to it. For each client it:

1. reads the startup packet. An SSLRequest or GSSENCRequest is answered ``N``, so the client
   continues in plaintext: **the relay does no TLS toward clients** (run it where the link to
   the receiver is trusted, or tunnel it). It does no TLS toward the upstream either: it
   connects to the upstream in plaintext, so put it on the primary's host or a trusted network.
   A CancelRequest is forwarded to the upstream unchanged;
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

Threads: one accept loop, and two threads per client connection (one per direction). Protocol
decisions (startup packet parsing, the choice of algorithm) are pure functions below; the
socket work is confined to :class:`RelaySession` and :class:`Relay`.
"""

from __future__ import annotations

import contextlib
import selectors
import signal
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Any

import click

from .errors import ConfigurationError, ReceivewalError
from .logs import configure_logging, get_logger
from .streampack import (
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


# -- sockets ----------------------------------------------------------------------------------


class ClientGone(ReceivewalError):  # noqa: N818 - a state: the client went away
    """The client closed its connection before the relay was done with it."""


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ClientGone("client closed the connection during startup")
        data += chunk
    return bytes(data)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class RelaySession:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket, peer: str, settings: RelaySettings) -> None:
        self.client = client
        self.peer = peer
        self.settings = settings
        self.upstream: socket.socket | None = None
        self.stream: BackendStream | None = None
        self.log = _log().bind(client=peer)

    def run(self) -> None:
        """Relay until either side closes; never raises."""
        try:
            self._run()
        except (OSError, ClientGone) as exc:
            self.log.debug("relay_connection_error", error=str(exc))
        finally:
            self.close()
            stats = self.stream.stats() if self.stream is not None else None
            self.log.info("relay_client_disconnected",
                          **({"streampack": stats.as_dict()} if stats else {}))

    def close(self) -> None:
        """Close both sockets (unblocks the threads of this session)."""
        _close(self.client)
        if self.upstream is not None:
            _close(self.upstream)

    def _read_startup(self) -> tuple[int, bytes]:
        self.client.settimeout(STARTUP_TIMEOUT)
        while True:
            (length,) = struct.unpack(">I", _recv_exact(self.client, 4))
            if not 8 <= length <= MAX_STARTUP_PACKET:
                raise ClientGone(f"invalid startup packet length {length}")
            packet = _recv_exact(self.client, length - 4)
            (code,) = struct.unpack_from(">I", packet)
            if code in (SSL_REQUEST, GSSENC_REQUEST):
                self.client.sendall(b"N")  # no encryption: the client goes on in plaintext
                continue
            self.client.settimeout(None)
            return code, struct.pack(">I", length) + packet

    def _connect_upstream(self) -> socket.socket:
        upstream = socket.create_connection(
            (self.settings.upstream_host, self.settings.upstream_port), timeout=30)
        upstream.settimeout(None)
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.upstream = upstream
        return upstream

    def _run(self) -> None:
        code, packet = self._read_startup()
        if code != PROTOCOL_3:
            # CancelRequest (or a protocol the upstream will refuse itself): forward as is.
            self.log.debug("relay_forwarding_special_packet", code=code)
            upstream = self._connect_upstream()
            upstream.sendall(packet)
            self._pump(upstream, BackendStream(None))
            return
        try:
            decision = decide_startup(packet[8:], self.settings.offered)
        except ConfigurationError as exc:
            self.log.warning("relay_startup_refused", reason=str(exc))
            self.client.sendall(build_error_response(str(exc), code="22023"))
            return
        try:
            upstream = self._connect_upstream()
        except OSError as exc:
            self.log.warning("relay_upstream_unreachable", error=str(exc))
            self.client.sendall(build_error_response(
                f"receivewal relay could not connect to the upstream server: {exc}"))
            return
        encoder = (StreampackEncoder(decision.algorithm, self.settings.min_size,
                                     self.settings.zstd_level)
                   if decision.algorithm else None)
        self.log.info("relay_client_connected", replication=decision.replication,
                      requested=",".join(decision.requested) or None,
                      compression=decision.algorithm)
        upstream.sendall(decision.packet)
        self._pump(upstream, BackendStream(encoder))

    def _pump(self, upstream: socket.socket, stream: BackendStream) -> None:
        self.stream = stream
        self.client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        forward = threading.Thread(target=self._client_to_upstream, args=(upstream,),
                                   name=f"relay-from-{self.peer}", daemon=True)
        forward.start()
        try:
            while True:
                data = upstream.recv(RECV_SIZE)
                if not data:
                    break
                out = stream.feed(data)
                if out:
                    self.client.sendall(out)
        finally:
            self.close()
            forward.join()

    def _client_to_upstream(self, upstream: socket.socket) -> None:
        try:
            while True:
                data = self.client.recv(RECV_SIZE)
                if not data:
                    break
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            self.close()


class Relay:
    """Accepts clients and runs a :class:`RelaySession` for each, until :meth:`stop`."""

    def __init__(self, settings: RelaySettings) -> None:
        self.settings = settings
        self._stop = threading.Event()
        self._sessions: set[RelaySession] = set()
        self._lock = threading.Lock()
        self._listener = socket.create_server(
            (settings.listen_host, settings.listen_port), reuse_port=False, backlog=64,
            family=socket.AF_INET6 if ":" in settings.listen_host else socket.AF_INET,
        )

    @property
    def address(self) -> tuple[str, int]:
        """The address the relay listens on (the real port when 0 was asked for)."""
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    def serve_forever(self) -> None:
        """Accept clients until :meth:`stop` is called; then close every session."""
        _log().info("relay_listening", listen=f"{self.address[0]}:{self.address[1]}",
                 upstream=f"{self.settings.upstream_host}:{self.settings.upstream_port}",
                 offered=",".join(self.settings.offered) or None,
                 min_size=self.settings.min_size, zstd_level=self.settings.zstd_level)
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            while not self._stop.is_set():
                if not selector.select(timeout=0.2):
                    continue
                try:
                    client, addr = self._listener.accept()
                except OSError:
                    continue
                session = RelaySession(client, f"{addr[0]}:{addr[1]}", self.settings)
                with self._lock:
                    self._sessions.add(session)
                threading.Thread(target=self._run_session, args=(session,),
                                 name=f"relay-to-{session.peer}", daemon=True).start()
        self._listener.close()
        with self._lock:
            sessions = list(self._sessions)
        for session in sessions:
            session.close()
        _log().info("relay_stopped")

    def _run_session(self, session: RelaySession) -> None:
        try:
            session.run()
        finally:
            with self._lock:
                self._sessions.discard(session)

    def stop(self) -> None:
        """Ask :meth:`serve_forever` to return (safe from a signal handler or another thread)."""
        self._stop.set()

    @property
    def sessions(self) -> int:
        """How many client connections are open."""
        with self._lock:
            return len(self._sessions)


# -- command line -----------------------------------------------------------------------------


def build_relay_settings(listen: str, upstream: str, compression: str, min_size: int,
                         zstd_level: int) -> RelaySettings:
    """Validated settings for ``receivewal relay`` (raises ConfigurationError)."""
    listen_host, listen_port = parse_address(listen)
    upstream_host, upstream_port = parse_address(upstream)
    offered = parse_compression_list(compression)
    if offered:
        StreampackEncoder(offered[0], min_size, zstd_level)  # validates min size and level
    return RelaySettings(listen_host, listen_port, upstream_host, upstream_port, offered,
                         min_size, zstd_level)


@click.command("relay")
@click.option("--listen", required=True, metavar="HOST:PORT",
              help="Address to accept receivers on (no TLS toward clients).")
@click.option("--upstream", required=True, metavar="HOST:PORT",
              help="The primary to relay (plaintext connection).")
@click.option("--compression", default="zstd,lz4", show_default=True,
              help="pg_streampack algorithms offered to clients, or none.")
@click.option("--min-size", type=int, default=32, show_default=True,
              help="WAL payloads smaller than this many bytes are sent plain.")
@click.option("--zstd-level", type=int, default=1, show_default=True,
              help="zstd compression level (the module uses 1).")
@click.option("-v", "--verbose", count=True, help="More log output (debug events).")
def relay_command(*, listen: str, upstream: str, compression: str, min_size: int,
                  zstd_level: int, verbose: int) -> int:
    """Relay a primary to receivers, compressing its WAL stream with pg_streampack."""
    configure_logging(verbose)
    try:
        settings = build_relay_settings(listen, upstream, compression, min_size, zstd_level)
        relay = Relay(settings)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {listen}: {exc}") from exc

    def on_signal(signum: int, _frame: object) -> None:
        _log().info("relay_stopping", signal=signal.Signals(signum).name)
        relay.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    relay.serve_forever()
    return 0
