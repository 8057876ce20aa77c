"""pg_streampack negotiation, decoder and encoder: real captures, round trips, corruption."""

from __future__ import annotations

import hashlib
import json
import random
import struct
import tracemalloc
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import lz4.block
import pytest
import zstandard
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from receivewal.errors import ConfigurationError, StreampackError
from receivewal.replication.messages import (
    KEEPALIVE,
    PrimaryKeepalive,
    build_xlogdata,
    parse_copy_data,
)
from receivewal.replication.negotiation import (
    join_options,
    parse_compression_list,
    split_options,
    take_streampack_option,
    with_streampack_option,
)
from receivewal.replication.streampack import (
    LZ4_DICT_SIZE,
    StreampackDecoder,
    StreampackEncoder,
    is_compressed,
)
from receivewal.wal.lsn import format_lsn, parse_lsn
from receivewal.wal.names import wal_file_name

VECTORS = Path(__file__).parent / "data" / "streampack-vectors"
VECTOR_NAMES = sorted(p.name for p in VECTORS.iterdir() if p.is_dir())
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def seeded(seed: int) -> random.Random:
    """Reproducible test data (not secrets)."""
    return random.Random(seed)  # noqa: S311 - test data, not cryptography


def read_capture(name: str) -> Iterator[bytes]:
    """The CopyData payloads of one capture, in arrival order."""
    data = (VECTORS / name / "capture.bin").read_bytes()
    pos = 0
    while pos < len(data):
        (length,) = struct.unpack_from(">I", data, pos)
        yield data[pos + 4 : pos + 4 + length]
        pos += 4 + length


def manifest(name: str) -> dict[str, object]:
    return json.loads((VECTORS / name / "manifest.json").read_text())  # type: ignore[no-any-return]


# -- real captures ----------------------------------------------------------------------------


def test_every_capture_is_copied_into_the_test_data() -> None:
    """The vectors in the project match the shared set (three captures, both algorithms)."""
    assert VECTOR_NAMES == ["lz4", "zstd", "zstd_min4096"]


@pytest.mark.parametrize("name", VECTOR_NAMES)
def test_capture_decodes_to_the_servers_segment(name: str) -> None:
    """Decoding a real pg_streampack stream rebuilds the server's segment, hash for hash;
    decode() hands out a memoryview and agrees with restore() + parse_copy_data()."""
    info = manifest(name)
    segment_size = int(str(info["wal_segment_size"]))
    start = parse_lsn(str(info["start_lsn"]))
    decoder = StreampackDecoder((str(info["requested"]),))
    twin = StreampackDecoder((str(info["requested"]),))
    segment = bytearray(segment_size)
    covered = 0
    messages = 0
    for frame in read_capture(name):
        messages += 1
        if frame[0] != ord("w"):
            assert isinstance(parse_copy_data(frame), PrimaryKeepalive)
            continue
        msg = decoder.decode(frame)
        assert isinstance(msg.payload, memoryview)
        assert msg == parse_copy_data(twin.restore(frame))
        assert msg.send_time >= 0, "the flag bit is cleared from sendTime"
        offset = msg.wal_start - start
        assert offset == covered, "messages arrive in WAL order without gaps"
        part = bytes(msg.payload[: max(segment_size - offset, 0)])
        segment[offset : offset + len(part)] = part
        covered += len(msg.payload)
    assert covered > segment_size, "the last message crosses into the next segment"
    assert messages == info["messages"]
    stats = decoder.stats()
    assert stats.compressed_frames == info["compressed_messages"]
    assert stats.algorithm == info["requested"]
    assert stats.wal_bytes == covered
    assert stats.saved_bytes > 0
    assert stats.ratio > 4
    expected = info["expected_segments"]
    assert isinstance(expected, dict)
    name_of_segment = wal_file_name(int(str(info["timeline"])), start // segment_size,
                                    segment_size)
    assert hashlib.sha256(segment).hexdigest() == expected[name_of_segment]


@pytest.mark.parametrize("name", VECTOR_NAMES)
def test_received_stream_is_told_apart_in_one_place(name: str) -> None:
    """parse_copy_data alone tells XLogData from keepalives, for a pg_streampack stream too:
    given a decoder's decode it hands out each XLogData restored (flag bit cleared from
    sendTime) and each keepalive as it is, equal to restoring first and parsing after."""
    requested = (str(manifest(name)["requested"]),)
    decoder, twin = StreampackDecoder(requested), StreampackDecoder(requested)
    keepalive = KEEPALIVE.pack(b"k", 77, 88, 1)
    for frame in [*read_capture(name), keepalive]:
        msg = parse_copy_data(frame, decoder.decode)
        assert msg == parse_copy_data(twin.restore(frame))
    assert parse_copy_data(keepalive, decoder.decode) == PrimaryKeepalive(77, 88, True)
    assert decoder.stats() == twin.stats()
    assert decoder.stats().compressed_frames > 0


