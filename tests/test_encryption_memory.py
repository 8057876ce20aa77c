"""Encryption's memory does not grow with the size of what is encrypted (issue 28 §4): 256 MiB
go through each streaming path, encrypted and decrypted at once through a pipe, in a child
process whose peak resident memory stays under 100 MB. A path that held the stream (or either
side of it) whole would need more than twice that bound; the process peaks at about 40 MB, as
it did for 1 GiB (which took four times as long and proved no more)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.agekeys import new_identity_file
from support.memory import PEAK_RSS_KB

pytestmark = pytest.mark.slow

SIZE = 256 << 20  # more than twice LIMIT_KB: only streaming stays under it
LIMIT_KB = 100 * 1000

CHILD = """
import hashlib, os, sys, threading
from receivewal.archive.agestream import (Encryptor, decrypt_stream, decrypting_reader,
    encrypt_stream)
from receivewal.archive.encryption import load_identity_file, recipients_of

keys = load_identity_file(sys.argv[1])
to = recipients_of(keys.public)
total, way = int(sys.argv[2]), sys.argv[3]
PIECE = 1 << 20
block = os.urandom(PIECE)

def pieces():
    for n in range(total // PIECE):  # every MiB different, nothing held
        yield n.to_bytes(8, "little") + block[8:]

class Generated:
    def __init__(self):
        self.source, self.held = pieces(), b""
    def read(self, size=-1):
        if not self.held:
            self.held = next(self.source, b"")
        piece, self.held = self.held[:size], self.held[size:]
        return piece

class Digest:
    def __init__(self):
        self.sha, self.count = hashlib.sha256(), 0
    def write(self, data):
        self.sha.update(data)
        self.count += len(data)
        return len(data)

expected = hashlib.sha256()
for piece in pieces():
    expected.update(piece)
r, w = os.pipe()
got = Digest()
if way == "pushed":  # Encryptor -> pipe -> decrypt_stream
    def decrypt():
        with os.fdopen(r, "rb") as source:
            decrypt_stream(source, got, keys, file="pipe")
    worker = threading.Thread(target=decrypt)
    worker.start()
    with os.fdopen(w, "wb") as sink, Encryptor(to) as encryptor:
        for piece in pieces():
            sink.write(encryptor.update(piece))
        sink.write(encryptor.finish())
    worker.join()
else:  # encrypt_stream -> pipe -> decrypting_reader
    def encrypt():
        with os.fdopen(w, "wb") as sink:
            encrypt_stream(Generated(), sink, to)
    worker = threading.Thread(target=encrypt)
    worker.start()
    with os.fdopen(r, "rb") as source, decrypting_reader(source, keys, file="pipe") as reader:
        while piece := reader.read(PIECE):
            got.write(piece)
    worker.join()
print(got.count, got.sha.hexdigest() == expected.hexdigest(), PEAK)
""".replace("PEAK", PEAK_RSS_KB)


@pytest.mark.parametrize("way", ["pushed", "pulled"])
def test_a_stream_past_twice_the_bound_goes_through_encryption_and_back_in_bounded_memory(
        tmp_path: Path, way: str) -> None:
    key = new_identity_file(tmp_path / "key.txt")
    done = subprocess.run([sys.executable, "-c", CHILD, str(key.path), str(SIZE), way],
                          capture_output=True, text=True, timeout=280, check=False)
    assert done.returncode == 0, done.stderr
    count, equal, peak_kb = done.stdout.split()
    assert (int(count), equal) == (SIZE, "True")
    assert int(peak_kb) < LIMIT_KB, f"peak RSS {int(peak_kb) // 1000} MB"
