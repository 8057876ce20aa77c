"""The restore_command path is lean: the start-up-cost rule of :mod:`receivewal.restore` (its
docstring states it; :data:`~receivewal.restore.NEVER`, :data:`~receivewal.restore.LEAN`,
:data:`~receivewal.restore.OS_LEVEL`) holds. PostgreSQL runs restore_command once per WAL file
and waits for each: ``receivewal restore`` imports neither click nor structlog nor psycopg, and
a codec only for the file that needs it; a call served from the spool, or told at once that the
archive lacks its file, loads only the lean modules; ``restore --help`` still comes from
click."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st
from support.agekeys import new_identity_file
from support.walgen import wal_segment

from receivewal import restore
from receivewal.archive.agestream import encrypt_bytes
from receivewal.archive.location import is_bucket_url
from receivewal.archive.recipients import recipient_set, recipients_file_text
from receivewal.restore import call
from receivewal.restore.filler import Spool
from receivewal.wal.leannames import AT_REST_SUFFIXES
from receivewal.wal.names import AtRest

NAME = "000000010000000000000003"
HEAVY = (*sorted(restore.NEVER), "boto3", "lz4", "zstandard", "pyrage")
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
    data = wal_segment(3)
    if compressed:
        (archive / (NAME + ".zst")).write_bytes(
            zstandard.ZstdCompressor(write_checksum=True).compress(data))
    else:
        (archive / NAME).write_bytes(data)
    target = tmp_path / "RECOVERYXLOG"
    assert loaded_by("restore", "-D", str(archive), NAME, str(target)) == (0, [])
    assert target.read_bytes() == data


def test_pyrage_is_loaded_only_for_a_sealed_file(tmp_path: Path) -> None:
    """With --identity given, a plain segment's restore still loads no pyrage; a sealed one
    (NAME.age, its recipients file beside it) loads it, and is restored decrypted."""
    archive = tmp_path / "archive"
    archive.mkdir()
    key = new_identity_file(tmp_path / "key.txt")
    recipients = recipient_set([key.recipient])
    data = wal_segment(3)
    (archive / NAME).write_bytes(data)
    target = tmp_path / "RECOVERYXLOG"
    identity = ("--identity", str(key.path), "--prefetch", "0")  # this process decrypts
    assert loaded_by("restore", "-D", str(archive), *identity, NAME, str(target)) == (0, [])
    (archive / NAME).unlink()
    sealed = archive / (NAME + ".age")
    sealed.write_bytes(encrypt_bytes(data, recipients))
    (archive / (sealed.name + ".recipients")).write_bytes(recipients_file_text(recipients))
    target.unlink()
    status, modules = loaded_by("restore", "-D", str(archive), *identity, NAME, str(target))
    assert (status, "pyrage" in modules) == (0, True)
    assert all(m.startswith("pyrage") for m in modules), modules
    assert target.read_bytes() == data


def test_a_restore_from_a_local_archive_loads_none_of_the_archive_writers_modules(
        tmp_path: Path) -> None:
    """Restoring a segment from a local directory (the prefetch spool left out) reads the
    archive's identity record without ``archive/directory`` (the writer: its lock, listing,
    layout and sealing modules) nor ``socket`` (issue 36 item 5: start-up)."""
    archive = tmp_path / "archive"
    archive.mkdir()
    data = wal_segment(3)
    (archive / NAME).write_bytes(data)
    target = tmp_path / "RECOVERYXLOG"
    done = subprocess.run([sys.executable, "-c", SPOOL_PROBE, "restore", "-D", str(archive),
                           "--prefetch", "0", NAME, str(target)],
                          capture_output=True, text=True, check=True, timeout=60)
    status, modules = ast.literal_eval(done.stdout.splitlines()[-1])
    assert status == 0
    assert target.read_bytes() == data
    writers = {"receivewal.archive.directory", "receivewal.archive.lock",
               "receivewal.archive.listing", "receivewal.archive.layout",
               "receivewal.archive.sealed", "socket"}
    assert sorted(writers & set(modules)) == []


def test_restore_help_and_usage_errors_still_go_through_click(tmp_path: Path) -> None:
    """--help is click's (exit 0), and a command line the lean path does not take is click's
    usage error, exit 126 (never 1)."""
    status, modules = loaded_by("restore", "--help")
    assert (status, "click" in modules) == (0, True)
    status, modules = loaded_by("restore", "-D", str(tmp_path), "--no-such-option", NAME, "x")
    assert (status, "click" in modules) == (126, True)


SPOOL_PROBE = (  # what the call loads beyond the interpreter's start (site, .pth hooks)
    "import sys\n"
    "before = set(sys.modules)\n"
    "from receivewal.commands.cli import main\n"
    "status = main(sys.argv[1:])\n"
    "print(repr([status, sorted(set(sys.modules) - before)]))\n"
)
ROOT = Path(restore.__file__).parents[2]  # holds receivewal/


def beyond_the_lean_path(modules: list[str]) -> list[str]:
    """The modules of ``modules`` that the rule does not let a lean call load."""
    return sorted(set(modules) - restore.LEAN - restore.OS_LEVEL)


def top_level_imports(module: str) -> set[str]:
    """The modules ``module`` imports when it is imported: at its top, not in a function nor
    under ``if TYPE_CHECKING``; ``from a import b`` counts as ``a.b`` when that is a module."""
    path = ROOT.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                is_module = ROOT.joinpath(*name.split(".")).with_suffix(".py").exists()
                found.add(name if is_module else node.module)
    return found


@pytest.mark.parametrize("module", sorted(restore.LEAN))
def test_a_lean_module_imports_only_lean_modules_at_its_top(module: str) -> None:
    """Rule 3: each module of the lean path imports, when it is imported, only modules of the
    lean path and os-level ones of the standard library (the rest inside functions)."""
    assert sorted(top_level_imports(module) - restore.LEAN - restore.OS_LEVEL) == []


def test_the_rules_slow_modules_are_not_os_level() -> None:
    """What rule 2 names as too slow for a lean call is outside the lean sets."""
    slow = {"dataclasses", "pathlib", "re", "typing", "enum", "json", *restore.NEVER}
    assert slow & (restore.LEAN | restore.OS_LEVEL) == set()


def test_a_call_served_from_the_spool_imports_only_os_level_modules(tmp_path: Path) -> None:
    """Rule 2: with a filler at work, a call whose segment is spooled is a rename: it loads
    only the lean path's modules (none of dataclasses, pathlib, re, typing, json, enum, nor
    the heavy ones), and the target holds the archive's bytes."""
    archive = tmp_path / "archive"
    archive.mkdir()
    for segno in (3, 4, 5):
        (archive / f"0000000100000000{segno:08X}").write_bytes(wal_segment(segno))
    target = tmp_path / "pg_wal" / "RECOVERYXLOG"
    target.parent.mkdir()
    argv = ["restore", "-D", str(archive), "--prefetch", "2"]
    env = {**os.environ, "RECEIVEWAL_PREFETCH_IDLE": "5"}
    first = subprocess.run([sys.executable, "-m", "receivewal", *argv, NAME, str(target)],
                           capture_output=True, text=True, check=False, timeout=60, env=env)
    assert first.returncode == 0, first.stderr
    spooled = Spool.beside(target, os.path.realpath(archive)).dir / "000000010000000000000004"
    deadline = time.monotonic() + 60
    while not spooled.exists():
        assert time.monotonic() < deadline, "the filler never spooled the next segment"
        time.sleep(0.05)
    done = subprocess.run([sys.executable, "-c", SPOOL_PROBE, *argv, spooled.name,
                           str(target)], capture_output=True, text=True, check=True,
                          timeout=60, env=env)
    status, modules = ast.literal_eval(done.stdout.splitlines()[-1])
    assert status == 0
    assert "from the prefetch spool" in done.stderr
    assert beyond_the_lean_path(modules) == []
    assert target.read_bytes() == wal_segment(4)


