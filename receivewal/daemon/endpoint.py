"""The HTTP endpoint that serves ``/metrics``: a WSGI server that no client can exhaust.

prometheus-client's ``start_http_server`` gives every connection a thread that waits for the
request forever, so idle connections pile up until the process runs out of file descriptors
and the daemon with it. This server holds at most :data:`MAX_CONNECTIONS` connections at once
(one more is closed as soon as it is accepted), gives each read and write of a connection
:data:`IO_TIMEOUT` seconds (an idle client is dropped) and each connection
:data:`REQUEST_TIMEOUT` seconds in all, from accept to the last byte of the answer (a client
that sends its request a byte at a time is dropped too: it would otherwise hold a slot for as
long as it likes), and when ``accept`` itself fails for lack of descriptors it pauses instead of
spinning. It is imported only when metrics are served.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from receivewal.addresses import Address, format_address
from receivewal.errors import OUT_OF_DESCRIPTORS, ConfigurationError
from receivewal.logs import get_logger

MAX_CONNECTIONS = 8  # a scraper or two, with room for a human with curl
IO_TIMEOUT = 5.0  # seconds a connection may take for each read or write
REQUEST_TIMEOUT = 5.0  # seconds a connection may take in all (a scrape takes milliseconds)
ACCEPT_PAUSE = 0.2  # seconds to wait after accept failed for lack of descriptors


class QuietHandler(WSGIRequestHandler):
    """A request handler with a socket timeout and a deadline for the whole connection, that
    logs nothing per request."""

    timeout = IO_TIMEOUT

    def setup(self) -> None:
        """Arm the connection's deadline: when it passes, the socket is shut down both ways,
        so that a read or write in progress ends at once."""
        self._deadline_lock = threading.Lock()
        self._finished = False
        self._deadline = threading.Timer(REQUEST_TIMEOUT, self._expire)
        self._deadline.daemon = True
        self._deadline.start()
        super().setup()

    def _expire(self) -> None:
        with self._deadline_lock:  # never after finish: the server closes the socket then
            if not self._finished:
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)

    def finish(self) -> None:
        with self._deadline_lock:
            self._finished = True
        self._deadline.cancel()
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing (a scrape every few seconds is not news)."""


class BoundedServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most :data:`MAX_CONNECTIONS` of them at once."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: Address, family: socket.AddressFamily) -> None:
        self.address_family = family  # read by TCPServer.__init__ when it creates the socket
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__((address.host, address.port), QuietHandler)

    def get_request(self) -> tuple[socket.socket, Any]:
        """accept(); out of descriptors, wait a moment first (the socket stays readable, and
        the serving loop would otherwise spin on it)."""
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in OUT_OF_DESCRIPTORS:
                time.sleep(ACCEPT_PAUSE)
            raise

    def verify_request(self, request: Any, client_address: Any) -> bool:
        """Take a slot, or refuse the connection (the caller closes it) when none is free."""
        return self._slots.acquire(blocking=False)

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()  # no thread will release it
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away: a debug line, never a traceback."""
        error = sys.exc_info()[1]
        get_logger().debug("metrics_request_failed", client=str(client_address[0]),
                           error=str(error) or type(error).__name__)


def serve_collector(address: Address, collector: Any) -> BoundedServer:
    """Serve ``collector``'s metrics (a prometheus-client collector) at ``/metrics`` on
    ``address``, in a registry of its own (never the global one), from a daemon thread;
    ConfigurationError when the address cannot be bound (in use, not local...)."""
    from prometheus_client import CollectorRegistry, make_wsgi_app  # noqa: PLC0415

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        return serve_wsgi(address, make_wsgi_app(registry))
    except OSError as exc:
        raise ConfigurationError(f"cannot serve metrics on {format_address(address)}: "
                                 f"{exc.strerror or exc}") from exc


def serve_wsgi(address: Address, app: Any) -> BoundedServer:
    """Bind ``address`` and serve ``app`` from a daemon thread; raises OSError."""
    infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    server = BoundedServer(Address(str(sockaddr[0]), address.port), family)
    server.set_app(app)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
