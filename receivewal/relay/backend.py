"""The upstream's byte stream as the relay forwards it (pure: received bytes in, bytes out).

:class:`BackendStream` owns the buffer the upstream's bytes are received into, in the shape of
asyncio's BufferedProtocol (:meth:`~BackendStream.buffer` hands out the free room,
:meth:`~BackendStream.received` says how much landed there), so a socket read goes straight
into it and an XLogData payload is compressed where it landed, through a memoryview: no copy
of the WAL is made before the compressor. :meth:`~BackendStream.feed` does the same for bytes
received elsewhere (tests). The socket side is :mod:`receivewal.relay.pump`.
"""

from __future__ import annotations

import struct

from receivewal.relay.protocol import AUTH_OK, strip_channel_binding
from receivewal.replication.messages import XLOGDATA_TAG
from receivewal.replication.streampack import (
    MAX_RESTORED_PAYLOAD,
    XLOGDATA_HEADER_SIZE,
    StreampackEncoder,
    StreampackStats,
)

HELD_AUTHENTICATION = 64 * 1024
"""Largest Authentication message held whole to filter it (a SASL offer is a few bytes)."""
HELD_XLOGDATA = XLOGDATA_HEADER_SIZE + MAX_RESTORED_PAYLOAD
"""Largest XLogData held whole to compress it. A larger one (no walsender sends it; the decoder
would refuse it compressed) passes plain, as frames the encoder leaves plain do."""
BUFFER_SIZE = 1024 * 1024
"""The receive buffer's usual size: several 128 KiB XLogData messages per socket read."""
MIN_ROOM = 256 * 1024
"""The least room :meth:`BackendStream.buffer` offers one read: the rest of a message held
at the end of the buffer moves to its start before less is left."""

_LENGTH = struct.Struct(">I")
_COPY_DATA, _AUTHENTICATION = 0x64, 0x52


