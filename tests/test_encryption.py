"""Encryption at rest (issue 28 §4): age files through pyrage, every path of it.

What receivewal encrypts, the ``age`` command line decrypts, and what ``age`` encrypts,
receivewal decrypts (both run here as subprocesses); a wrong key, a truncated file and a
tampered one are each a clear error naming the file, never garbage; keys are read as
``age-keygen`` writes them; rotation (add a recipient, later drop the old one) leaves every
file readable by exactly the keys it should be.
"""

from __future__ import annotations

import ast
import errno
import io
import os
import random
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.agekeys import KeyPair, age_command, age_keygen, new_identity_file

from receivewal.archive.agestream import (
    DecryptionFailed,
    Encryptor,
    decrypt_bytes,
    decrypt_stream,
    decrypting_reader,
    encrypt_bytes,
    encrypt_stream,
)
from receivewal.archive.codecs import GzipCompressor, ZstdCompressor
from receivewal.archive.compression import CorruptFile, decompress_chunks
from receivewal.archive.directory import Archive
from receivewal.archive.encryption import (
    KeyFileError,
    Keys,
    load_identity_file,
    parse_recipient,
    recipients_of,
)
from receivewal.archive.identity import ArchiveIdentity
from receivewal.archive.recipients import (
    NotARecipient,
    RecipientSet,
    adopting,
    check_stanzas,
    parse_recipients_file,
    read_age_header,
    recipients_file_text,
    require_readable,
)
from receivewal.errors import ConfigurationError, ReceivewalError

ROOT = Path(__file__).resolve().parent.parent
CHUNK = 64 << 10  # age's STREAM chunk
SIZES = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 1_000_003]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[KeyPair, KeyPair]:
    """Two identity files, written by age-keygen itself."""
    where = tmp_path_factory.mktemp("keys")
    return age_keygen(where / "alice.txt"), age_keygen(where / "bob.txt")


