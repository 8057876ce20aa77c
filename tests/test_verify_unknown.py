"""``verify`` of an archive encrypted at rest, without ``--identity``, as a user runs it against
a real PostgreSQL 15 (issue 35 item 7): one line says how many files could not be checked
without a key and who can read them, the verdict is "unknown" with its own exit code (3), not
"NOT recoverable" (1) with a long error per segment. With the key the verdict is a real one;
a damaged plain segment beside the sealed ones is still NOT recoverable (1)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.agekeys import KeyPair, new_identity_file
from support.servers import PgServer, make_shared_dir
from support.streams import start_streaming, stop, wait_for

from receivewal.wal.names import unsealed_name

VERDICT_UNKNOWN = 3  # verify's exit status when it could not check what it needs a key for

pytestmark = pytest.mark.server


@dataclass
class World:
    base: Path
    archive: Path
    key: KeyPair
    sealed: list[str]


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    base = make_shared_dir("receivewal-verify-unknown-")
    pg = PgServer(base, "primary")
    streamer = None
    try:
        pg.init(initdb_args=("--wal-segsize=1",))
        pg.start()
        key = new_identity_file(base / "key.txt")
        archive = base / "archive"
        archive.mkdir()
        streamer = start_streaming("-D", str(archive), "-d", pg.dsn, "--encrypt-to",
                                   key.recipient, log=base / "stream.log")
        pg.sql("CREATE TABLE t AS SELECT g FROM generate_series(1, 20000) g")
        for _ in range(3):
            pg.switch_wal()
        last = pg.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
        pg.switch_wal()
        wait_for(lambda: any(p.name.startswith(last) for p in archive.iterdir()
                             if not p.name.endswith(".partial")), timeout=120,
                 what=f"{last} archived")
        stop(streamer)
        streamer = None
        sealed = sorted(p.name for p in archive.iterdir() if p.name.endswith(".age"))
        assert len(sealed) >= 4, sealed
        yield World(base, archive, key, sealed)
    finally:
        if streamer is not None:
            stop(streamer)
        pg.stop()


def verify(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "receivewal", "verify", *args],
                          capture_output=True, text=True, check=False, timeout=120)


def test_without_a_key_the_verdict_is_unknown_said_once(world: World) -> None:
    """No --identity: one line counts the files not checked and names who can read them and
    the option; no error line per segment; "verdict: unknown", exit 3."""
    done = verify(str(world.archive))
    assert done.returncode == VERDICT_UNKNOWN, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("verdict: unknown"), done.stdout
    assert "NOT recoverable" not in done.stdout
    said = [line for line in lines if "could not be checked without a key" in line]
    assert len(said) == 1, done.stdout
    assert f"{len(world.sealed)} files" in said[0], said
    assert world.key.recipient in said[0], said
    assert "--identity" in said[0], said
    assert not [line for line in lines if world.sealed[0] in line], done.stdout


def test_without_a_key_json_says_unknown_and_counts_the_files(world: World) -> None:
    done = verify("--json", str(world.archive))
    assert done.returncode == VERDICT_UNKNOWN, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"] == "unknown"
    assert report["not_checked"] == len(world.sealed)
    assert not report["recoverable"]


def test_with_the_key_the_verdict_is_recoverable(world: World) -> None:
    done = verify("--identity", str(world.key.path), str(world.archive))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "verdict: recoverable end to end"


def test_damage_the_verifier_can_read_is_still_not_recoverable(world: World,
                                                               tmp_path: Path) -> None:
    """A plain segment that is damaged, beside sealed ones: the damage is a verdict (exit 1),
    whatever could not be checked."""
    archive = tmp_path / "archive"
    shutil.copytree(world.archive, archive)
    sealed = world.sealed[-1]
    plain = archive / unsealed_name(sealed)
    for name in (sealed, sealed + ".recipients"):
        (archive / name).unlink(missing_ok=True)
    plain.write_bytes(b"\0" * 2**20)
    done = verify(str(archive))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "verdict: NOT recoverable end to end"
