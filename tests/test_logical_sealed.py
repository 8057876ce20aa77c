"""``receivewal logical --encrypt-to`` against a real PostgreSQL 15 (issue 28 §4): each
completed change file is sealed (``P.jsonl.zst`` becomes ``P.jsonl.zst.age`` beside its
recipients file), the ``.partial`` stays plain; ``age -d`` decrypts the files to the lines an
unencrypted run of the same changes writes; a run stopped half-way and started again resumes
from the sealed files, every transaction once; analyze's reader reads them with the identity
and names the file without it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zstandard
from support.agekeys import KeyPair, age_command, age_keygen
from support.changelog import Record, file_records, log_files, runs
from support.logical import LOGICAL_CONF, current_lsn
from support.servers import PgServer, running_server
from support.streams import receivewal

from receivewal.check.changes import file_lines
from receivewal.errors import ReceivewalError
from receivewal.wal.lsn import format_lsn

pytestmark = pytest.mark.server
TRANSACTIONS = 40


@dataclass
class Primary:
    pg: PgServer
    key: KeyPair
    middle: int  # the WAL position after half the transactions
    end: int

    def logical(self, directory: Path, slot: str, *args: str,
                ) -> subprocess.CompletedProcess[str]:
        dsn = f"host=127.0.0.1 port={self.pg.port} user=postgres dbname=postgres"
        return receivewal("logical", "-d", dsn, "-S", slot, "-D", str(directory), "-P", "pub",
                          "--log-format", "json", "-Z", "zstd", "--file-size", "8kB",
                          "--no-sync", *args)


@pytest.fixture(scope="module")
def primary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Primary]:
    with running_server(LOGICAL_CONF) as pg:
        pg.sql("CREATE TABLE items (id int PRIMARY KEY, what text)")
        pg.sql("CREATE PUBLICATION pub FOR ALL TABLES")
        key = age_keygen(tmp_path_factory.mktemp("keys") / "key.txt")
        primary = Primary(pg, key, 0, 0)
        for slot in ("plain", "sealed", "analyzed"):
            done = primary.logical(tmp_path_factory.mktemp(slot), slot, "--create-slot")
            assert done.returncode == 0, done.stderr[-2000:]
        for n in range(TRANSACTIONS):
            pg.sql(f"INSERT INTO items SELECT g, repeat('x', 80) || {n} FROM "
                   f"generate_series({n * 20}, {n * 20 + 19}) g")
            if n == TRANSACTIONS // 2:
                primary.middle = current_lsn(pg, "postgres")
        primary.end = current_lsn(pg, "postgres")
        yield primary


def age_plaintext(key: Path, path: Path) -> bytes:
    done = subprocess.run([age_command(), "-d", "-i", str(key), str(path)],
                          capture_output=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def sealed_records(key: Path, path: Path) -> list[Record]:
    """The lines of a change file as the age command line and zstd read them."""
    if not path.name.endswith(".age"):
        return file_records(path)
    data = age_plaintext(key, path)
    if path.name.endswith(".zst.age"):
        data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return [json.loads(line) for line in data.splitlines()]


def without_slot(records: list[Record]) -> list[Record]:
    return [{k: v for k, v in r.items() if k != "slot"} for r in records]


def test_sealed_change_files_read_as_the_plain_log_after_a_restart(
        primary: Primary, tmp_path: Path) -> None:
    plain, sealed = tmp_path / "plain", tmp_path / "sealed"
    plain.mkdir()
    sealed.mkdir()
    done = primary.logical(plain, "plain", "--endpos", format_lsn(primary.end))
    assert done.returncode == 0, done.stderr[-2000:]
    for endpos in (primary.middle, primary.end):  # stopped half-way, then resumed
        done = primary.logical(sealed, "sealed", "--endpos", format_lsn(endpos),
                               "--encrypt-to", primary.key.recipient)
        assert done.returncode == 0, done.stderr[-2000:]
    files = [p.name for p in log_files(sealed)]
    assert len(files) > 3, files
    assert all(name.endswith(".jsonl.zst.age") for name in files[:-1]), files
    assert files[-1].endswith(".jsonl.partial"), files
    for name in files[:-1]:
        recipients = (sealed / f"{name}.recipients").read_text()
        assert primary.key.recipient in recipients
    plain_records = [r for p in log_files(plain) for r in file_records(p)]
    sealed_records_ = [r for p in log_files(sealed)
                       for r in sealed_records(primary.key.path, p)]
    # every transaction once, in order, and the same lines (the slot's name aside)
    expected = runs(plain_records)
    assert len(expected) == TRANSACTIONS
    assert without_slot([r for run in runs(sealed_records_) for r in run]) == \
        without_slot([r for run in expected for r in run])
    # the first file was completed before the restart: line for line the plain run's
    first_plain = log_files(plain)[0]
    assert first_plain.name + ".age" == files[0]
    assert without_slot(sealed_records(primary.key.path, sealed / files[0])) == \
        without_slot(file_records(first_plain))


def test_analyze_reads_sealed_change_files_with_the_identity(primary: Primary,
                                                             tmp_path: Path) -> None:
    sealed = tmp_path / "sealed"
    sealed.mkdir()
    done = primary.logical(sealed, "analyzed", "--endpos", format_lsn(primary.end),
                           "--encrypt-to", primary.key.recipient)
    assert done.returncode == 0, done.stderr[-2000:]
    name = next(p.name for p in log_files(sealed) if p.name.endswith(".age"))
    row: dict[str, Any] = {"base": str(sealed), "file": name, "compression": "zstd",
                           "partial": False, "identity": str(primary.key.path)}
    lines = list(file_lines(row))
    assert lines == age_plaintext_lines(primary.key.path, sealed / name)
    with pytest.raises(ReceivewalError, match=f'"{sealed / name}" is encrypted to '):
        list(file_lines({**row, "identity": None}))


def age_plaintext_lines(key: Path, path: Path) -> list[bytes]:
    data = zstandard.ZstdDecompressor().decompressobj().decompress(age_plaintext(key, path))
    return data.splitlines()