def payload(size: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(size)  # noqa: S311 - reproducible data, not a key


# -- the paths ---------------------------------------------------------------------------------
def _encrypt_stream(data: bytes, recipients: RecipientSet) -> bytes:
    out = io.BytesIO()
    assert encrypt_stream(io.BytesIO(data), out, recipients) == len(out.getvalue())
    return out.getvalue()


def _encrypt_pushed(data: bytes, recipients: RecipientSet) -> bytes:
    with Encryptor(recipients, window=256 << 10) as encryptor:
        parts = [encryptor.update(data[i:i + 70_001]) for i in range(0, len(data), 70_001)]
        parts.append(encryptor.finish())
    return b"".join(parts)


def _encrypt_file(data: bytes, recipients: RecipientSet) -> bytes:
    """encrypt_stream from a file to a file: pyrage opens both itself."""
    with tempfile.TemporaryDirectory() as where:
        source, target = Path(where, "in"), Path(where, "out.age")
        source.write_bytes(data)
        with source.open("rb") as src, target.open("wb") as out:
            written = encrypt_stream(src, out, recipients)
            assert out.tell() == written  # the writer's own position is past what was written
        assert written == target.stat().st_size
        return target.read_bytes()


ENCRYPTIONS: dict[str, Callable[[bytes, RecipientSet], bytes]] = {
    "stream": _encrypt_stream, "bytes": encrypt_bytes, "pushed": _encrypt_pushed,
    "file": _encrypt_file}


def _decrypt_stream(data: bytes, keys: Keys, file: str,
                    recipients: RecipientSet | None = None) -> bytes:
    out = io.BytesIO()
    decrypt_stream(io.BytesIO(data), out, keys, file=file, recipients=recipients)
    return out.getvalue()


def _decrypt_bytes(data: bytes, keys: Keys, file: str,
                   recipients: RecipientSet | None = None) -> bytes:
    return decrypt_bytes(data, keys, file=file, recipients=recipients)


def _decrypt_reader(data: bytes, keys: Keys, file: str,
                    recipients: RecipientSet | None = None) -> bytes:
    with decrypting_reader(io.BytesIO(data), keys, file=file, recipients=recipients,
                           window=128 << 10) as reader:
        parts = []
        while piece := reader.read(50_000):
            parts.append(piece)
    return b"".join(parts)


def _decrypt_file(data: bytes, keys: Keys, file: str,
                  recipients: RecipientSet | None = None) -> bytes:
    """decrypt_stream from a file to a file: pyrage opens both itself."""
    with tempfile.TemporaryDirectory() as where:
        source, target = Path(where, "in.age"), Path(where, "out")
        source.write_bytes(data)
        with source.open("rb") as src, target.open("wb") as out:
            written = decrypt_stream(src, out, keys, file=file, recipients=recipients)
        assert written == target.stat().st_size
        return target.read_bytes()


DECRYPTIONS: dict[str, Callable[..., bytes]] = {
    "stream": _decrypt_stream, "bytes": _decrypt_bytes, "reader": _decrypt_reader,
    "file": _decrypt_file}


def age_decrypt(path: Path, key: KeyPair) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([age_command(), "-d", "-i", str(key.path), str(path)],
                          capture_output=True, timeout=60, check=False)


# -- interoperation with the age command line --------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("how", ENCRYPTIONS)
def test_age_decrypts_what_every_encryption_path_writes(
        pair: tuple[KeyPair, KeyPair], tmp_path: Path, how: str, size: int) -> None:
    alice, bob = pair
    data = payload(size)
    sealed = tmp_path / "000000010000000000000004.age"
    sealed.write_bytes(ENCRYPTIONS[how](data, recipients_of([alice.recipient, bob.recipient])))
    for key in (alice, bob):
        done = age_decrypt(sealed, key)
        assert done.returncode == 0, done.stderr
        assert done.stdout == data


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("how", DECRYPTIONS)
def test_every_decryption_path_reads_what_age_encrypts(
        pair: tuple[KeyPair, KeyPair], tmp_path: Path, how: str, size: int) -> None:
    alice, bob = pair
    data = payload(size, seed=size)
    sealed = tmp_path / "f.age"
    subprocess.run([age_command(), "-r", alice.recipient, "-r", bob.recipient, "-o",
                    str(sealed)], input=data, check=True, timeout=60)
    for key in (alice, bob):
        assert DECRYPTIONS[how](sealed.read_bytes(), load_identity_file(str(key.path)),
                                str(sealed)) == data


def test_age_encrypts_to_a_recipients_file_as_receivewal_writes_it(
        pair: tuple[KeyPair, KeyPair], tmp_path: Path) -> None:
    """``F.recipients`` is an age recipients file: ``age -R`` takes it, and the file it writes
    has as many X25519 stanzas as the recipients file lists."""
    alice, bob = pair
    both = recipients_of([alice.recipient, bob.recipient])
    listing = tmp_path / "f.age.recipients"
    listing.write_bytes(recipients_file_text(both))
    sealed = tmp_path / "f.age"
    subprocess.run([age_command(), "-R", str(listing), "-o", str(sealed)], input=b"wal",
                   check=True, timeout=60)
    header = read_age_header(sealed.read_bytes(), str(sealed))
    check_stanzas(header, parse_recipients_file(listing.read_bytes(), str(listing)), str(sealed))
    assert decrypt_bytes(sealed.read_bytes(), load_identity_file(str(bob.path)),
                         file=str(sealed)) == b"wal"


def test_a_compressed_segment_is_compressed_then_encrypted_and_age_then_gzip_read_it(
        pair: tuple[KeyPair, KeyPair], tmp_path: Path) -> None:
    """``NAME.gz.age``: ``age -d | gzip -dc`` gives the segment; ``NAME.zst.age``: age, then
    receivewal's zstd reader."""
    alice, _ = pair
    segment = payload(1 << 20) + bytes(3 << 20)  # WAL, then the zeros of a switched segment
    to = recipients_of([alice.recipient])
    for suffix, compressor in ((".gz", GzipCompressor(None)), (".zst", ZstdCompressor(None))):
        packed = compressor.begin() + compressor.compress(segment) + compressor.finish()
        sealed = tmp_path / f"000000010000000000000004{suffix}.age"
        sealed.write_bytes(encrypt_bytes(packed, to))
        done = age_decrypt(sealed, alice)
        assert done.returncode == 0, done.stderr
        assert done.stdout == packed
        if suffix == ".gz":
            unpacked = subprocess.run(["gzip", "-dc"], input=done.stdout, capture_output=True,
                                      check=True, timeout=60).stdout
        else:
            unpacked = b"".join(decompress_chunks(io.BytesIO(done.stdout), "zstd"))
        assert unpacked == segment


def test_a_decrypting_reader_feeds_the_at_rest_decoder_with_its_size_cap(
        pair: tuple[KeyPair, KeyPair]) -> None:
    alice, _ = pair
    keys = load_identity_file(str(alice.path))
    segment = payload(300_000) + bytes(700_000)
    compressor = ZstdCompressor(None)
    sealed = encrypt_bytes(compressor.compress(segment) + compressor.finish(),
                           recipients_of([alice.recipient]))
    with decrypting_reader(io.BytesIO(sealed), keys, file="x.zst.age") as reader:
        assert b"".join(decompress_chunks(reader, "zstd", cap=len(segment))) == segment
    with decrypting_reader(io.BytesIO(sealed), keys, file="x.zst.age") as reader, \
            pytest.raises(CorruptFile, match="holds more than 999999 bytes"):
        b"".join(decompress_chunks(reader, "zstd", cap=len(segment) - 1))


# -- a wrong key -------------------------------------------------------------------------------
@pytest.mark.parametrize("how", DECRYPTIONS)
def test_a_wrong_key_is_a_clear_error_naming_the_file_and_the_keys(
        pair: tuple[KeyPair, KeyPair], how: str) -> None:
    alice, bob = pair
    to_alice = recipients_of([alice.recipient])
    sealed = encrypt_bytes(payload(200_000), to_alice)
    bob_keys = load_identity_file(str(bob.path))
    with pytest.raises(NotARecipient) as known:
        DECRYPTIONS[how](sealed, bob_keys, "/srv/a/000000010000000000000004.age", to_alice)
    assert str(known.value) == (
        f'"/srv/a/000000010000000000000004.age" is encrypted to {alice.recipient} (recipient '
        f'set {to_alice.fingerprint}); the identity file "{bob.path}" holds {bob.recipient}: '
        "none of them can decrypt it")
    with pytest.raises(NotARecipient) as unknown:  # no recipients file at hand: age's answer
        DECRYPTIONS[how](sealed, bob_keys, "/srv/a/000000010000000000000004.age")
    assert str(unknown.value) == (
        f'"/srv/a/000000010000000000000004.age" cannot be decrypted with the identity file '
        f'"{bob.path}" ({bob.recipient}): it is not encrypted to any of its keys (or its age '
        "header is damaged)")


def test_a_wrong_key_writes_nothing(pair: tuple[KeyPair, KeyPair]) -> None:
    alice, bob = pair
    out = io.BytesIO()
    with pytest.raises(NotARecipient):
        decrypt_stream(io.BytesIO(encrypt_bytes(payload(500_000), recipients_of(
            [alice.recipient]))), out, load_identity_file(str(bob.path)), file="f.age")
    assert out.getvalue() == b""


# -- truncated, tampered -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def sealed_file(pair: tuple[KeyPair, KeyPair]) -> tuple[bytes, bytes, int]:
    """(plaintext, its age file for alice, the header's length)."""
    data = payload(3 * CHUNK + 1000, seed=7)
    sealed = encrypt_bytes(data, recipients_of([pair[0].recipient]))
    return data, sealed, read_age_header(sealed, "f").length


def _cuts(header: int, total: int) -> list[int]:
    payload_start = header + 16  # the STREAM nonce
    return [0, 10, header - 1, header, payload_start, payload_start + 1,
            payload_start + CHUNK + 16, payload_start + 2 * (CHUNK + 16), total - 17, total - 1]


@pytest.mark.parametrize("how", DECRYPTIONS)
def test_a_truncated_file_is_a_clear_error_never_a_shorter_plaintext(
        pair: tuple[KeyPair, KeyPair], sealed_file: tuple[bytes, bytes, int], how: str) -> None:
    _, sealed, header = sealed_file
    keys = load_identity_file(str(pair[0].path))
    for cut in _cuts(header, len(sealed)):
        with pytest.raises(DecryptionFailed, match=r'^"/a/f.age" is damaged, truncated or was '
                                                   "tampered with: age cannot decrypt it"):
            DECRYPTIONS[how](sealed[:cut], keys, "/a/f.age")


@pytest.mark.parametrize("how", DECRYPTIONS)
def test_a_tampered_file_is_a_clear_error_never_garbage(
        pair: tuple[KeyPair, KeyPair], sealed_file: tuple[bytes, bytes, int], how: str) -> None:
    alice = pair[0]
    _, sealed, header = sealed_file
    keys = load_identity_file(str(alice.path))
    to_alice = recipients_of([alice.recipient])
    in_stanza_body = sealed.index(b"\n", sealed.index(b"-> X25519")) + 5
    in_mac = header - 10
    for where in (in_mac, header + 3, header + 16 + 100, header + 16 + CHUNK + 5,
                  len(sealed) - 1):
        bad = bytearray(sealed)
        bad[where] ^= 0x01
        with pytest.raises(DecryptionFailed, match=r'^"/a/f\.age" is damaged'):
            DECRYPTIONS[how](bytes(bad), keys, "/a/f.age", to_alice)
    with pytest.raises(DecryptionFailed, match=r'^"/a/f\.age" is damaged'):
        DECRYPTIONS[how](sealed + b"\0", keys, "/a/f.age", to_alice)  # appended to
    # the stanza that wraps alice's file key: age tells this from a wrong key only with the
    # recipients file at hand, which says the file is alice's
    bad = bytearray(sealed)
    # another base64 letter, so the header still parses: a flipped bit can leave the alphabet
    bad[in_stanza_body] = ord("B") if bad[in_stanza_body] == ord("A") else ord("A")
    with pytest.raises(DecryptionFailed) as caught:
        DECRYPTIONS[how](bytes(bad), keys, "/a/f.age", to_alice)
    assert str(caught.value) == (
        f'"/a/f.age": its age header does not open with {alice.recipient} of the identity file '
        f'"{alice.path}", which its recipients file lists: the header is damaged or was '
        "tampered with")
    with pytest.raises(NotARecipient, match="or its age header is damaged"):
        DECRYPTIONS[how](bytes(bad), keys, "/a/f.age")


@st.composite
def damaged(draw: st.DrawFn, sealed: bytes) -> bytes:
    kind = draw(st.sampled_from(["flip", "cut", "insert", "replace"]))
    where = draw(st.integers(0, len(sealed) - 1))
    if kind == "flip":
        bad = bytearray(sealed)
        bad[where] ^= draw(st.integers(1, 255))
        return bytes(bad)
    if kind == "cut":
        return sealed[:where]
    junk = draw(st.binary(min_size=1, max_size=40))
    if kind == "insert":
        return sealed[:where] + junk + sealed[where:]
    replaced = sealed[:where] + junk + sealed[where + len(junk):]
    return replaced if replaced != sealed else sealed[:where]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), how=st.sampled_from(sorted(DECRYPTIONS)), known=st.booleans())
