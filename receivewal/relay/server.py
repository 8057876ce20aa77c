"""``receivewal relay``: speak pg_streampack for a primary that cannot load the module.

The relay sits next to the primary (a managed service, an old server) and accepts the
connections receivers would make to it. For each client it:

0. admits it or not: a client outside ``--allow`` (default: loopback only) gets a FATAL
   ErrorResponse as soon as it is accepted, before anything it sends is read; a plaintext
   client when TLS is required and every client past ``--max-connections`` get theirs after the
   encryption negotiation; nothing of theirs reaches the upstream. Every client has
   ``--startup-timeout`` seconds from its connection to its startup packet (TLS handshake
   included), and each connection is a task of its own, so a silent or slow one delays nobody.
   A connection counts toward ``--max-connections`` only once its startup packet has come:
   those still negotiating are a pool of their own, as large, and when one more arrives the
   one that has been negotiating longest is closed to make room, so idle connections cannot
   keep clients out. Refusals and timeouts are counted (:class:`~receivewal.relay.admission.
   RelayStats`, served on ``--metrics-address``) and their log lines throttled;
1. reads the startup packet. An SSLRequest is answered ``S`` and TLS follows when the relay
   has a certificate (``--tls-cert``/``--tls-key``; client certificates checked against
   ``--tls-ca``), ``N`` otherwise; GSSENCRequest is answered ``N``. Plaintext is refused
   (``--client-tls require``) by default unless ``--listen`` is a loopback address. Toward
   the upstream it does TLS as libpq's ``sslmode`` says (``--upstream-sslmode``, default
   ``prefer``; ``verify-ca``/``verify-full`` check the certificate against
   ``--upstream-sslrootcert``). A CancelRequest is forwarded to the upstream unchanged, over
   that same TLS (the server accepts cancels after an SSLRequest as well);
2. takes ``-c pg_streampack.requested=LIST`` out of the ``options`` startup parameter and picks
   the first algorithm of the client's list that the relay offers (the client's order wins, as
   with the module). A list the module would refuse (unknown or repeated names) is refused with
   the server's own message, ``invalid value for parameter "pg_streampack.requested"``;
3. forwards the startup packet byte for byte, minus that option, as protocol 3.0: a client that
   asked for a later 3.x or sent ``_pq_`` options is answered NegotiateProtocolVersion (3.0,
   the options ignored) as a 3.0 server would, and any other protocol is refused, so every
   client takes the same TLS and compression path; then it forwards the authentication
   exchange unchanged in both directions, except that SCRAM-SHA-256-PLUS is taken out of the
   mechanisms the server offers (channel binding cannot span the relay's two TLS sessions);
4. passes every message through, except that the XLogData CopyData frames the upstream sends in
   COPY BOTH mode (after START_REPLICATION) are compressed exactly as the module's sender does
   (:class:`~receivewal.replication.streampack.StreampackEncoder`: same layout, same
   ``min_size`` rule, one compression state per client connection that survives a timeline
   switch and the next START_REPLICATION on that connection).

Non-replication connections (no ``replication`` startup parameter) are passed through unchanged
(minus the streampack option) and never compressed, so tools like psql work through the relay.

One asyncio event loop serves all connections. Protocol decisions (startup packet parsing, the
choice of algorithm, reframing and compressing the upstream's messages) are pure code in
:mod:`receivewal.relay.protocol`, the settings and access rules in
:mod:`receivewal.relay.config`; the socket work is confined to :class:`Relay` (here:
accepting and admitting) and :mod:`receivewal.relay.client` (one client).
"""


from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Coroutine
from typing import Any

from receivewal.allocator import keep_freed_buffers
from receivewal.relay.admission import LogThrottle, RelayStats
from receivewal.relay.client import (
    Client,
    ClientGone,
    RelaySession,
    close_writer,
    negotiate,
    refuse,
    relay_log,
)
from receivewal.relay.config import (
    RelaySettings,
    client_ssl_context,
    is_allowed,
    upstream_ssl_context,
)
from receivewal.relay.protocol import CANCEL_REQUEST, build_error_response

LINGER = 2.0  # seconds a refused outsider's bytes are discarded before the close
ACCEPT_BACKOFF = 0.5  # seconds without accepting after accept() failed (out of descriptors)