@given(st.text())
def test_messages_quote_names_as_json_does(text: str) -> None:
    """The lean path quotes names without importing json, exactly as json.dumps does."""
    assert call._quoted(text) == json.dumps(text, ensure_ascii=False)


@pytest.mark.parametrize("text", ["s3://b/p", "s3:/b", "S3://b", "/srv/s3://x", "", "s3://"])
def test_the_lean_bucket_test_is_the_object_stores(text: str) -> None:
    """restore.call judges a bucket URL by the location door's one test (a lean module: no
    import of the object store), as the object store's URL parser does."""
    assert vars(call)["is_bucket_url"] is is_bucket_url
    assert is_bucket_url(text) == (text in {"s3://b/p", "s3://"})


@pytest.mark.parametrize("name", [NAME, "00000002.history"])
def test_a_file_the_archive_lacks_is_exit_1_without_the_restore_machinery(
        tmp_path: Path, name: str) -> None:
    """Recovery asks for files the archive lacks on every run (the next timeline's history
    file, the segment after the last): a call answers exit 1 with the usual line, loading
    only the lean path's modules (rule 2), none of the restore machinery."""
    done = subprocess.run([sys.executable, "-c", SPOOL_PROBE, "restore", "-D", str(tmp_path),
                           name, str(tmp_path / "RECOVERYXLOG")], capture_output=True,
                          text=True, check=True, timeout=60)
    status, modules = ast.literal_eval(done.stdout.splitlines()[-1])
    assert status == 1
    assert done.stderr == f'receivewal restore: "{name}" is not in the archive "{tmp_path}"\n'
    assert beyond_the_lean_path(modules) == []