def test_any_damage_raises_only_the_projects_errors_never_returns(
        data: st.DataObject, how: str, known: bool) -> None:
    pair = _KEYS.get()
    sealed = _KEYS.sealed
    bad = data.draw(damaged(sealed))
    recipients = recipients_of([pair.recipient]) if known else None
    with pytest.raises(ReceivewalError):
        DECRYPTIONS[how](bad, load_identity_file(str(pair.path)), "g.age", recipients)


@settings(max_examples=150, deadline=None)
@given(garbage=st.binary(max_size=2000), prefix=st.sampled_from(
    [b"", b"age-encryption.org/v1\n", b"age-encryption.org/v1\n-> X25519 ",
     b"-----BEGIN AGE ENCRYPTED FILE-----\n"]), how=st.sampled_from(sorted(DECRYPTIONS)))
def test_garbage_raises_only_the_projects_errors(garbage: bytes, prefix: bytes, how: str) -> None:
    pair = _KEYS.get()
    with pytest.raises(ReceivewalError):
        DECRYPTIONS[how](prefix + garbage, load_identity_file(str(pair.path)), "g.age")


class _Keys:
    """One identity for the hypothesis tests (a fixture's scope does not reach @given)."""

    def __init__(self) -> None:
        self._pair: KeyPair | None = None
        self.sealed = b""

    def get(self) -> KeyPair:
        if self._pair is None:
            import tempfile  # noqa: PLC0415

            where = Path(tempfile.mkdtemp(prefix="receivewal-age-"))
            self._pair = new_identity_file(where / "key.txt")
            self.sealed = encrypt_bytes(payload(2 * CHUNK + 77, seed=3),
                                        recipients_of([self._pair.recipient]))
        return self._pair


