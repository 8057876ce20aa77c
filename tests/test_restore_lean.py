"""The restore_command path is lean: PostgreSQL runs it once per WAL file and waits for each,
so ``receivewal restore`` imports neither click nor structlog nor psycopg, and a codec only for
the file that needs it; ``restore --help`` still comes from click."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

NAME = "000000010000000000000003"
HEAVY = ("click", "structlog", "psycopg", "boto3", "lz4", "zstandard")
PROBE = (
    "import json, sys\n"
    "from receivewal.commands.cli import main\n"
    "status = main(sys.argv[1:])\n"
    f"print(json.dumps([status, sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})]))\n"
)


def loaded_by(*args: str) -> tuple[int, list[str]]:
    """(exit status, heavy modules loaded) of ``receivewal ARGS`` run through the console
    script's entry point in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True,
                          text=True, check=True, timeout=60)
    status, modules = json.loads(done.stdout.splitlines()[-1])
    return status, modules


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "zstd"])
def test_restore_imports_no_click_structlog_psycopg_nor_unused_codecs(
        tmp_path: Path, compressed: bool) -> None:
    """A restore of a plain or a .zst segment loads none of click, structlog, psycopg, boto3,
    lz4 or the zstandard compressor (a .zst file needs only the bounded zstd decoder)."""
    archive = tmp_path / "archive"
    archive.mkdir()
    data = bytes(16 << 20)
    if compressed:
        (archive / (NAME + ".zst")).write_bytes(
            zstandard.ZstdCompressor(write_checksum=True).compress(data))
    else:
        (archive / NAME).write_bytes(data)
    target = tmp_path / "RECOVERYXLOG"
    assert loaded_by("restore", "-D", str(archive), NAME, str(target)) == (0, [])
    assert target.read_bytes() == data


def test_restore_help_and_usage_errors_still_go_through_click(tmp_path: Path) -> None:
    """--help is click's (exit 0), and a command line the lean path does not take is click's
    usage error, exit 126 (never 1)."""
    status, modules = loaded_by("restore", "--help")
    assert (status, "click" in modules) == (0, True)
    status, modules = loaded_by("restore", "-D", str(tmp_path), "--no-such-option", NAME, "x")
    assert (status, "click" in modules) == (126, True)
