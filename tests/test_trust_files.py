"""What sits in the archive under a name receivewal reads is never trusted to be a regular file
of sane size (issue 18, items 2, 3 and 4): a FIFO, a socket, a device or a huge file where the
archive expects a segment, a ``.partial``, the identity file, a history file or the state
file makes ``restore``, ``verify`` and ``status`` answer at once, in one line naming the file,
with their documented exit codes, in bounded memory. Each command runs as a real process with a
timeout (a hang fails the test) and an address-space limit (memory that grows without bound
fails it too)."""

from __future__ import annotations

import os
import resource
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import lz4.frame
import pytest
from support.archives import SEGMENT, proven_segment
from support.walgen import wal_segment

from receivewal.commands.cli import main
from receivewal.daemon.state import STATE_FILE
from receivewal.restore import writing as restore_module

NAME = "000000010000000000000003"
BEFORE = "000000010000000000000002"
IDENTITY = ".receivewal-archive.json"
HISTORY = "00000002.history"
ADDRESS_SPACE = 2 << 30  # a child reading without bound dies of MemoryError well before this
TIMEOUT = 30  # a reader blocked on a FIFO would wait for ever: the test fails instead
DAMAGED, NOT_RECOVERABLE, UNKNOWN = 126, 1, 3


def _bounded() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``receivewal ARGS`` in a child with bounded memory; a hang raises TimeoutExpired."""
    return subprocess.run([sys.executable, "-m", "receivewal", *args], capture_output=True,
                          text=True, check=False, timeout=TIMEOUT, preexec_fn=_bounded,
                          cwd=cwd)


def one_line(text: str, *words: str) -> str:
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    for word in words:
        assert word in lines[0], text
    return lines[0]


def make_fifo(path: Path) -> None:
    os.mkfifo(path)


def make_socket(path: Path) -> None:
    """A listening Unix socket bound at ``path`` (bound by a relative name: paths under the
    test's temporary directory can exceed the 108 bytes of sun_path)."""
    here = os.getcwd()
    os.chdir(path.parent)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path.name)
        sock.listen()
    finally:
        os.chdir(here)
    _SOCKETS.append(sock)


def make_zero_device(path: Path) -> None:
    """A character device like /dev/zero: reading it never ends."""
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))


def make_null_device(path: Path) -> None:
    """A character device like /dev/null: reading it gives nothing."""
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))


_SOCKETS: list[socket.socket] = []
KINDS: dict[str, Callable[[Path], None]] = {
    "fifo": make_fifo, "socket": make_socket, "zero-device": make_zero_device,
    "null-device": make_null_device,
}
WHAT = {"fifo": "FIFO", "socket": "socket", "zero-device": "character device",
        "null-device": "character device"}


@pytest.fixture(autouse=True)
def _close_sockets() -> Iterator[None]:
    yield
    while _SOCKETS:
        _SOCKETS.pop().close()




# -- item 4: restore ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("where", ["segment", "partial", "identity"])
def test_restore_refuses_a_special_file_at_once(dirs: tuple[Path, Path], kind: str,
                                                where: str) -> None:
    """A FIFO, socket or device named like the segment, its ``.partial`` or the identity
    file: restore answers at once with exit 126 (recovery stops, it does not end early) and
    one line naming the file and what it is; nothing is left at %p."""
    archive, pg_wal = dirs
    special = {"segment": NAME, "partial": NAME + ".partial", "identity": IDENTITY}[where]
    if where == "identity":
        (archive / (NAME + ".partial")).write_bytes(proven_segment(3)[:8192])
    KINDS[kind](archive / special)
    target = pg_wal / "RECOVERYXLOG"
    done = run("restore", "-D", str(archive), "--partial", NAME, str(target))
    assert done.returncode == DAMAGED, done.stderr
    one_line(done.stderr, special, WHAT[kind])
    assert os.listdir(pg_wal) == []


# -- item 2: small files are read with a cap; nothing unexpected is "not in the archive" --------
def test_huge_identity_file_stops_recovery_in_bounded_memory(dirs: tuple[Path, Path]) -> None:
    """A 4 GiB identity file (sparse) is damage, exit 126 naming it, read no further than a
    small file's cap (the child's address space is limited to 2 GiB)."""
    archive, pg_wal = dirs
    with (archive / IDENTITY).open("wb") as fh:
        fh.truncate(4 << 30)
    (archive / (NAME + ".partial")).write_bytes(proven_segment(3)[:8192])
    done = run("restore", "-D", str(archive), "--partial", NAME, str(pg_wal / "RECOVERYXLOG"))
    assert done.returncode == DAMAGED, done.stderr
    one_line(done.stderr, IDENTITY, "larger than")
    assert os.listdir(pg_wal) == []


@pytest.mark.parametrize("error", [RuntimeError("injected"), MemoryError(), KeyError("x")],
                         ids=["RuntimeError", "MemoryError", "KeyError"])