_KEYS = _Keys()
_KEYS.get()


# -- readers and writers that fail ---------------------------------------------------------------
class _Failing(io.RawIOBase):
    """A writer whose ``n``-th write fails with ENOSPC."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.calls = n, 0

    def writable(self) -> bool:
        return True

    def write(self, data: object) -> int:
        self.calls += 1
        if self.calls == self.n:
            raise OSError(errno.ENOSPC, "No space left on device")
        return len(memoryview(data))  # type: ignore[arg-type]


@pytest.mark.parametrize("failing", [1, 2, "last"])
def test_a_writers_error_comes_through_even_on_pyrages_last_flush(
        pair: tuple[KeyPair, KeyPair], failing: int | str) -> None:
    """pyrage drops an error of its last buffered write (a last chunk shorter than its 8 KiB
    buffer is written when the buffer is dropped): receivewal does not."""
    to = recipients_of([pair[0].recipient])
    data = payload(2 * CHUNK + 100)
    writes = _Failing(0)
    encrypt_stream(io.BytesIO(data), writes, to)
    n = writes.calls if failing == "last" else int(failing)
    with pytest.raises(OSError, match="No space left") as caught:
        encrypt_stream(io.BytesIO(data), _Failing(n), to)
    assert caught.value.errno == errno.ENOSPC
    keys = load_identity_file(str(pair[0].path))
    sealed = encrypt_bytes(data, to)
    writes = _Failing(0)
    decrypt_stream(io.BytesIO(sealed), writes, keys, file="f.age")
    n = writes.calls if failing == "last" else int(failing)
    with pytest.raises(OSError, match="No space left"):
        decrypt_stream(io.BytesIO(sealed), _Failing(n), keys, file="f.age")


def test_a_readers_error_comes_through_as_it_was_raised(pair: tuple[KeyPair, KeyPair]) -> None:
    class Broken(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def read(self, size: int = -1) -> bytes:
            raise OSError(errno.EIO, "Input/output error")

    to = recipients_of([pair[0].recipient])
    with pytest.raises(OSError, match="Input/output error"):
        encrypt_stream(Broken(), io.BytesIO(), to)
    keys = load_identity_file(str(pair[0].path))
    with pytest.raises(OSError, match="Input/output error"):
        decrypt_stream(Broken(), io.BytesIO(), keys, file="f.age")
    with pytest.raises(OSError, match="Input/output error"), \
            decrypting_reader(Broken(), keys, file="f.age") as reader:
        reader.read()


def test_file_to_file_the_bytes_never_pass_through_python(
        pair: tuple[KeyPair, KeyPair], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given two files, encrypt_stream and decrypt_stream let pyrage open them (issue 36
    item 3: no call into Python per 8 KiB); a file opened past its start, or a target that
    is not empty, goes the Python way, and both give what age reads."""
    import pyrage  # noqa: PLC0415 - the test's own look at which call runs

    from receivewal.archive import agestream  # noqa: PLC0415

    calls: list[str] = []

    class Watched:
        def __getattr__(self, name: str) -> object:
            calls.append(name)
            return getattr(pyrage, name)

    monkeypatch.setattr(agestream, "pyrage", Watched)
    alice = pair[0]
    data = payload(3 * CHUNK + 5)
    plain, sealed, back = tmp_path / "in", tmp_path / "in.age", tmp_path / "out"
    plain.write_bytes(b"skip" + data)
    with plain.open("rb") as src, sealed.open("wb") as out:
        src.read(4)  # past its start: pyrage would read it from its start
        encrypt_stream(src, out, recipients_of([alice.recipient]))
    assert [c for c in calls if c.endswith(("_io", "_file"))] == ["encrypt_io"]
    plain.write_bytes(data)
    calls.clear()
    with plain.open("rb") as src, sealed.open("wb") as out:
        written = encrypt_stream(src, out, recipients_of([alice.recipient]))
    assert [c for c in calls if c.endswith(("_io", "_file"))] == ["encrypt_file"]
    assert written == sealed.stat().st_size
    assert age_decrypt(sealed, alice).stdout == data
    calls.clear()
    with sealed.open("rb") as src, back.open("wb") as out:
        assert decrypt_stream(src, out, load_identity_file(str(alice.path)),
                              file=str(sealed)) == len(data)
        out.write(b"!")  # the writer's position is past what pyrage wrote
    assert [c for c in calls if c.endswith(("_io", "_file"))] == ["decrypt_file"]
    assert back.read_bytes() == data + b"!"