class Relay:
    """Accepts clients and runs a :class:`RelaySession` for each, until :meth:`stop`.

    One asyncio event loop serves every connection (the upstream TLS needs no locking that
    way); compression runs on the loop, which is fine for the handful of receivers a primary
    has. At most ``max_connections`` clients are served at once, and as many more can be
    negotiating (the oldest is closed when one more arrives) and as many in the middle of
    being refused (beyond that a connection is closed at once). :attr:`stats` counts them.
    """

    def __init__(self, settings: RelaySettings) -> None:
        self.settings = settings
        self.ssl_context = upstream_ssl_context(settings.upstream_sslmode,
                                                settings.upstream_sslrootcert)
        self.client_ssl = client_ssl_context(settings)
        self._listener = socket.create_server(  # a full backlog would delay every client
            (settings.listen_host, settings.listen_port), backlog=socket.SOMAXCONN,
            family=socket.AF_INET6 if ":" in settings.listen_host else socket.AF_INET,
        )
        self._listener.setblocking(False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._stop_requested = False
        self._serving: set[asyncio.Task[Any]] = set()
        self._negotiating: dict[asyncio.Task[Any], None] = {}  # the oldest first
        self._refusing: set[asyncio.Task[Any]] = set()
        self._allocator_tuned = False
        self.stats = RelayStats()
        self._throttle = LogThrottle()

    @property
    def address(self) -> tuple[str, int]:
        """The address the relay listens on (the real port when 0 was asked for)."""
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    def serve_forever(self, stop_signals: tuple[signal.Signals, ...] = ()) -> None:
        """Accept clients until :meth:`stop` (or one of ``stop_signals``); then close all."""
        self._allocator_tuned = keep_freed_buffers()
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
        settings = self.settings
        relay_log().info(
            "relay_listening", listen=f"{self.address[0]}:{self.address[1]}",
            upstream=f"{settings.upstream_host}:{settings.upstream_port}",
            upstream_sslmode=settings.upstream_sslmode, client_tls=settings.client_tls,
            client_certificates=settings.tls_ca is not None,
            allow=",".join(str(n) for n in settings.allow),
            max_connections=settings.max_connections, startup_timeout=settings.startup_timeout,
            offered=",".join(settings.offered) or None,
            min_size=settings.min_size, zstd_level=settings.zstd_level,
            allocator_tuned=self._allocator_tuned)
        accepting = asyncio.create_task(self._accept_forever())
        await self._stopping.wait()
        accepting.cancel()
        tasks = [accepting, *self._serving, *self._negotiating, *self._refusing]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._listener.close()
        relay_log().info("relay_stopped")

    def _on_signal(self, signum: signal.Signals) -> None:
        relay_log().info("relay_stopping", signal=signum.name)
        self.stop()

    async def _accept_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, peer = await loop.sock_accept(self._listener)
            except OSError as exc:  # EMFILE and the like: let sessions end, then go on
                relay_log().warning("relay_accept_failed", error=str(exc))
                await asyncio.sleep(ACCEPT_BACKOFF)
                continue
            sock.setblocking(False)
            host, client = str(peer[0]), f"{peer[0]}:{peer[1]}"
            self.stats.accepted += 1
            if is_allowed(host, self.settings.allow):
                self._make_room()
                task = asyncio.create_task(self._handle(sock, client))
                self._negotiating[task] = None
                task.add_done_callback(self._forget)
                self._count()
            elif len(self._refusing) >= self.settings.max_connections:
                self.stats.refused["overloaded"] += 1
                sock.close()  # too many refusals in flight already: no answer
            else:
                self._start(self._refusing, self._refuse_outsider(sock, host, client))

    def _make_room(self) -> None:
        """Close the connections negotiating longest until one more fits among them."""
        while len(self._negotiating) >= self.settings.max_connections:
            oldest = next(iter(self._negotiating))
            del self._negotiating[oldest]
            oldest.cancel()  # _handle closes its socket
            self.stats.evicted += 1
            self._log(relay_log(), "info", "relay_startup_evicted",
                      negotiating=self.settings.max_connections)

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._negotiating.pop(task, None)
        self._serving.discard(task)
        self._count()

    def _count(self) -> None:
        self.stats.serving, self.stats.negotiating = len(self._serving), len(self._negotiating)

    def _log(self, log: Any, level: str, event: str, key: str = "", **fields: Any) -> None:
        """Log ``event`` unless a flood of it was logged a moment ago (then it is counted and
        the next line that goes out says how many it stands for)."""
        extra = self._throttle.admit(f"{event}:{key}")
        if extra is not None:
            getattr(log, level)(event, **fields, **extra)

    @staticmethod
    def _start(tasks: set[asyncio.Task[Any]], work: Coroutine[Any, Any, None]) -> None:
        """Run one connection's work as a task of its own: nothing a client does (a slow
        handshake, silence) holds the accept loop."""
        task = asyncio.create_task(work)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _refuse_outsider(self, sock: socket.socket, host: str, client: str) -> None:
        """Refuse a client outside ``--allow`` before reading anything from it: the FATAL goes
        out at once; what the client sends meanwhile is discarded unread for a moment, so that
        the close does not reset the connection before the client has read the answer."""
        loop = asyncio.get_running_loop()
        message = (f"receivewal relay: connection from {host} refused: {host} is not in the "
                   "relay's --allow list")
        self.stats.refused["outside_allow"] += 1
        self._log(relay_log(), "warning", "relay_client_refused", "outside_allow",
                  client=client, reason=message)
        try:
            await loop.sock_sendall(sock, build_error_response(message, "28000"))
            sock.shutdown(socket.SHUT_WR)
            async with asyncio.timeout(min(LINGER, self.settings.startup_timeout)):
                while await loop.sock_recv(sock, 4096):
                    pass
        except (OSError, TimeoutError):
            pass
        finally:
            sock.close()

    async def _handle(self, sock: socket.socket, peer: str) -> None:
        log = relay_log().bind(client=peer)
        timeout = self.settings.startup_timeout
        task = asyncio.current_task()
        try:
            client = await asyncio.wait_for(negotiate(sock, self.client_ssl), timeout)
        except TimeoutError:
            self.stats.startup_timeouts += 1
            self._log(log, "warning", "relay_startup_timeout", timeout=timeout)
            sock.close()
            return
        except asyncio.CancelledError:  # made room for a newer connection, or the relay stops
            sock.close()
            raise
        except (OSError, ClientGone, asyncio.IncompleteReadError) as exc:
            self._log(log, "info", "relay_startup_failed", error=str(exc) or type(exc).__name__)
            sock.close()
            return
        finally:
            if task is not None:
                self._negotiating.pop(task, None)
        reason = self._tls_refusal(client)
        if reason is None and len(self._serving) >= self.settings.max_connections:
            reason = (f"receivewal relay: too many connections (--max-connections "
                      f"{self.settings.max_connections})", "53300", "too_many_connections")
        if reason is None:
            if task is not None:
                self._serving.add(task)
            self.stats.served += 1
            self._count()
            await RelaySession(self.settings, self.ssl_context, client, log).run()
            return
        self._count()
        message, code, kind = reason
        self.stats.refused[kind] += 1
        self._log(log, "warning", "relay_client_refused", kind, reason=message,
                  client_tls=client.tls)
        try:
            await asyncio.wait_for(refuse(client.writer, message, code), timeout)
        except (OSError, TimeoutError) as exc:
            log.debug("relay_connection_error", error=str(exc) or type(exc).__name__)
        finally:
            await close_writer(client.writer)

    def _tls_refusal(self, client: Client) -> tuple[str, str, str] | None:
        """The message, SQLSTATE and kind of refusal a client's TLS (or its lack) earns."""
        if client.code == CANCEL_REQUEST:
            return None
        if not client.tls and self.settings.client_tls == "require":
            return ("receivewal relay requires TLS from clients: connect with sslmode=require "
                    "or stronger", "28000", "tls_required")
        if client.tls and self.settings.tls_ca and not client.writer.get_extra_info("peercert"):
            return ("receivewal relay requires a client certificate signed by its --tls-ca: "
                    "set sslcert and sslkey", "28000", "client_certificate_required")
        return None
