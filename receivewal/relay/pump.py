"""The upstream's half of a relayed connection once it is set up (asyncio).

:class:`UpstreamPump` takes the upstream transport over from the streams that connected it
(TCP, and TLS when there is some) and becomes its protocol, a BufferedProtocol: the transport
reads straight into the :class:`~receivewal.relay.backend.BackendStream`'s buffer, up to a
megabyte a read, and what one read yields goes to the client in one write. That spares the
stream reader's copies, its future per read and its pause and resume of the socket (two
``epoll_ctl`` calls per read: a 256 KiB read always went past its 128 KiB limit).

Flow control both ways: when the client's transport holds more than its high-water mark (the
client is across the slow link), reading from the upstream pauses until the client drains;
the client's bytes toward the upstream wait in :meth:`UpstreamPump.drained` when the upstream's
transport asks to pause writing.

Every read still makes a few short-lived buffers of up to a megabyte (the bytes passed on, a TLS
transport's encrypted copy). glibc gives such memory back to the kernel as soon as it is freed
(a freed block at the heap's top above 128 KiB is trimmed, and a large block gets its own
mapping), so the next read faults the same pages in again: with TLS toward the client that cost
more CPU than the copies themselves. :func:`receivewal.allocator.keep_freed_buffers` raises both
thresholds for the relay process.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import cast

from receivewal.relay.backend import BackendStream

CLOSE_TIMEOUT = 5.0
class UpstreamPump(asyncio.BufferedProtocol):
    """Forwards the upstream's bytes through a :class:`BackendStream` to the client."""

    def __init__(self, transport: asyncio.Transport, stream: BackendStream,
                 client: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        self.transport = transport
        self.stream = stream
        self.client = client
        self.ended: asyncio.Future[None] = loop.create_future()
        """Done when the upstream has closed its side (end of file, or connection lost)."""
        self.error: BaseException | None = None
        self._lost: asyncio.Future[None] = loop.create_future()
        self._writable = asyncio.Event()
        self._writable.set()
        self._waiting: asyncio.Task[None] | None = None

    @classmethod
    def take_over(cls, upstream: asyncio.StreamWriter, stream: BackendStream,
                  client: asyncio.StreamWriter) -> UpstreamPump:
        """Become the protocol of ``upstream``'s transport. Call it before the upstream has
        been read from since the last write (the stream reader holds nothing then); from here
        on, write and close through the pump, not through ``upstream``."""
        transport = cast(asyncio.Transport, upstream.transport)
        pump = cls(transport, stream, client)
        transport.set_protocol(pump)
        return pump

    # -- the upstream's bytes toward the client --------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.stream.buffer()

    def buffer_updated(self, nbytes: int) -> None:
        out = self.stream.received(nbytes)
        client = self.client.transport
        if client.is_closing():  # the client went away: the session ends
            self.transport.pause_reading()
            self._end(None)
            return
        if not out:
            return
        # A view, not the bytes: a TLS transport slices what SSL_write did not take yet
        # (one record at a time), and a slice of bytes is a copy of the rest, at every record.
        self.client.write(memoryview(out))
        if self._waiting is None and \
                client.get_write_buffer_size() > client.get_write_buffer_limits()[1]:
            self.transport.pause_reading()
            self._waiting = asyncio.ensure_future(self._wait_for_client())

    async def _wait_for_client(self) -> None:
        try:
            with contextlib.suppress(OSError):  # incl. TLS errors: the client's side ends it
                await self.client.drain()
        finally:
            self._waiting = None
            if not self._lost.done():
                self.transport.resume_reading()

    def eof_received(self) -> bool:
        self._end(None)
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc)
        if not self._lost.done():
            self._lost.set_result(None)
        self._writable.set()

    def _end(self, exc: BaseException | None) -> None:
        self.error = self.error or exc
        if not self.ended.done():
            self.ended.set_result(None)

    # -- the client's bytes toward the upstream --------------------------------------------------

    def send(self, data: bytes) -> None:
        """Write ``data`` to the upstream."""
        self.transport.write(data)

    async def drained(self) -> None:
        """Return once the upstream's transport takes more (at once unless it asked to pause)."""
        await self._writable.wait()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def close(self) -> None:
        """Close the upstream connection and wait (a while) for it to be gone."""
        self.transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(self._lost), CLOSE_TIMEOUT)
        except TimeoutError:
            self.transport.abort()
        if self._waiting is not None:
            self._waiting.cancel()