def test_file_to_file_a_full_disk_is_the_oserror_it_is() -> None:
    """pyrage's file to file calls say an OS error in their text: it comes back as the
    OSError a Python writer raises (a full disk is not a damaged file)."""
    import pyrage  # noqa: PLC0415

    from receivewal.archive.agestream import _os_error_of  # noqa: PLC0415

    full = _os_error_of(pyrage.EncryptError("No space left on device (os error 28)"))
    assert full is not None
    assert full.errno == errno.ENOSPC
    assert _os_error_of(OSError("decryption error")) is None
    assert _os_error_of(pyrage.DecryptError("No matching keys found")) is None


def test_the_pushed_encryptor_copies_what_it_is_given(pair: tuple[KeyPair, KeyPair]) -> None:
    """The backup's COPY buffers are reused once handed over: the encryptor keeps a copy."""
    buffer = bytearray(payload(300_000))
    original = bytes(buffer)
    with Encryptor(recipients_of([pair[0].recipient]), window=64 << 10) as encryptor:
        out = encryptor.update(memoryview(buffer))
        buffer[:] = bytes(len(buffer))
        out += encryptor.finish()
    assert decrypt_bytes(out, load_identity_file(str(pair[0].path)), file="f") == original


def test_giving_up_stops_the_worker_threads(pair: tuple[KeyPair, KeyPair]) -> None:
    before = threading.active_count()
    to = recipients_of([pair[0].recipient])
    encryptor = Encryptor(to, window=64 << 10)
    encryptor.update(payload(1 << 20))
    encryptor.close()
    sealed = encrypt_bytes(payload(2 << 20), to)
    reader = decrypting_reader(io.BytesIO(sealed), load_identity_file(str(pair[0].path)),
                               file="f", window=64 << 10)
    assert len(reader.read(1000)) == 1000
    reader.close()
    assert threading.active_count() == before