@pytest.mark.parametrize(("name", "min_size"), [("lz4", 32), ("zstd_min4096", 4096)])
def test_encoder_reproduces_the_modules_frames(name: str, min_size: int) -> None:
    """Re-encoding a decoded capture gives the module's own frames back, byte for byte.

    (The plain zstd capture is left out: the zstandard package compresses one 128 KiB message of
    it differently from the server's libzstd, which is equally valid for any decoder.)
    """
    algorithm = str(manifest(name)["requested"])
    decoder = StreampackDecoder((algorithm,))
    encoder = StreampackEncoder(algorithm, min_size=min_size)
    for frame in read_capture(name):
        assert bytes(encoder.encode(decoder.restore(frame))) == frame
    assert encoder.stats() == decoder.stats()


def test_a_fresh_zstd_decompressor_cannot_read_a_later_message() -> None:
    """zstd is one stream per connection: a new decoder on a later frame fails loudly."""
    frames = [f for f in read_capture("zstd") if f[:1] == b"w"]
    decoder = StreampackDecoder(("zstd",))
    decoder.restore(frames[0])
    with pytest.raises(StreampackError, match=format_lsn(int.from_bytes(frames[2][1:9], "big"))):
        StreampackDecoder(("zstd",)).restore(frames[2])


# -- negotiation ------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("zstd,lz4", ("zstd", "lz4")),
    ("lz4,zstd", ("lz4", "zstd")),
    ("LZ4", ("lz4",)),
    (" Zstd , lz4 ", ("zstd", "lz4")),
    ("none", ()),
    ("NONE", ()),
])
def test_compression_list_keeps_the_order_given(text: str, expected: tuple[str, ...]) -> None:
    assert parse_compression_list(text) == expected


@pytest.mark.parametrize(("text", "complaint"), [
    ("gzip", "unknown algorithm 'gzip'"),
    ("lz4,lz4", "lz4 is named twice"),
    ("zstd,LZ4,lz4", "lz4 is named twice"),
    ("", "empty item"),
    ("zstd,", "empty item"),
    ("none,zstd", "none cannot be combined"),
])
def test_compression_list_refuses_what_the_server_would(text: str, complaint: str) -> None:
    """Unknown and duplicate names make the server refuse the connection: refuse them first."""
    with pytest.raises(ConfigurationError, match=complaint):
        parse_compression_list(text)


@pytest.mark.parametrize(("options", "expected"), [
    (None, "-c pg_streampack.requested=zstd,lz4"),
    ("", "-c pg_streampack.requested=zstd,lz4"),
    ("-c work_mem=64MB", "-c work_mem=64MB -c pg_streampack.requested=zstd,lz4"),
    ("-c pg_streampack.requested=lz4 -c work_mem=1MB",
     "-c work_mem=1MB -c pg_streampack.requested=zstd,lz4"),
    ("-cpg_streampack.requested=lz4", "-c pg_streampack.requested=zstd,lz4"),
    ("--pg_streampack.requested=lz4 --search-path=x",
     "--search-path=x -c pg_streampack.requested=zstd,lz4"),
    ("-c PG_STREAMPACK.REQUESTED=lz4", "-c pg_streampack.requested=zstd,lz4"),
    (r"-c application_name=a\ b", r"-c application_name=a\ b -c pg_streampack.requested=zstd,lz4"),
])
def test_streampack_option_is_added_to_the_users_options(
    options: str | None, expected: str
) -> None:
    assert with_streampack_option(options, ("zstd", "lz4")) == expected


@pytest.mark.parametrize("options", [None, "", "-c pg_streampack.requested=lz4"])
def test_no_algorithms_leaves_options_alone(options: str | None) -> None:
    assert with_streampack_option(options, ()) == options


def test_take_streampack_option_returns_the_request_and_the_rest() -> None:
    """The relay strips the request and forwards the rest, escapes intact."""
    assert take_streampack_option(r"-c a=b\ c -c pg_streampack.requested=lz4,zstd -c x=y") == (
        r"-c a=b\ c -c x=y", "lz4,zstd")
    assert take_streampack_option("-c pg_streampack.requested=zstd") == (None, "zstd")
    assert take_streampack_option("-c work_mem=1MB") == ("-c work_mem=1MB", None)
    assert take_streampack_option(None) == (None, None)


