"""``receivewal relay`` keeps its resources bounded whatever a client or the upstream sends
(issue 18, items 7 and 8)."""

from __future__ import annotations

import socket
import struct

import pytest
from support.memory import peak_rss_kb
from support.servers import PgServer
from test_relay import running_relay

from receivewal.relay.protocol import BackendStream, build_startup_packet
from receivewal.replication.streampack import StreampackEncoder

MB = 1024 * 1024
HUGE_VALUE = 200_000_000  # one DataRow of 200 MB


class RawClient:
    """A protocol 3.0 client on a plain socket that reads messages without keeping them."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)

    def exactly(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            assert chunk, "the relay closed the connection"
            data += chunk
        return data

    def header(self) -> tuple[bytes, int]:
        kind, length = struct.unpack(">cI", self.exactly(5))
        return kind, length - 4

    def until_ready(self) -> None:
        while (message := self.header())[0] != b"Z":
            assert message[0] != b"E", self.exactly(message[1])
            self.exactly(message[1])
        self.exactly(1)

    def count_bytes(self, size: int, byte: bytes) -> int:
        """Read ``size`` bytes in chunks; how many of them are ``byte``."""
        count = 0
        while size:
            chunk = self.sock.recv(min(size, MB))
            assert chunk, "the relay closed the connection"
            count += chunk.count(byte)
            size -= len(chunk)
        return count


@pytest.mark.server
@pytest.mark.slow
def test_a_huge_row_to_a_streampack_client_passes_in_bounded_memory(pg: PgServer) -> None:
    """A replication=database client that asked for streampack runs a query returning one
    200 MB value: the row arrives whole and the relay's peak memory stays under 100 MB."""
    with running_relay(pg.port) as relay:
        client = RawClient(relay.port)
        try:
            client.sock.sendall(build_startup_packet({
                "user": "postgres", "database": "postgres", "replication": "database",
                "options": "-c pg_streampack.requested=zstd"}))
            client.until_ready()
            query = f"SELECT repeat('x', {HUGE_VALUE})".encode() + b"\x00"
            client.sock.sendall(b"Q" + struct.pack(">I", 4 + len(query)) + query)
            kind, length = client.header()
            assert kind == b"T"
            client.exactly(length)
            kind, length = client.header()
            assert (kind, length) == (b"D", 6 + HUGE_VALUE)
            assert struct.unpack(">hi", client.exactly(6)) == (1, HUGE_VALUE)
            assert client.count_bytes(HUGE_VALUE, b"x") == HUGE_VALUE
            client.until_ready()
            peak = peak_rss_kb(relay.pid)
        finally:
            client.sock.close()
    assert peak < 100 * 1024, f"relay peak memory {peak} kB"


def test_messages_that_are_not_compressed_pass_as_their_bytes_arrive() -> None:
    """In COPY BOTH with an encoder, a large CopyData that is not XLogData and a large
    DataRow after the COPY are forwarded piece by piece, not held until complete."""
    stream = BackendStream(StreampackEncoder("zstd"), authenticating=False)
    assert stream.feed(b"W" + struct.pack(">I", 7) + b"\x00\x00\x00") == \
        b"W" + struct.pack(">I", 7) + b"\x00\x00\x00"
    for kind, first in ((b"d", b"k"), (b"D", b"\x00")):
        body = first + bytes(4 * MB - 1)
        message = kind + struct.pack(">I", 4 + len(body)) + body
        pieces = [message[i : i + 64 * 1024] for i in range(0, len(message), 64 * 1024)]
        for piece in pieces[:-1]:
            assert stream.feed(piece) == piece
        assert stream.feed(pieces[-1]) == pieces[-1]
        assert stream.feed(b"c\x00\x00\x00\x04") == b"c\x00\x00\x00\x04"