# -- keys --------------------------------------------------------------------------------------
def test_an_identity_file_reads_as_age_keygen_writes_it(pair: tuple[KeyPair, KeyPair]) -> None:
    alice = pair[0]
    text = alice.path.read_text()
    assert text.startswith("# created: ")
    assert "# public key: " in text
    keys = load_identity_file(str(alice.path))
    assert keys.public == {alice.recipient}
    assert "AGE-SECRET-KEY" not in repr(keys)


def test_an_identity_file_may_hold_several_keys_and_be_a_pipe(
        pair: tuple[KeyPair, KeyPair], tmp_path: Path) -> None:
    alice, bob = pair
    fifo = tmp_path / "keys"
    os.mkfifo(fifo)
    both = alice.path.read_text() + "\n\n# the next one\n" + bob.path.read_text()
    writer = threading.Thread(target=fifo.write_text, args=(both,))
    writer.start()
    keys = load_identity_file(str(fifo))
    writer.join()
    assert keys.public == {alice.recipient, bob.recipient}


@pytest.mark.parametrize(("content", "complaint"), [
    ("", "holds no identity"),
    ("# created: now\n\n", "holds no identity"),
    ("age1yhd36h9xfajltu60vfwrg0r98v9529vkn98u4n2vyac40wnjpqwse0zlew\n",
     "line 1 holds a recipient \\(a public key\\), not an identity"),
    ("# a comment\nssh-ed25519 AAAAC3Nz\n", "line 2 is not an age X25519 identity"),
    ("AGE-SECRET-KEY-1" + "Q" * 58 + "\n", "line 1 is not a valid age X25519 identity"),
    (b"\xff\xfe".decode("latin-1"), "is not text"),
])
def test_a_bad_identity_file_is_a_clear_error_naming_it_and_never_its_secret(
        tmp_path: Path, pair: tuple[KeyPair, KeyPair], content: str, complaint: str) -> None:
    path = tmp_path / "identity.txt"
    path.write_bytes(content.encode("latin-1" if "\xff" in content else "utf-8"))
    with pytest.raises(KeyFileError, match=complaint) as caught:
        load_identity_file(str(path))
    assert f'identity file "{path}"' in str(caught.value)
    assert "AGE-SECRET-KEY-1Q" not in str(caught.value)
    assert isinstance(caught.value, ConfigurationError)
    # a key with one character changed: the message never shows it
    real = pair[0].path.read_text().splitlines()[-1]
    damaged_key = real[:-3] + ("A" if real[-3] != "A" else "C") + real[-2:]
    path.write_text(f"# mine\n{damaged_key}\n")
    with pytest.raises(KeyFileError, match="line 2 is not a valid") as caught:
        load_identity_file(str(path))
    assert damaged_key not in str(caught.value)
    assert real not in str(caught.value)


