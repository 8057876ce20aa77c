"""Encryption at rest: what it costs per GB, receivewal (pyrage) against the ``age`` command line
on the same data. Run by hand (not in CI)::

    .venv/bin/python bench/encryption_throughput.py [--mb 1024] [--rounds 3] [--dir DIR]

It writes ``--mb`` MB of bytes that do not compress (what a ``-Z`` segment or a compressed
backup tar is, and what encryption meets last) into a scratch directory (``--dir``, default the
system's temporary directory: the files are in the page cache, so this measures the CPU, not
the disk), makes an X25519 identity, and, alternating ``--rounds`` times, encrypts and decrypts
the file:

* receivewal, file to file (``encrypt_stream`` / ``decrypt_stream`` given two files: pyrage
  opens them itself, ``encrypt_file`` / ``decrypt_file``, the bytes never pass through Python:
  a change log file sealed at its rotation);
* receivewal, through Python's file objects (the same calls given the files' ``read`` and
  ``write`` alone: pyrage's ``encrypt_io`` / ``decrypt_io``, two calls into Python per 8 KiB,
  what every other reader and writer, an object's body or a pipe, goes through; the file to
  file path before issue 36);
* receivewal, pushed (``Encryptor``, 1 MiB updates: a backup's tar as it arrives) and pulled
  (``decrypting_reader``, 1 MiB reads: a backup's tar as recover reads it), each with pyrage in
  a worker thread;
* ``age -r R -o OUT IN`` and ``age -d -i KEY -o OUT IN`` (Debian's age, Go).

It prints MB/s (wall, median of the rounds) and CPU seconds per GB of each, checks that every
decryption gave the input back, and the load average, which says how busy the machine was.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from support.agekeys import age_command, new_identity_file

from receivewal.archive.agestream import (
    Encryptor,
    decrypt_stream,
    decrypting_reader,
    encrypt_stream,
)
from receivewal.archive.encryption import Keys, load_identity_file, recipients_of
from receivewal.archive.recipients import RecipientSet

MB = 1e6
PIECE = 1 << 20


def write_input(path: Path, mb: int) -> str:
    """``mb`` MB of incompressible bytes at ``path``; their SHA-256."""
    block = os.urandom(PIECE)
    digest = hashlib.sha256()
    with path.open("wb") as out:
        for i in range(max(1, mb * 1_000_000 // PIECE)):
            piece = i.to_bytes(8, "little") + block[8:]
            digest.update(piece)
            out.write(piece)
    return digest.hexdigest()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while piece := fh.read(PIECE):
            digest.update(piece)
    return digest.hexdigest()


def cpu_now() -> float:
    """CPU seconds of this process and its finished children so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(action: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of ``action``."""
    wall, cpu = time.monotonic(), cpu_now()
    action()
    return time.monotonic() - wall, cpu_now() - cpu


def ours_encrypt(source: Path, target: Path, to: RecipientSet) -> None:
    with source.open("rb") as src, target.open("wb") as out:
        encrypt_stream(src, out, to)


def ours_decrypt(source: Path, target: Path, keys: Keys) -> None:
    with source.open("rb") as src, target.open("wb") as out:
        decrypt_stream(src, out, keys, file=str(source))


class _Only:
    """A file's ``read`` and ``write`` without its descriptor (the way of any other stream)."""

    def __init__(self, file: BinaryIO) -> None:
        self.read, self.write = file.read, file.write


def python_encrypt(source: Path, target: Path, to: RecipientSet) -> None:
    with source.open("rb") as src, target.open("wb") as out:
        encrypt_stream(_Only(src), _Only(out), to)


def python_decrypt(source: Path, target: Path, keys: Keys) -> None:
    with source.open("rb") as src, target.open("wb") as out:
        decrypt_stream(_Only(src), _Only(out), keys, file=str(source))


def pushed_encrypt(source: Path, target: Path, to: RecipientSet) -> None:
    with source.open("rb") as src, target.open("wb") as out, Encryptor(to) as encryptor:
        while piece := src.read(PIECE):
            out.write(encryptor.update(piece))
        out.write(encryptor.finish())


def pulled_decrypt(source: Path, target: Path, keys: Keys) -> None:
    with source.open("rb") as src, target.open("wb") as out, \
            decrypting_reader(src, keys, file=str(source)) as reader:
        while piece := reader.read(PIECE):
            out.write(piece)


def age_encrypt(source: Path, target: Path, recipient: str) -> None:
    subprocess.run([age_command(), "-r", recipient, "-o", str(target), str(source)], check=True)


def age_decrypt(source: Path, target: Path, key: Path) -> None:
    subprocess.run([age_command(), "-d", "-i", str(key), "-o", str(target), str(source)],
                   check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="receivewal-bench-age-", dir=args.dir))
    try:
        run(scratch, args.mb, args.rounds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run(scratch: Path, mb: int, rounds: int) -> None:
    pair = new_identity_file(scratch / "key.txt")
    keys, to = load_identity_file(str(pair.path)), recipients_of([pair.recipient])
    plain, sealed, back = scratch / "in", scratch / "in.age", scratch / "out"
    expected = write_input(plain, mb)
    size = plain.stat().st_size
    version = subprocess.run([age_command(), "--version"], capture_output=True, text=True,
                             check=True).stdout.strip()
    print(f"{size / MB:.0f} MB of incompressible bytes, {rounds} round(s), age {version}",
          flush=True)
    # (name, encrypt, decrypt): each pair's decryption reads its own encryption's file
    ways: list[tuple[str, Callable[[], None], Callable[[], None]]] = [
        ("receivewal, file to file", lambda: ours_encrypt(plain, sealed, to),
         lambda: ours_decrypt(sealed, back, keys)),
        ("receivewal, through Python's file objects", lambda: python_encrypt(plain, sealed, to),
         lambda: python_decrypt(sealed, back, keys)),
        ("receivewal, pushed / pulled", lambda: pushed_encrypt(plain, sealed, to),
         lambda: pulled_decrypt(sealed, back, keys)),
        ("age command line", lambda: age_encrypt(plain, sealed, pair.recipient),
         lambda: age_decrypt(sealed, back, pair.path)),
    ]
    figures: dict[str, dict[str, list[tuple[float, float]]]] = {
        name: {"encrypt": [], "decrypt": []} for name, _, _ in ways}
    for round_number in range(rounds):
        for name, encrypt, decrypt in ways:
            figures[name]["encrypt"].append(timed(encrypt))
            figures[name]["decrypt"].append(timed(decrypt))
            if sha256_of(back) != expected:
                raise SystemExit(f"{name}: the decrypted file differs from the input")
            back.unlink()
            sealed.unlink()
        print(f"  round {round_number + 1} done", flush=True)
    print("\n| way | encrypt MB/s | decrypt MB/s | encrypt CPU s/GB | decrypt CPU s/GB |\n"
          "|---|---:|---:|---:|---:|")
    speeds = {}
    for name, _, _ in ways:
        row = [name]
        for step in ("encrypt", "decrypt"):
            wall = statistics.median(w for w, _ in figures[name][step])
            speeds[name, step] = size / MB / wall
            row.append(f"{speeds[name, step]:.0f}")
        for step in ("encrypt", "decrypt"):
            cpu = statistics.median(c for _, c in figures[name][step])
            row.append(f"{cpu / (size / 1e9):.2f}")
        print("| " + " | ".join(row) + " |")
    for step in ("encrypt", "decrypt"):
        ratio = speeds["receivewal, file to file", step] / speeds["age command line", step]
        print(f"receivewal / age, {step}: {ratio:.2f}x")
        before = speeds["receivewal, file to file", step] / speeds[
            "receivewal, through Python's file objects", step]
        print(f"file to file / through Python's file objects, {step}: {before:.2f}x")
    print("every decryption gave the input back")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