def test_unexpected_exception_in_restore_is_exit_126(
        dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], error: Exception) -> None:
    """An exception nobody planned for (injected into the copy, through the console entry
    point) exits 126 with one line, never 1 ("not in the archive" ends recovery early), and
    leaves nothing at %p."""
    archive, pg_wal = dirs
    (archive / NAME).write_bytes(wal_segment(3))

    def broken(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(restore_module, "_write_padded", broken)
    assert main(["restore", "-D", str(archive), NAME, str(pg_wal / "RECOVERYXLOG")]) == DAMAGED
    one_line(capsys.readouterr().err, NAME, type(error).__name__)
    assert os.listdir(pg_wal) == []


def test_broken_installation_is_exit_126(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    """A codec that fails to import (here an ``lz4`` package on PYTHONPATH that raises
    ImportError, as a half-upgraded installation might) stops recovery when a file needs it
    (codecs are imported only then): exit 126 with one line, not a traceback and exit 1."""
    archive, pg_wal = dirs
    (archive / (NAME + ".lz4")).write_bytes(lz4.frame.compress(proven_segment(3)))
    broken = tmp_path / "broken" / "lz4"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('injected: lz4 is broken')\n")
    broken = broken.parent
    done = subprocess.run(
        [sys.executable, "-m", "receivewal", "restore", "-D", str(archive), NAME,
         str(pg_wal / "RECOVERYXLOG")], capture_output=True, text=True, check=False,
        timeout=TIMEOUT, env={**os.environ, "PYTHONPATH": str(broken)})
    assert done.returncode == DAMAGED, done.stderr
    one_line(done.stderr, NAME, "ImportError", "lz4 is broken")
    assert os.listdir(pg_wal) == []


# -- item 3 ----------------------------------------------------------------------------------------
def test_empty_archive_directory_option_is_not_the_current_directory(
        dirs: tuple[Path, Path]) -> None:
    """``-D ''`` is a misconfiguration, not the current directory: exit 126 with one line,
    even when the current directory holds the segment."""
    archive, pg_wal = dirs
    (archive / NAME).write_bytes(proven_segment(3))
    for cwd in (pg_wal, archive):
        done = run("restore", "-D", "", NAME, str(pg_wal / "RECOVERYXLOG"), cwd=cwd)
        assert done.returncode == DAMAGED, done.stderr
        one_line(done.stderr, "-D")
        assert os.listdir(pg_wal) == []


# -- item 4: verify -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("where", [NAME, NAME + ".partial", NAME + ".zst", HISTORY])
def test_verify_reports_a_special_file_at_once(tmp_path: Path, kind: str, where: str) -> None:
    """A FIFO, socket or device under a segment's or history file's name, after a good
    segment: verify answers at once, not recoverable, with a problem line naming the file."""
    (tmp_path / BEFORE).write_bytes(proven_segment(2))
    KINDS[kind](tmp_path / where)
    done = run("verify", "-j", "1", str(tmp_path))
    assert done.returncode == NOT_RECOVERABLE, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert any(where in line and WHAT[kind] in line for line in done.stdout.splitlines()), \
        done.stdout


@pytest.mark.parametrize("kind", list(KINDS))
def test_verify_of_only_a_special_file_is_one_line(tmp_path: Path, kind: str) -> None:
    """The only segment-named file is a FIFO, socket or device: one line naming it, exit 1."""
    KINDS[kind](tmp_path / NAME)
    done = run("verify", "-j", "1", str(tmp_path))
    assert done.returncode == NOT_RECOVERABLE, done.stdout + done.stderr
    one_line(done.stderr, NAME, WHAT[kind])


# -- item 4: status -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(KINDS))
def test_status_of_a_special_state_file_is_unknown_at_once(tmp_path: Path, kind: str) -> None:
    """A FIFO, socket or device where the state file should be: UNKNOWN (exit 3) at once,
    one line naming the state file and what it is."""
    KINDS[kind](tmp_path / STATE_FILE)
    done = run("status", "-D", str(tmp_path))
    assert done.returncode == UNKNOWN, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    one_line(done.stdout, "RECEIVEWAL UNKNOWN", STATE_FILE, WHAT[kind])


def test_status_of_a_huge_state_file_is_unknown_in_bounded_memory(tmp_path: Path) -> None:
    with (tmp_path / STATE_FILE).open("wb") as fh:
        fh.truncate(4 << 30)
    done = run("status", "-D", str(tmp_path))
    assert done.returncode == UNKNOWN, done.stdout + done.stderr
    one_line(done.stdout, "RECEIVEWAL UNKNOWN", STATE_FILE, "larger than")


# -- every size check is on a segment's scale -----------------------------------------------------
def test_a_regular_segment_still_restores(dirs: tuple[Path, Path]) -> None:
    """The guards refuse only what is not a regular file: a real segment is served."""
    archive, pg_wal = dirs
    segment = wal_segment(3)
    (archive / NAME).write_bytes(segment)
    done = run("restore", "-D", str(archive), NAME, str(pg_wal / "RECOVERYXLOG"))
    assert done.returncode == 0, done.stderr
    assert (pg_wal / "RECOVERYXLOG").read_bytes() == segment
    assert len(segment) == SEGMENT
