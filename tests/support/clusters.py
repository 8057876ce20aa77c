"""Fresh database clusters without an initdb each: initdb's result, copied.

initdb takes a second or more (it runs the bootstrap backend and a dozen single-user passes);
``cp -a`` of its result takes a tenth of that. :func:`new_cluster` copies a template (one per set
of initdb arguments) and gives the copy a system identifier of its own, as initdb would: a new
value in ``global/pg_control`` (with its CRC) and in the long page header of each WAL file (the
server refuses WAL whose header names another system). Each copy is a private cluster, as
private as a fresh initdb's. A template is made again each minute (TEMPLATE_LIFETIME), so that
the checkpoint time initdb wrote is never much older than the copy.

The templates live in the directory named by ``RECEIVEWAL_TEST_TEMPLATES`` (tests/conftest.py
makes one per session and removes it at the end; pytest-xdist's workers and the benchmarks the
suite runs inherit it), else in one made for this process and removed when it exits. Processes
sharing it take a lock (``flock`` on its ``.lock``): exclusive to make a template and remove the
old ones, shared to copy one, so a copy never reads a template another process is removing.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import os
import random
import shutil
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import crc32c

from receivewal.wal.pageheader import SIZE_OF_SHORT_PHD, XLP_LONG_HEADER

TEMPLATES_ENV = "RECEIVEWAL_TEST_TEMPLATES"
CONTROL_FILE = Path("global") / "pg_control"
LONG_HEADER_SYSID = SIZE_OF_SHORT_PHD  # XLogLongPageHeaderData.xlp_sysid follows the short one
#: Seconds a template is copied for. initdb's shutdown checkpoint carries the time initdb ran
#: (in pg_control and in the WAL a server starts with): a copy must not begin its life with a
#: checkpoint much older than itself, as a fresh initdb's never does (tests/test_walclock.py
#: reads those times). So a template is made again once a minute at most: one initdb a minute
#: instead of one per server.
TEMPLATE_LIFETIME = 60
_own_templates: list[Path] = []


def templates_dir() -> Path:
    """The session's template directory (made, for this process only, when none is set)."""
    named = os.environ.get(TEMPLATES_ENV)
    if named:
        return Path(named)
    if not _own_templates:
        path = Path(tempfile.mkdtemp(prefix="receivewal-initdb-"))
        path.chmod(0o755)  # the server user reads the templates (and initdb writes below)
        atexit.register(shutil.rmtree, path, True)
        _own_templates.append(path)
    return _own_templates[0]


@contextlib.contextmanager
def templates_locked(operation: int) -> Iterator[None]:
    """Hold the template directory's lock (``fcntl.LOCK_EX`` or ``fcntl.LOCK_SH``) meanwhile."""
    with (templates_dir() / ".lock").open("a") as lock:
        fcntl.flock(lock, operation)
        yield  # closing the file releases the lock


def template(initdb: list[str], initdb_args: tuple[str, ...], as_user: list[str],
             owner: tuple[int, int] | None, now: float | None = None) -> Path:
    """The data directory of a cluster that ``initdb`` (this command, run with ``as_user`` in
    front) made with ``initdb_args``; made on first use, under the exclusive lock (a process
    that wants it meanwhile waits for this initdb instead of running its own). One made more
    than TEMPLATE_LIFETIME before ``now`` (default: the time) is made again, and the old one
    removed."""
    key = hashlib.sha256("\0".join([*initdb, *initdb_args]).encode()).hexdigest()[:16]
    minute = int((time.time() if now is None else now) // TEMPLATE_LIFETIME)
    final = templates_dir() / f"{key}-{minute}"
    with templates_locked(fcntl.LOCK_EX):
        if not final.exists():
            building = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=templates_dir()))
            if owner is not None:
                os.chown(building, *owner)
            subprocess.run([*as_user, *initdb, "-D", str(building / "data"), *initdb_args],
                           check=True, capture_output=True, text=True)
            building.rename(final)
            for old in templates_dir().glob(f"{key}-*"):
                if old != final:
                    shutil.rmtree(old, ignore_errors=True)
    return final / "data"


def new_cluster(datadir: Path, initdb: list[str], initdb_args: tuple[str, ...] = (),
                as_user: list[str] | None = None, owner: tuple[int, int] | None = None) -> None:
    """Make ``datadir`` a fresh cluster, as ``initdb -D datadir`` with ``initdb_args`` would:
    a copy of the session's template (owners and modes kept) with a new system identifier.
    The copy is made under the shared lock, from a template still there once it is held (one
    whose minute ended meanwhile may have been replaced: then the new one is copied)."""
    if datadir.is_dir() and not any(datadir.iterdir()):
        datadir.rmdir()  # initdb fills an empty directory; cp -a would copy into it
    copied = False
    while not copied:
        source = template(initdb, initdb_args, as_user or [], owner)
        with templates_locked(fcntl.LOCK_SH):
            if source.exists():
                subprocess.run(["cp", "-a", str(source), str(datadir)], check=True,
                               capture_output=True)
                copied = True
    set_system_identifier(datadir, new_system_identifier())


def new_system_identifier() -> int:
    """A system identifier as initdb makes one: seconds and microseconds of now, and 12 bits
    that initdb takes from its process id (random here: copies can be made in one microsecond,
    by one process)."""
    now = time.time_ns() // 1000
    seconds, micros = divmod(now, 1_000_000)
    return (seconds << 32) | (micros << 12) | random.getrandbits(12)


def control_crc_offset(control: bytes | bytearray) -> int:
    """Where pg_control's CRC is: the offset whose 4 bytes are the CRC-32C of all before it
    (the last field of ControlFileData; the file is zero-padded after it)."""
    for offset in range(8, len(control) - 4, 4):
        if struct.unpack_from("<I", control, offset)[0] == crc32c.crc32c(control[:offset]):
            return offset
    raise ValueError("no CRC found in pg_control")


def set_system_identifier(datadir: Path, sysid: int) -> None:
    """Write ``sysid`` into a stopped cluster's pg_control (CRC updated) and into the long
    page header of each of its WAL files that carries the old one."""
    control_path = datadir / CONTROL_FILE
    control = bytearray(control_path.read_bytes())
    crc_at = control_crc_offset(control)
    old = control[:8]
    struct.pack_into("<Q", control, 0, sysid)
    struct.pack_into("<I", control, crc_at, crc32c.crc32c(bytes(control[:crc_at])))
    control_path.write_bytes(control)
    for wal in (datadir / "pg_wal").iterdir():
        if not wal.is_file() or len(wal.name) != 24:
            continue
        with wal.open("r+b") as fh:
            head = fh.read(LONG_HEADER_SYSID + 8)
            info = struct.unpack_from("<H", head, 2)[0]
            if info & XLP_LONG_HEADER and head[LONG_HEADER_SYSID:] == old:
                fh.seek(LONG_HEADER_SYSID)
                fh.write(struct.pack("<Q", sysid))