def test_a_missing_or_unreadable_identity_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match=f'^identity file "{tmp_path}/none" does not exist$'):
        load_identity_file(str(tmp_path / "none"))
    with pytest.raises(KeyFileError, match=f'^cannot read identity file "{tmp_path}": Is a '
                                           "directory$"):
        load_identity_file(str(tmp_path))
    big = tmp_path / "big"
    big.write_bytes(b"#" * ((1 << 20) + 1))
    with pytest.raises(KeyFileError, match="holds more than 1048576 bytes"):
        load_identity_file(str(big))


def test_recipients_are_checked_with_a_clear_error(pair: tuple[KeyPair, KeyPair]) -> None:
    alice, bob = pair
    assert parse_recipient(f"  {alice.recipient}\n") == alice.recipient
    both = recipients_of([bob.recipient, alice.recipient, bob.recipient])
    assert both.recipients == tuple(sorted([alice.recipient, bob.recipient]))
    typo = alice.recipient[:-1] + ("q" if alice.recipient[-1] != "q" else "p")
    with pytest.raises(KeyFileError, match=f'^invalid age recipient "{typo}": .*only X25519'):
        parse_recipient(typo)
    with pytest.raises(KeyFileError, match="starts with age1"):
        parse_recipient("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO")
    secret = alice.path.read_text().splitlines()[-1]
    with pytest.raises(KeyFileError, match="a private key was given as a recipient") as caught:
        parse_recipient(secret)
    assert secret not in str(caught.value)
    with pytest.raises(KeyFileError, match="at least one recipient"):
        recipients_of([])