@given(st.lists(st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
                        min_size=1, max_size=12), max_size=6))
def test_options_words_survive_escaping(words: list[str]) -> None:
    """Words with spaces and backslashes come back as they went in, as the server splits them."""
    assert split_options(join_options(words)) == words


# -- round trips ------------------------------------------------------------------------------


@st.composite
def wal_messages(draw: st.DrawFn) -> list[bytes]:
    """XLogData frames and keepalives like a real stream: sizes from 0 to 128 KiB, contiguous
    LSNs, payloads mixing zeros, repeats of earlier bytes (so the lz4 dictionary matters) and
    random noise (so some frames grow when compressed)."""
    rng = seeded(draw(st.integers(0, 2**32)))
    lsn = draw(st.integers(0, 2**40))
    frames: list[bytes] = []
    history = b""
    for size, kind in draw(st.lists(
        st.tuples(st.one_of(st.integers(0, 64), st.integers(0, 131_072)),
                  st.sampled_from(["zeros", "repeat", "noise", "text", "keepalive"])),
        min_size=1, max_size=25,
    )):
        send_time = rng.randrange(0, 2**62)
        if kind == "keepalive":
            frames.append(KEEPALIVE.pack(b"k", lsn, send_time, rng.randrange(2)))
            continue
        if kind == "zeros":
            payload = bytes(size)
        elif kind == "repeat" and history:
            start = rng.randrange(len(history))
            payload = (history[start:] * (size // max(len(history) - start, 1) + 1))[:size]
        elif kind == "noise":
            payload = rng.randbytes(size)
        else:
            payload = (b"INSERT %d pad xxxxxxxx " % rng.randrange(1000) * (size // 20 + 1))[:size]
        frames.append(build_xlogdata(lsn, lsn + size, send_time, payload))
        history = (history + payload)[-2 * LZ4_DICT_SIZE :]
        lsn += size
    return frames


@SETTINGS
@given(wal_messages(), st.sampled_from(["zstd", "lz4"]), st.sampled_from([0, 1, 32, 4096]),
       st.sampled_from([1, 3, -1]))
def test_encoder_then_decoder_gives_the_input_back(
    frames: list[bytes], algorithm: str, min_size: int, level: int
) -> None:
    """Whatever the sizes and contents, compressing the module's way and decoding is lossless;
    frames below min_size and keepalives go plain; both sides count the same statistics."""
    encoder = StreampackEncoder(algorithm, min_size=min_size, zstd_level=level)
    decoder = StreampackDecoder(("zstd", "lz4"))
    for frame in frames:
        wire = encoder.encode(frame)
        small = frame[:1] != b"w" or len(frame) - 25 < min_size
        assert is_compressed(wire) != small
        assert bytes(decoder.restore(memoryview(bytes(wire)))) == frame
    assert replace(encoder.stats(), algorithm=decoder.algorithm) == decoder.stats()
    stats = decoder.stats()
    assert stats.frames == sum(1 for f in frames if f[:1] == b"w")
    assert stats.wal_bytes == sum(len(f) - 25 for f in frames if f[:1] == b"w")
    assert stats.wire_bytes == stats.uncompressed_bytes + stats.compressed_bytes
    assert decoder.algorithm == (algorithm if stats.compressed_frames else None)


def test_incompressible_frames_are_still_flagged_and_counted_as_increased() -> None:
    rng = seeded(7)
    encoder = StreampackEncoder("lz4", min_size=32)
    decoder = StreampackDecoder(("lz4",))
    frame = build_xlogdata(0x1000, 0x2000, 1, rng.randbytes(4096))
    wire = encoder.encode(frame)
    assert is_compressed(wire)
    assert len(wire) > len(frame)
    assert decoder.restore(wire) == frame
    assert decoder.stats().increased == 1
    assert decoder.stats().saved_bytes < 0


def test_lz4_dictionary_is_the_tail_of_the_previous_compressed_message_only() -> None:
    """Spelled out against raw lz4 blocks: a plain frame in between leaves the dictionary as the
    last 64 KiB of the previous compressed message's plaintext."""
    rng = seeded(1)
    first = rng.randbytes(100_000)
    small = b"tiny"
    third = first[-50_000:] + first[:1000]
    encoder = StreampackEncoder("lz4", min_size=32)
    wire = [encoder.encode(build_xlogdata(i, i, 0, p)) for i, p in
            enumerate([first, small, third])]
    assert not is_compressed(wire[1])
    body = bytes(wire[2])[29:]
    assert len(body) < 5000, "the repeat of the first message's tail is found in the dictionary"
    restored = lz4.block.decompress(body, uncompressed_size=len(third),
                                    dict=first[-LZ4_DICT_SIZE:])
    assert restored == third
    decoder = StreampackDecoder(("lz4",))
    assert [bytes(decoder.restore(w))[25:] for w in wire] == [first, small, third]


# -- bad input --------------------------------------------------------------------------------


def compressed_stream(algorithm: str, seed: int, count: int = 4) -> list[bytes]:
    """A few compressible frames, encoded."""
    rng = seeded(seed)
    encoder = StreampackEncoder(algorithm)
    frames = []
    lsn = 0x3000000
    for _ in range(count):
        size = rng.randrange(40, 20_000)
        payload = bytes(rng.choice(b"ab\x00") for _ in range(size))
        frames.append(bytes(encoder.encode(build_xlogdata(lsn, lsn + size, 5, payload))))
        lsn += size
    return frames


def lsn_of(frame: bytes) -> str:
    return format_lsn(int.from_bytes(frame[1:9], "big"))


@SETTINGS
@given(st.sampled_from(["zstd", "lz4"]), st.integers(0, 1000), st.data())
def test_random_corruption_raises_only_streampack_error(
    algorithm: str, seed: int, data: st.DataObject
) -> None:
    """Flipped, inserted or removed bytes anywhere in a compressed frame: the decoder either
    raises StreampackError naming the frame's LSN or returns a frame, never anything else; and
    once it has failed it refuses every later frame."""
    frames = compressed_stream(algorithm, seed)
    target = data.draw(st.integers(0, len(frames) - 1))
    frame = bytearray(frames[target])
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(17, len(frame) - 1))
        action = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        if action == "flip":
            frame[pos] ^= data.draw(st.integers(1, 255))
        elif action == "insert":
            frame[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        elif len(frame) > 1:
            del frame[pos]
    assume(bytes(frame) != frames[target])
    decoder = StreampackDecoder((algorithm,))
    for frame_before in frames[:target]:
        decoder.restore(frame_before)
    error: StreampackError | None = None
    try:
        restored = decoder.restore(bytes(frame))
    except StreampackError as exc:
        error = exc
    if error is None:
        assert isinstance(restored, bytes | memoryview)
        return
    assert lsn_of(frames[target]) in str(error)
    with pytest.raises(StreampackError, match="unusable after an earlier failure"):
        decoder.restore(frames[-1])


@SETTINGS
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=5),
       st.sampled_from([("zstd",), ("lz4",), ("zstd", "lz4"), ()]))
def test_garbage_after_the_flag_raises_only_streampack_error(
    bodies: list[bytes], requested: tuple[str, ...]
) -> None:
    """Flagged frames of random bytes: StreampackError or a restored frame, nothing else."""
    decoder = StreampackDecoder(requested)
    for body in bodies:
        frame = b"w" + bytes(16) + b"\x80" + body
        try:
            restored = decoder.restore(frame)
        except StreampackError as exc:
            message = str(exc)
        else:
            message = ""
            assert restored[17] & 0x80 == 0
        assert not message or "0/0" in message, "errors name the frame's LSN"


@SETTINGS
@given(st.sampled_from(["zstd", "lz4"]), st.integers(0, 1000), st.data())
def test_truncated_frame_is_always_detected(
    algorithm: str, seed: int, data: st.DataObject
) -> None:
    """A compressed frame cut short anywhere (header or body) never decodes."""
    frames = compressed_stream(algorithm, seed)
    target = data.draw(st.integers(0, len(frames) - 1))
    cut = data.draw(st.integers(18, len(frames[target]) - 1))
    decoder = StreampackDecoder((algorithm,))
    for frame_before in frames[:target]:
        decoder.restore(frame_before)
    with pytest.raises(StreampackError, match=lsn_of(frames[target])):
        decoder.restore(frames[target][:cut])


@SETTINGS
@given(st.sampled_from(["zstd", "lz4"]), st.integers(0, 1000), st.data())
def test_wrong_announced_length_is_always_detected(
    algorithm: str, seed: int, data: st.DataObject
) -> None:
    frames = compressed_stream(algorithm, seed)
    target = data.draw(st.integers(0, len(frames) - 1))
    frame = bytearray(frames[target])
    (word,) = struct.unpack_from(">I", frame, 25)
    new_length = data.draw(st.integers(0, (1 << 30) - 1).filter(lambda n: n != word & 0x3FFFFFFF))
    struct.pack_into(">I", frame, 25, (word & 0xC0000000) | new_length)
    decoder = StreampackDecoder((algorithm,))
    for frame_before in frames[:target]:
        decoder.restore(frame_before)
    with pytest.raises(StreampackError, match=lsn_of(frames[target])):
        decoder.restore(bytes(frame))


@pytest.mark.parametrize("algorithm_id", [2, 3])
def test_unknown_algorithm_is_refused(algorithm_id: int) -> None:
    frame = bytearray(compressed_stream("zstd", 1)[0])
    frame[25] = (frame[25] & 0x3F) | (algorithm_id << 6)
    with pytest.raises(StreampackError, match=f"unknown compression algorithm id {algorithm_id}"):
        StreampackDecoder(("zstd", "lz4")).restore(bytes(frame))


def test_compressed_frame_when_none_was_requested_is_refused() -> None:
    frame = compressed_stream("lz4", 2)[0]
    with pytest.raises(StreampackError, match="requested none") as exc:
        StreampackDecoder(()).restore(frame)
    assert lsn_of(frame) in str(exc.value)


def test_algorithm_not_requested_is_refused() -> None:
    with pytest.raises(StreampackError, match="lz4, which was not requested"):
        StreampackDecoder(("zstd",)).restore(compressed_stream("lz4", 3)[0])


def test_switching_algorithm_mid_connection_is_refused() -> None:
    decoder = StreampackDecoder(("zstd", "lz4"))
    decoder.restore(compressed_stream("zstd", 4)[0])
    with pytest.raises(StreampackError, match="switched from zstd to lz4"):
        decoder.restore(compressed_stream("lz4", 4)[0])
    assert decoder.algorithm == "zstd"


def test_plain_and_foreign_frames_pass_unchanged() -> None:
    """Plain XLogData, keepalives and short frames are for the message parser, not for us."""
    decoder = StreampackDecoder(())
    plain = build_xlogdata(1, 2, 3, b"abc")
    keepalive = KEEPALIVE.pack(b"k", 1, 2, 0)
    assert decoder.restore(plain) is plain
    assert decoder.restore(keepalive) is keepalive
    assert decoder.restore(b"w\x00") == b"w\x00"
    assert decoder.restore(b"") == b""
    assert decoder.algorithm is None
    assert decoder.stats().compressed_frames == 0


def test_huge_announced_length_is_refused_before_allocating() -> None:
    frame = bytearray(compressed_stream("lz4", 5)[0])
    struct.pack_into(">I", frame, 25, (1 << 30) | ((1 << 30) - 1))
    with pytest.raises(StreampackError, match="exceeds the largest WAL message"):
        StreampackDecoder(("lz4",)).restore(bytes(frame))


@pytest.mark.parametrize(("kwargs", "complaint"), [
    ({"algorithm": "gzip"}, "unknown pg_streampack algorithm"),
    ({"algorithm": "zstd", "min_size": -1}, "invalid min size"),
    ({"algorithm": "zstd", "zstd_level": 99}, "invalid zstd level"),
])
def test_encoder_refuses_bad_settings(kwargs: dict[str, object], complaint: str) -> None:
    with pytest.raises(ConfigurationError, match=complaint):
        StreampackEncoder(**kwargs)  # type: ignore[arg-type]


# -- hostile input: memory stays bounded ----------------------------------------------------


def zstd_bomb(announced: int, holds: int) -> bytes:
    """A flagged zstd frame that announces ``announced`` bytes and expands to ``holds``."""
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    zeros = bytes(1 << 20)
    body = b"".join(compressor.compress(zeros) for _ in range(holds >> 20))
    body += compressor.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    header = bytearray(build_xlogdata(0x1000000, 0x9000000, 1, b""))
    header[17] |= 0x80
    return bytes(header) + struct.pack(">I", announced) + body  # algorithm 0: zstd


@pytest.mark.parametrize("use", ["decode", "restore"])
def test_a_zstd_bomb_is_refused_before_it_expands(use: str) -> None:
    """A small zstd frame announcing 1 MiB that holds 256 MiB raises StreampackError, and
    decoding it allocates about the announced length, not the bomb (output limit: announced
    length + 1 byte)."""
    frame = zstd_bomb(1 << 20, 256 << 20)
    assert len(frame) < 64 * 1024
    decoder = StreampackDecoder(("zstd",))
    tracemalloc.start()
    try:
        with pytest.raises(StreampackError, match="more than"):
            getattr(decoder, use)(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"decoding a bomb allocated {peak} bytes"
