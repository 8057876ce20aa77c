"""A TCP proxy for fault tests: forwards 127.0.0.1 traffic, and can cut or stall connections."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable


class TcpProxy:
    """Forwards connections from a local port to ``upstream_port`` on 127.0.0.1, at most
    ``bytes_per_second`` per connection and direction when given (a slow link)."""

    def __init__(self, upstream_port: int, bytes_per_second: float | None = None) -> None:
        self.upstream_port = upstream_port
        self.bytes_per_second = bytes_per_second
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = int(self.listener.getsockname()[1])
        self.forwarding = threading.Event()
        self.forwarding.set()
        self.closed = threading.Event()
        self.lock = threading.Lock()
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.accepted = 0
        self.forwarded = 0  # bytes passed on, both directions, every connection
        self.stall_at: int | None = None
        self.stalled = threading.Event()  # set when a stall_after() threshold is reached
        # given what the server sends, before it is passed on: what the client gets instead
        self.alter_downstream: Callable[[bytes], bytes] | None = None
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.pairs.append((client, upstream))
                self.accepted += 1
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        """Forward between ``a`` and ``b`` until either side ends; this thread alone closes the
        two sockets (closing them elsewhere would leave select() a descriptor of -1)."""
        peers = {a: b, b: a}
        try:
            while not self.closed.is_set():
                if not self.forwarding.wait(0.1):
                    continue
                ready, _, _ = select.select(list(peers), [], [], 0.1)
                for sock in ready:
                    if not self.forwarding.is_set():
                        break
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is b and self.alter_downstream is not None:
                        data = self.alter_downstream(data)
                    peers[sock].sendall(data)
                    self._count(len(data))
                    if self.bytes_per_second:
                        time.sleep(len(data) / self.bytes_per_second)
        except OSError:
            return
        finally:
            for sock in (a, b):
                with contextlib.suppress(OSError):
                    sock.close()

    def _count(self, size: int) -> None:
        with self.lock:
            self.forwarded += size
            if self.stall_at is not None and self.forwarded >= self.stall_at:
                self.stall_at = None
                self.forwarding.clear()
                self.stalled.set()

    def stall_after(self, size: int) -> None:
        """Stall (as :meth:`stall`) once ``size`` more bytes have passed, counted over every
        connection and both directions: a transfer can be caught in the middle. :attr:`stalled`
        is set when it happens."""
        with self.lock:
            self.stalled.clear()
            self.stall_at = self.forwarded + size

    def cut(self) -> None:
        """End every open connection (both directions), as a broken network would: both peers
        see the end at once, and each pump closes its sockets when it wakes on it."""
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for a, b in pairs:
            for sock in (a, b):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def stall(self) -> None:
        """Stop forwarding: connections stay open but nothing passes."""
        self.forwarding.clear()

    def resume(self) -> None:
        """Forward again."""
        self.forwarding.set()

    def close(self) -> None:
        """Stop accepting and drop everything."""
        self.closed.set()
        self.forwarding.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() of the thread
        self.listener.close()
        self.cut()


class SilentListener:
    """Accepts TCP connections on 127.0.0.1 and never answers a byte: a store that hangs."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = int(self.listener.getsockname()[1])
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(client)  # kept open, never read from or written to

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.close()
        for client in self.held:
            client.close()