# -- rotation ----------------------------------------------------------------------------------
def test_rotation_adds_a_recipient_then_drops_the_old_one_and_every_file_stays_readable_by_exactly_its_keys(  # noqa: E501
        tmp_path: Path, pair: tuple[KeyPair, KeyPair]) -> None:
    """--encrypt-to A; then A and B; then B alone. Each file is written with its recipients
    file and each set is recorded in the identity record before anything is encrypted to it.
    Each file decrypts with the keys of its set (receivewal and the age command line alike)
    and with no other, and the check from the recipients file alone says the same."""
    alice, bob = pair
    archive = Archive(tmp_path)
    identity = ArchiveIdentity("7312345678901234567", 16 << 20, 1)
    steps = [("2026-11-01T00:00:00Z", [alice.recipient]),
             ("2026-11-02T00:00:00Z", [alice.recipient, bob.recipient]),
             ("2026-11-03T00:00:00Z", [bob.recipient])]
    written = {}
    for number, (since, to) in enumerate(steps):
        recipients = recipients_of(to)
        identity = ArchiveIdentity(identity.system_identifier, identity.segment_size,
                                   identity.timeline,
                                   adopting(identity.recipient_sets, recipients, since))
        archive.write_identity(identity)  # first: the set is on record before any file
        for segment in range(2):
            name = f"00000001000000000000000{2 * number + segment}.zst.age"
            data = payload(100_000, seed=2 * number + segment)
            (tmp_path / f"{name}.recipients").write_bytes(recipients_file_text(recipients))
            (tmp_path / name).write_bytes(encrypt_bytes(data, recipients))
            written[name] = (data, set(to))
    recorded = archive.read_identity()
    assert recorded is not None
    assert [(s.since, list(s.recipients.recipients)) for s in recorded.recipient_sets] == \
        [(since, sorted(to)) for since, to in steps]
    for name, (data, readers) in written.items():
        path = tmp_path / name
        listed = parse_recipients_file((tmp_path / f"{name}.recipients").read_bytes(),
                                       f"{path}.recipients")
        assert listed in {s.recipients for s in recorded.recipient_sets}
        check_stanzas(read_age_header(path.read_bytes(), str(path)), listed, str(path))
        for key in (alice, bob):
            keys = load_identity_file(str(key.path))
            done = age_decrypt(path, key)
            assert keys.can_read(listed) == (key.recipient in readers)
            if key.recipient in readers:
                keys.require(listed, file=str(path))
                require_readable(listed, keys.public, file=str(path), key_file=str(key.path))
                assert decrypt_bytes(path.read_bytes(), keys, file=str(path),
                                     recipients=listed) == data
                assert (done.returncode, done.stdout) == (0, data)
            else:
                with pytest.raises(NotARecipient) as refused:
                    keys.require(listed, file=str(path))
                assert str(refused.value) == (
                    f'"{path}" is encrypted to {listed.describe()}; the identity file '
                    f'"{key.path}" holds {key.recipient}: none of them can decrypt it')
                with pytest.raises(NotARecipient, match=f'^"{path}" is encrypted to '):
                    decrypt_bytes(path.read_bytes(), keys, file=str(path), recipients=listed)
                assert done.returncode != 0
                assert done.stdout == b""
                assert b"no identity matched any of the recipients" in done.stderr


# -- where pyrage lives ------------------------------------------------------------------------
def test_pyrage_is_imported_only_by_the_encryption_module() -> None:
    importers = []
    for path in sorted((ROOT / "receivewal").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) \
                else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(name == "pyrage" or name.startswith("pyrage.") for name in names):
                importers.append(path.relative_to(ROOT).as_posix())
    assert importers == ["receivewal/archive/encryption.py"]


def test_pyrage_is_loaded_on_first_use_and_its_absence_is_a_clear_error() -> None:
    probe = ("import sys\n"
             "import receivewal.archive.encryption as e, receivewal.archive.identity\n"
             "print('pyrage' in sys.modules)\n"
             "sys.modules['pyrage'] = None\n"
             "try:\n"
             "    e.parse_recipient('age1x')\n"
             "except e.ConfigurationError as exc:\n"
             "    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.splitlines() == [
        "False", "encryption at rest needs pyrage: pip install 'receivewal[encrypt]'"]