def test_a_dangling_symlink_is_not_taken_for_absence(tmp_path: Path) -> None:
    """A form that exists as a dangling symlink is damage (exit 126, from the full path),
    never "not in the archive"."""
    (tmp_path / (NAME + ".zst")).symlink_to(tmp_path / "nowhere")
    done = subprocess.run([sys.executable, "-m", "receivewal", "restore", "-D", str(tmp_path),
                           NAME, str(tmp_path / "RECOVERYXLOG")], capture_output=True,
                          text=True, check=False, timeout=60)
    assert done.returncode == 126, done.stderr


def test_the_lean_suffixes_are_the_at_rest_formats() -> None:
    """wal/leannames' suffixes (which restore/absence.py uses without importing wal.names) are
    the at-rest formats', each its own."""
    assert tuple(fmt.suffix for fmt in AtRest) == AT_REST_SUFFIXES
    assert {fmt: fmt.suffix for fmt in AtRest} == {
        AtRest.PLAIN: "", AtRest.GZIP: ".gz", AtRest.LZ4: ".lz4", AtRest.ZSTD: ".zst"}


def test_a_recoverys_first_call_starts_the_filler_without_the_restore_machinery(
        tmp_path: Path) -> None:
    """The first call of a recovery (the next timeline's history file, which a local archive
    lacks) starts the filler, and is exit 1 without loading the restore machinery, the object
    store's module or the heavy ones: the filler imports what fetching needs itself."""
    archive = tmp_path / "archive"
    archive.mkdir()
    data_dir = tmp_path / "data"
    (data_dir / "pg_wal").mkdir(parents=True)
    (data_dir / "recovery.signal").touch()
    argv = ["restore", "-D", str(archive), "00000002.history", "pg_wal/RECOVERYHISTORY"]
    done = subprocess.run([sys.executable, "-c", SPOOL_PROBE, *argv], capture_output=True,
                          text=True, check=True, timeout=60, cwd=data_dir)
    status, modules = ast.literal_eval(done.stdout.splitlines()[-1])
    spool = Spool.beside(data_dir / "pg_wal" / "RECOVERYHISTORY", os.path.realpath(archive))
    assert (status, spool.busy()) == (1, True)
    heavy = {"receivewal.restore.local", "receivewal.archive.objectstore",
             "receivewal.archive.compression", *HEAVY}
    assert sorted(set(modules) & heavy) == []
    (data_dir / "recovery.signal").unlink()
    deadline = time.monotonic() + 60
    while spool.busy():
        assert time.monotonic() < deadline, "the filler never exited after recovery"
        time.sleep(0.05)