class BackendStream:
    """Reframes the upstream's byte stream into messages and compresses XLogData (pure).

    Bytes go in through :meth:`buffer` and :meth:`received` (or :meth:`feed`); what comes out
    is the bytes to send to the client. Until the authentication ends, AuthenticationSASL
    messages lose their channel-binding mechanisms (:func:`~receivewal.relay.protocol.
    strip_channel_binding`). Only ``d`` (CopyData) messages starting with ``w`` received
    between CopyBothResponse (``W``) and the end of that COPY are compressed; every other byte
    passes unchanged, and as it arrives: only the messages to change are held whole (bounded by
    :data:`HELD_AUTHENTICATION` and :data:`HELD_XLOGDATA`), so a huge row costs no memory.
    ``authenticating=False`` for a connection that never authenticates (a forwarded
    CancelRequest).

    The buffer is never resized in place (a socket may still hold a view of it while
    :meth:`received` runs): room is made by moving the unfinished message to its start, or by a
    larger buffer for a held message that does not fit, given back once it is forwarded.
    """

    def __init__(self, encoder: StreampackEncoder | None, authenticating: bool = True) -> None:
        self.encoder = encoder
        self.authenticating = authenticating
        self.copy_both = False
        self._buffer = bytearray(BUFFER_SIZE)
        self._start = 0
        """First byte of the buffer not yet forwarded."""
        self._end = 0
        """End of the bytes received into the buffer."""
        self._passing = 0
        """Bytes of the current message still to pass through unchanged."""

    def buffer(self) -> memoryview:
        """The free room at the end of the buffer (at least :data:`MIN_ROOM` bytes), for the
        next read; say how much of it was filled with :meth:`received`."""
        if self._start == self._end:
            self._start = self._end = 0
            if len(self._buffer) > BUFFER_SIZE:  # a large held message has gone
                self._buffer = bytearray(BUFFER_SIZE)
        if len(self._buffer) - self._end < MIN_ROOM:
            self._make_room()
        return memoryview(self._buffer)[self._end :]

    def _make_room(self) -> None:
        pending = self._end - self._start
        if pending + MIN_ROOM > len(self._buffer):
            larger = bytearray(max(pending + MIN_ROOM, 2 * len(self._buffer)))
            larger[:pending] = memoryview(self._buffer)[self._start : self._end]
            self._buffer = larger
        else:  # the same size (no resize): a copy first, as the two ranges may overlap
            self._buffer[:pending] = self._buffer[self._start : self._end]
        self._start, self._end = 0, pending

    def received(self, nbytes: int) -> bytes:
        """``nbytes`` were written at the start of :meth:`buffer`'s room; the bytes for the
        client (the hot loop)."""
        self._end += nbytes
        view = memoryview(self._buffer)
        if self.encoder is None and not self.authenticating:  # nothing to look at
            out = bytes(view[self._start : self._end])
            self._start = self._end
            return out
        pieces: list[bytes] = []
        self._start = self._forward(view, pieces)
        if self.encoder is None and not self.authenticating:  # nothing left to look at
            pieces.append(bytes(view[self._start : self._end]))
            self._start = self._end
        return b"".join(pieces)

    def feed(self, data: bytes | bytearray | memoryview) -> bytes:
        """Bytes received from the upstream in, bytes for the client out."""
        source = memoryview(data)
        out: list[bytes] = []
        while source:
            room = self.buffer()
            size = min(len(room), len(source))
            room[:size] = source[:size]
            out.append(self.received(size))
            source = source[size:]
        return b"".join(out)

    def _forward(self, view: memoryview, out: list[bytes]) -> int:
        """Append what to send for the messages in the buffer; the position reached."""
        buf, pos, end = self._buffer, self._start, self._end
        while pos < end:
            if self._passing:
                size = min(self._passing, end - pos)
                out.append(bytes(view[pos : pos + size]))
                self._passing -= size
                pos += size
                continue
            if end - pos < 5:
                break
            kind = buf[pos]
            size = 1 + _LENGTH.unpack_from(buf, pos + 1)[0]
            copy_data = kind == _COPY_DATA and size > 5
            if copy_data and end - pos < 6:
                break  # the byte that says whether it is XLogData is still to come
            if not self._holds(kind, size, buf[pos + 5] if copy_data else 0):
                self._passing = size
                self._other(kind)
                continue
            if pos + size > end:
                break
            if kind == _COPY_DATA:
                self._compress(view[pos : pos + size], out)
            else:
                out.append(self._authentication(bytes(view[pos : pos + size])))
            pos += size
        return pos

    def _holds(self, kind: int, size: int, first: int) -> bool:
        """Whether a message is held whole: Authentication to filter, XLogData to compress."""
        if kind == _AUTHENTICATION:
            return self.authenticating and size <= HELD_AUTHENTICATION
        return (kind == _COPY_DATA and self.copy_both and self.encoder is not None
                and 5 < size <= 5 + HELD_XLOGDATA and first == XLOGDATA_TAG)

    def _compress(self, message: memoryview, out: list[bytes]) -> None:
        """Append the CopyData to send for a held XLogData ``message`` (``d``, length, frame)."""
        payload = message[5:]
        frame = self.encoder.encode(payload) if self.encoder is not None else payload
        if isinstance(frame, memoryview):  # left plain: the message as it came
            out.append(bytes(message))
            return
        out.append(b"d" + _LENGTH.pack(4 + len(frame)))
        out.append(frame)

    def _authentication(self, message: bytes) -> bytes:
        if int.from_bytes(message[5:9], "big") == AUTH_OK:
            self.authenticating = False
        return strip_channel_binding(message)

    def _other(self, kind: int) -> None:
        if kind == 0x57:  # CopyBothResponse
            self.copy_both = True
        elif kind in b"cCEZ":  # CopyDone, CommandComplete, ErrorResponse, ReadyForQuery
            self.copy_both = False
            self.authenticating = self.authenticating and kind != 0x45

    def stats(self) -> StreampackStats | None:
        """The encoder's statistics (None for a plain connection)."""
        return self.encoder.stats() if self.encoder is not None else None
