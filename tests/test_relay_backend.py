"""The relay's receive buffer: the upstream's bytes land in it as a socket would put them
(BufferedProtocol: ``buffer()`` then ``received(n)``), and the client gets every message in
order, compressed XLogData restorable, whatever the reads' sizes and wherever a message is
cut by the end of the buffer; and the relay process keeps its freed read buffers."""

from __future__ import annotations

import random
import struct

import pytest
from support.servers import free_port
from test_relay import backend_message, running_relay

from receivewal.allocator import keep_freed_buffers
from receivewal.relay.backend import BUFFER_SIZE, MIN_ROOM, BackendStream
from receivewal.replication.messages import build_xlogdata
from receivewal.replication.streampack import StreampackDecoder, StreampackEncoder, is_compressed

KIB = 1024
COPY_BOTH = backend_message(b"W", b"\x00\x00\x00")


def seeded(seed: int) -> random.Random:
    return random.Random(seed)  # noqa: S311 - test data, not cryptography


def wal_like(seed: int, size: int) -> bytes:
    """Compressible bytes that differ from message to message."""
    rng = seeded(seed)
    words = [rng.randbytes(8) for _ in range(32)]
    return b"".join(rng.choice(words) for _ in range(size // 8 + 1))[:size]


def receive(stream: BackendStream, data: bytes, rng: random.Random) -> bytes:
    """Pass ``data`` through ``stream`` the way a socket does: each read fills part or all of
    the room the stream offers, never more."""
    out = bytearray()
    pos = 0
    while pos < len(data):
        room = stream.buffer()
        assert len(room) >= MIN_ROOM
        size = min(len(room), len(data) - pos, rng.choice((1, 5, 6, 4 * KIB, len(room))))
        room[:size] = data[pos : pos + size]
        del room  # a socket's view is gone by the next read
        out += stream.received(size)
        pos += size
    return bytes(out)


def restore(out: bytes, algorithm: str) -> tuple[bytes, int]:
    """The client's bytes with every compressed frame restored; how many were compressed."""
    decoder = StreampackDecoder((algorithm,))
    restored = bytearray()
    compressed = pos = 0
    while pos < len(out):
        kind, length = out[pos : pos + 1], int.from_bytes(out[pos + 1 : pos + 5], "big")
        body = out[pos + 5 : pos + 1 + length]
        compressed += kind == b"d" and is_compressed(body)
        restored += backend_message(kind, bytes(decoder.restore(body)) if kind == b"d" else body)
        pos += 1 + length
    return bytes(restored), compressed


@pytest.mark.parametrize("algorithm", ["zstd", "lz4"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_messages_cut_by_the_end_of_the_buffer_arrive_whole_and_restore(
    algorithm: str, seed: int
) -> None:
    """Several MiB of 128 KiB XLogData (and small keepalives between them) read in pieces of
    1 byte to the whole room: messages straddle the buffer's end and move to its start, and
    the client's bytes restore to the upstream's, every XLogData compressed."""
    rng = seeded(seed)
    frames = [build_xlogdata(i << 20, (i << 20) + 128 * KIB, 7, wal_like(i, 128 * KIB))
              for i in range(40)]
    keepalive = backend_message(b"d", b"k" + bytes(17))
    upstream = COPY_BOTH + b"".join(backend_message(b"d", f) + keepalive for f in frames)
    stream = BackendStream(StreampackEncoder(algorithm), authenticating=False)
    restored, compressed = restore(receive(stream, upstream, rng), algorithm)
    assert restored == upstream
    assert compressed == len(frames)
    assert len(upstream) > 4 * BUFFER_SIZE


def test_a_message_larger_than_the_buffer_is_held_in_a_larger_one_given_back_after() -> None:
    """A 3 MiB XLogData (more than the buffer holds, less than the decoder's limit) is held
    whole and compressed; once it is forwarded the buffer is its usual size again."""
    big = build_xlogdata(0, 3 << 20, 0, wal_like(9, 3 << 20))
    after = build_xlogdata(3 << 20, (3 << 20) + 100, 0, b"z" * 100)
    upstream = COPY_BOTH + backend_message(b"d", big) + backend_message(b"d", after)
    stream = BackendStream(StreampackEncoder("zstd"), authenticating=False)
    assert restore(receive(stream, upstream, seeded(4)), "zstd") == (upstream, 2)
    assert len(stream.buffer()) == BUFFER_SIZE


def test_without_an_encoder_the_bytes_pass_as_they_came() -> None:
    """A plain connection after authentication: every read goes out as it was received."""
    stream = BackendStream(None, authenticating=False)
    data = struct.pack(">I", 7) * 100_000
    assert receive(stream, data, seeded(6)) == data


def test_the_relay_keeps_freed_read_buffers_unless_the_environment_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On glibc the relay raises the heap's trim and mmap thresholds (a read's buffers are
    reused, not faulted in again); a MALLOC_*_THRESHOLD_ variable set by the user wins."""
    with running_relay(free_port()) as relay:  # no upstream needed to start listening
        pass
    assert [e["allocator_tuned"] for e in relay.named("relay_listening")] == [True]
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert keep_freed_buffers() is False
