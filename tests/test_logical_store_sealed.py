"""The change log sealed at rest (``logical --encrypt-to``), killed at each step of a sealing:
the store resumes without the key (the newest file's end from ``.sealed-through``), finishes
a sealing a kill interrupted, drops the plain twin of a file sealed whole, and every
transaction is in the log once, in order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zstandard
from support.agekeys import KeyPair, new_identity_file
from support.changelog import Record, consume, file_records, log_files, open_store, runs
from test_logical_store import WORK, reference

from receivewal.archive.agestream import decrypt_bytes
from receivewal.archive.encryption import load_identity_file
from receivewal.archive.recipients import recipient_set
from receivewal.errors import ArchiveError
from receivewal.logical.store import SEALED_THROUGH

SETTINGS = {"file_size": 1500, "compression": "zstd"}


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> KeyPair:
    return new_identity_file(tmp_path_factory.mktemp("key") / "key.txt")


def plaintext(path: Path, key: KeyPair) -> bytes:
    data = decrypt_bytes(path.read_bytes(), load_identity_file(str(key.path)), file=str(path))
    return zstandard.ZstdDecompressor().decompressobj().decompress(data)


def sealed_log(directory: Path, key: KeyPair) -> list[Record]:
    out: list[Record] = []
    for path in log_files(directory):
        if path.name.endswith(".age"):
            out += [json.loads(line) for line in plaintext(path, key).splitlines()]
        else:
            out += file_records(path)
    return out


def write(directory: Path, key: KeyPair, messages: int) -> None:
    """The first ``messages`` of WORK into a sealed log; then, as a kill right after a
    rotation leaves it, no partial file."""
    directory.mkdir()
    store = open_store(directory, **SETTINGS, recipients=recipient_set([key.recipient]))
    consume(store, WORK[:messages]).close()
    store.close()
    for path in log_files(directory):
        if path.name.endswith(".partial"):
            path.unlink()


def resume(directory: Path, key: KeyPair) -> None:
    store = open_store(directory, **SETTINGS, recipients=recipient_set([key.recipient]))
    consume(store, WORK).close()
    store.close()


def test_a_log_whose_newest_file_is_sealed_resumes_without_the_key(tmp_path: Path,
                                                                   key: KeyPair) -> None:
    expected = reference(tmp_path, **SETTINGS)
    log = tmp_path / "log"
    write(log, key, len(WORK) // 2)
    names = [p.name for p in log_files(log)]
    assert names
    assert all(name.endswith(".jsonl.zst.age") for name in names)
    marked = json.loads((log / SEALED_THROUGH).read_text())
    assert marked["file"] == names[-1]
    resume(log, key)
    assert runs(sealed_log(log, key)) == expected


def test_kills_inside_a_sealing(tmp_path: Path, key: KeyPair) -> None:
    """Sealed whole, the plain file not yet removed: the plain one goes. Recorded in
    .sealed-through, not yet sealed: it is sealed at the next open. Either way, each
    transaction once."""
    expected = reference(tmp_path, **SETTINGS)
    twin, unsealed = tmp_path / "twin", tmp_path / "unsealed"
    for state in (twin, unsealed):
        write(state, key, len(WORK) // 2)
        newest = log_files(state)[-1]
        plain = newest.with_name(newest.name.removesuffix(".age"))
        zstd = zstandard.ZstdCompressor()
        plain.write_bytes(zstd.compress(plaintext(newest, key)))
        if state is unsealed:
            newest.unlink()
            newest.with_name(newest.name + ".recipients").unlink()
        store = open_store(state, **SETTINGS, recipients=recipient_set([key.recipient]))
        store.close()
        assert not plain.exists(), state.name
        assert newest.exists(), state.name
        resume(state, key)
        assert runs(sealed_log(state, key)) == expected, state.name


def test_a_sealed_newest_file_without_its_record_is_refused(tmp_path: Path,
                                                             key: KeyPair) -> None:
    log = tmp_path / "log"
    write(log, key, len(WORK) // 2)
    (log / SEALED_THROUGH).unlink()
    newest = log_files(log)[-1].name
    with pytest.raises(ArchiveError, match=f"its newest file {newest} is sealed and "
                                           f"{SEALED_THROUGH} does not say where it ends"):
        open_store(log, **SETTINGS)


@pytest.mark.parametrize("compression", ["", "zstd"])
def test_a_kill_between_the_rename_and_the_sealing_leaves_no_plain_file(
        tmp_path: Path, key: KeyPair, compression: str) -> None:
    """SIGKILLed once the completed file has its final name (its ``.partial`` still there
    when compressed), before ``.sealed-through`` named it: the next open removes the
    ``.partial``, seals the plain file (a sealed log never keeps one at rest) and resumes
    after it; each transaction once."""
    settings = {**SETTINGS, "compression": compression}
    expected = reference(tmp_path, **settings)
    log = tmp_path / "log"
    log.mkdir()
    store = open_store(log, **settings, recipients=recipient_set([key.recipient]))
    consume(store, WORK[:len(WORK) // 2]).close()
    store.close()
    partial = log_files(log)[-1]
    assert partial.name.endswith(".partial")
    data = partial.read_bytes()
    final = partial.with_name(partial.name.removesuffix(".partial")
                              + (".zst" if compression else ""))
    final.write_bytes(zstandard.ZstdCompressor().compress(data) if compression else data)
    if not compression:  # renamed: no .partial left
        partial.unlink()
    store = open_store(log, **settings, recipients=recipient_set([key.recipient]))
    store.close()
    assert not final.exists()
    assert not partial.exists()
    assert final.with_name(final.name + ".age").exists()
    assert json.loads((log / SEALED_THROUGH).read_text())["file"] == final.name + ".age"
    store = open_store(log, **settings, recipients=recipient_set([key.recipient]))
    consume(store, WORK).close()
    store.close()
    assert not [p for p in log_files(log) if not p.name.endswith((".age", ".partial"))]
    got = []
    for path in log_files(log):
        if path.name.endswith(".age"):
            data = decrypt_bytes(path.read_bytes(), load_identity_file(str(key.path)),
                                 file=str(path))
            if compression:
                data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
            got += [json.loads(line) for line in data.splitlines()]
        else:
            got += file_records(path)
    assert runs(got) == expected
