"""``receivewal restore -D s3://BUCKET/PREFIX %f %p`` against a real S3 server (SeaweedFS) and
a real PostgreSQL recovery: exact keys, exit 1 only for "no such key", 126 when the store cannot
answer, and the prefetch spool."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard
from support.bucketcalls import new_prefix, put, restore, spooled
from support.holders import holders_of
from support.postgres_user import S3_PACKAGES, install_for_postgres
from support.recovery import backup_then_rows, complete_segments
from support.seaweed import SeaweedS3, free_port_pairs
from support.servers import PgServer
from support.streams import wait_for
from support.tcpproxy import TcpProxy
from support.walgen import SEGMENT, name_of, wal_segment

from receivewal.archive.durable import temporary_name
from receivewal.restore.call import source_id
from receivewal.restore.filler import SPOOL_DIR, Spool
from receivewal.restore.remote import BucketSource
from receivewal.wal.names import AtRest

pytestmark = pytest.mark.server


def segment(segno: int, timeline: int = 1) -> bytes:
    """Segment ``segno``: valid WAL of its own (restore checks what it serves)."""
    return wal_segment(segno, timeline)


@pytest.fixture
def url(store: SeaweedS3) -> str:
    """A fresh prefix holding the identity object of the archive of ``SYSID``."""
    return new_prefix(store)


def wait_for_file(path: Path, what: str) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"{what} never appeared"
        time.sleep(0.05)


@pytest.mark.parametrize("form", ["plain", "zstd"])
def test_restores_plain_and_zstd_objects_byte_identical(url: str, tmp_path: Path,
                                                        form: str) -> None:
    """The object under PREFIX/<name> (or <name>.zst) comes back to %p exactly as written."""
    data = segment(3)
    if form == "zstd":
        put(url, name_of(3) + ".zst",
            zstandard.ZstdCompressor(write_checksum=True).compress(data))
    else:
        put(url, name_of(3), data)
    target = tmp_path / "RECOVERYXLOG"
    done = restore(url, name_of(3), target, "--prefetch", "0")
    assert done.returncode == 0, done.stderr
    assert target.read_bytes() == data
    assert os.listdir(tmp_path) == ["RECOVERYXLOG"]


def test_missing_key_is_exit_1(url: str, tmp_path: Path) -> None:
    """"No such key" for every form is the only exit 1: recovery may end there."""
    put(url, name_of(3), segment(3))
    done = restore(url, name_of(4), tmp_path / "RECOVERYXLOG")
    assert done.returncode == 1, done.stderr
    assert "is not in the archive" in done.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("fault", ["store-down", "wrong-secret"])
def test_store_down_or_wrong_credentials_is_126(url: str, tmp_path: Path, fault: str) -> None:
    """A store that cannot be reached or rejects the credentials is retried a few times, then
    exit 126 (never 1, which would end recovery early), with one line naming the object."""
    put(url, name_of(3), segment(3))
    env = ({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port_pairs(1)[0]}"}
           if fault == "store-down" else {"AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    done = restore(url, name_of(3), tmp_path / "RECOVERYXLOG", env=env)
    assert done.returncode == 126, done.stderr
    # one error line (and, should the retries take over 5 s, the line saying what it waits for)
    errors = [line for line in done.stderr.splitlines()
              if not line.startswith("receivewal restore: waiting for")]
    assert len(errors) == 1, done.stderr
    assert name_of(3) in errors[0]
    assert os.listdir(tmp_path) == []


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within 60 s"
        time.sleep(0.05)


def test_prefetch_serves_later_calls_from_the_spool(url: str, tmp_path: Path) -> None:
    """After N is restored, N+1..N+k are fetched into pg_wal/.receivewal/prefetch; the call for
    N+1, made at once, waits for the filler rather than fetching the object again, and is a
    rename from the spool; one filler follows the calls (the same process moves the window
    on), and the spool never holds more than the asked file and the k after it."""
    for segno in range(3, 8):
        put(url, name_of(segno), segment(segno))
    target = tmp_path / "RECOVERYXLOG"
    assert restore(url, name_of(3), target, "--prefetch", "2").returncode == 0
    lock = tmp_path / SPOOL_DIR / ".lock"
    filler = holders_of(lock)
    assert len(filler) == 1, "one filler holds the spool's lock"
    done = restore(url, name_of(4), target, "--prefetch", "2")
    assert done.returncode == 0, done.stderr
    assert "from the prefetch spool" in done.stderr
    assert target.read_bytes() == segment(4)
    spool = Spool.beside(target, source_id(url))
    wait_for_file(spool.dir / name_of(6), "the next window")
    assert spooled(spool) == [name_of(5), name_of(6)]
    done = restore(url, name_of(5), target, "--prefetch", "2")
    assert "from the prefetch spool" in done.stderr
    assert target.read_bytes() == segment(5)
    wait_for_file(spool.dir / name_of(7), "the window after the third call")
    assert spooled(spool) == [name_of(6), name_of(7)]
    assert holders_of(lock) == filler, "the same filler, alive across the calls"


def test_filler_exits_after_the_idle_limit_and_empties_its_spool(url: str,
                                                                 tmp_path: Path) -> None:
    """When no call comes for RECEIVEWAL_PREFETCH_IDLE seconds (recovery paused, or over
    where %p is not in a data directory), the filler removes its spooled files and exits;
    the next call starts a new one."""
    for segno in range(3, 6):
        put(url, name_of(segno), segment(segno))
    target = tmp_path / "RECOVERYXLOG"
    idle = {"RECEIVEWAL_PREFETCH_IDLE": "3"}  # long enough to see the filler under load
    assert restore(url, name_of(3), target, "--prefetch", "2", env=idle).returncode == 0
    spool = Spool.beside(target, source_id(url))
    lock = tmp_path / SPOOL_DIR / ".lock"
    first = holders_of(lock)
    assert first
    wait_until(lambda: not spool.busy(), "the idle filler to exit")
    assert spooled(spool) == []
    assert holders_of(lock) == []
    done = restore(url, name_of(4), target, "--prefetch", "2", env=idle)
    assert done.returncode == 0, done.stderr
    assert target.read_bytes() == segment(4)
    wait_for_file(spool.dir / name_of(5), "the new filler's window")


def test_leftovers_of_a_killed_prefetch_are_never_served(url: str, tmp_path: Path) -> None:
    """What a SIGKILLed filler can leave (a temporary file, and here even a torn file under
    the segment's name, or another archive's spool) is not served: the call fetches the
    object, and the next filler removes the leftovers."""
    for segno in range(3, 6):
        put(url, name_of(segno), segment(segno))
    target = tmp_path / "RECOVERYXLOG"
    spool = Spool.beside(target, source_id(url))
    spool.dir.mkdir(parents=True)
    (spool.dir / name_of(4)).write_bytes(segment(4)[:SEGMENT // 2])
    (spool.dir / temporary_name(name_of(5), "99999")).write_bytes(b"torn")
    other = Spool.beside(target, "another archive")
    other.dir.mkdir(parents=True)
    (other.dir / name_of(4)).write_bytes(segment(9))
    done = restore(url, name_of(4), target, "--prefetch", "1")
    assert done.returncode == 0, done.stderr
    assert "prefetch spool" not in done.stderr
    assert target.read_bytes() == segment(4)
    wait_for_file(spool.dir / name_of(5), "the prefetched segment")
    assert sorted(os.listdir(tmp_path / SPOOL_DIR)) == [".lock", spool.dir.name]
    assert spooled(spool) == [name_of(5)]


def test_sigkill_of_the_filler_mid_prefetch_then_calls_are_correct(
        url: str, seaweed: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The detached filler SIGKILLed while it fetches (it holds the spool's lock): every
    later call still restores the right bytes, and the next filler starts afresh. The store is
    reached through a proxy that stalls half-way through the first segment the filler fetches,
    so the filler is caught mid-fetch however fast the machine is."""
    for segno in range(3, 9):
        put(url, name_of(segno), segment(segno))
    proxy = TcpProxy(seaweed.ports["s3.port"])
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{proxy.port}")
        target = tmp_path / "RECOVERYXLOG"
        proxy.stall_after(SEGMENT + SEGMENT // 2)  # this call's segment, then half the next
        assert restore(url, name_of(3), target, "--prefetch", "4").returncode == 0
        # The filler holds the lock from before its fork, long before it fetches: kill it only
        # once its fetch has stalled (killed earlier, the stall would catch a later call)
        wait_for(proxy.stalled.is_set, what="the filler's fetch stalled half-way")
        lock = tmp_path / SPOOL_DIR / ".lock"
        wait_for(lambda: holders_of(lock), what="the filler holding the spool's lock")
        for pid in holders_of(lock):
            os.kill(pid, signal.SIGKILL)
        spool = Spool.beside(target, source_id(url))
        while spool.busy():
            time.sleep(0.05)
        proxy.resume()
        for segno in range(4, 9):
            done = restore(url, name_of(segno), target, "--prefetch", "4")
            assert done.returncode == 0, done.stderr
            assert target.read_bytes() == segment(segno)
    finally:
        proxy.close()


def test_two_concurrent_calls_for_the_same_file_both_succeed(url: str, tmp_path: Path) -> None:
    """Two calls racing for a spooled file: one renames it, the other fetches the object;
    both exit 0 with the same bytes."""
    for segno in range(3, 5):
        put(url, name_of(segno), segment(segno))
    first = tmp_path / "a"
    assert restore(url, name_of(3), first, "--prefetch", "1").returncode == 0
    spool = Spool.beside(first, source_id(url))
    wait_for_file(spool.dir / name_of(4), "the prefetched segment")
    argv = [sys.executable, "-m", "receivewal", "restore", "-D", url, "--prefetch", "1",
            name_of(4)]
    procs = [subprocess.Popen([*argv, str(tmp_path / t)], stderr=subprocess.PIPE, text=True)
             for t in ("b", "c")]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert (tmp_path / "b").read_bytes() == (tmp_path / "c").read_bytes() == segment(4)


def test_point_in_time_recovery_from_the_bucket_only(
        pg: PgServer, store: SeaweedS3, server_base: Path) -> None:
    """A base backup recovers with restore_command = receivewal restore -D s3://... and no
    local archive at all (segments uploaded plain and zstd-compressed, prefetch on): the
    recovered server has the primary's rows, and at promotion the filler empties its spool
    and exits (long before its idle limit)."""
    url = new_prefix(store, pg.sql("SELECT system_identifier FROM pg_control_system()"))
    backup, expected = backup_then_rows(pg, "from-bucket", segments=3)
    wal = pg.datadir / "pg_wal"
    names = [p.name for p in complete_segments(pg)]
    label = (backup.datadir / "backup_label").read_text()
    first = label.split("(file ")[1][:24]
    uploaded = [n for n in names if n >= first]
    for i, name in enumerate(uploaded):
        data = (wal / name).read_bytes()
        if i % 2:
            put(url, name + ".zst", zstandard.ZstdCompressor(write_checksum=True).compress(data))
        else:
            put(url, name, data)
    for path in wal.glob("*.history"):
        put(url, path.name, path.read_bytes())
    command = install_for_postgres(server_base, S3_PACKAGES)
    env = " ".join(f"{k}={v}" for k, v in store.env().items())
    try:
        backup.recover_from_archive(
            f"{env} RECEIVEWAL_PREFETCH_IDLE=600 {command} -D {url} --prefetch 3 %f %p")
        assert backup.sql("SELECT count(*), sum(id) FROM t") == expected
        spool = Spool.beside(backup.datadir / "pg_wal" / "RECOVERYXLOG", source_id(url))
        wait_until(lambda: not spool.busy(), "the filler to exit after promotion")
        assert spooled(spool) == []
        log = backup.logfile.read_text()
        assert "from the prefetch spool" in log
        for name in uploaded[:3]:
            assert f'restored log file "{name}" from archive' in log
    finally:
        backup.stop("immediate")


def test_a_source_asks_first_for_the_form_that_served_the_last_segment(url: str,
                                                                      tmp_path: Path) -> None:
    """The filler's source restores segment after segment: once a .zst object served one, the
    next is asked for as .zst first (one GET, not four); before that plain comes first, and a
    segment stored in another form is still found, byte for byte."""
    zstd = zstandard.ZstdCompressor(write_checksum=True)
    put(url, name_of(3) + ".zst", zstd.compress(segment(3)))
    put(url, name_of(4) + ".zst", zstd.compress(segment(4)))
    put(url, name_of(5), segment(5))
    source = BucketSource(url)
    assert source.forms(name_of(3))[0].fmt is AtRest.PLAIN
    assert source.restore(name_of(3), tmp_path / "a").endswith(".zst")
    assert source.forms(name_of(4))[0].fmt is AtRest.ZSTD
    source.restore(name_of(4), tmp_path / "b")
    source.restore(name_of(5), tmp_path / "c")
    assert [(tmp_path / t).read_bytes() for t in "abc"] == [segment(3), segment(4), segment(5)]
    assert source.forms(name_of(6))[0].fmt is AtRest.PLAIN
    # every form, then every form sealed (.age): a file absent in all of them is absent
    assert [(c.fmt, c.encrypted) for c in source.forms(name_of(6))] == \
        [(fmt, sealed) for sealed in (False, True) for fmt in AtRest]


BOTO_PROBE = ("import sys\n"
              "from receivewal.commands.cli import main\n"
              "status = main(sys.argv[1:])\n"
              "print('boto3' in sys.modules, file=sys.stderr)\n"
              "sys.exit(status)\n")


def test_with_a_filler_at_work_calls_ask_it_for_what_is_not_spooled(url: str,
                                                                   tmp_path: Path) -> None:
    """A call for a file the filler has not spooled (the last segment asked for again, a
    history file, a segment the bucket lacks) asks the filler, whose client is made: the
    file comes through the spool with the bucket's bytes, and the call itself never imports
    boto3; a missing segment is exit 1 with the usual line, after the one listing that tells
    a hole from the end (issue 32 item 3: boto3 is then imported, on a miss only)."""
    for segno in (3, 4):
        put(url, name_of(segno), segment(segno))
    history = b"1\t0/5000000\tno recovery target specified\n"
    put(url, "00000002.history", history)
    target = tmp_path / "pg_wal" / "RECOVERYXLOG"
    target.parent.mkdir()
    assert restore(url, name_of(3), target, "--prefetch", "2").returncode == 0
    spool = Spool.beside(target, source_id(url))
    wait_for_file(spool.dir / name_of(4), "the prefetched segment")
    for name, status, body in ((name_of(4), 0, segment(4)), (name_of(4), 0, segment(4)),
                               ("00000002.history", 0, history), (name_of(5), 1, None)):
        listed = body is None  # a segment missed: one listing, through boto3
        done = subprocess.run([sys.executable, "-c", BOTO_PROBE, "restore", "-D", url,
                               "--prefetch", "2", name, str(target)], capture_output=True,
                              text=True, check=False, timeout=120)
        lines = done.stderr.splitlines()
        assert (done.returncode, lines[-1]) == (status, str(listed)), done.stderr
        if body is None:
            assert lines[0] == (f'receivewal restore: "{name}" is not in the archive "{url}" '
                                "(no such key in any of its forms)")
        else:
            assert "from the prefetch spool" in lines[0]
            assert target.read_bytes() == body


def test_a_recoverys_first_call_starts_the_filler_and_no_call_imports_boto3(
        url: str, tmp_path: Path) -> None:
    """A recovery's first call (the next timeline's history file, %p in pg_wal) finds no
    filler: it starts one and asks it, so that neither it nor the first segment's call
    imports boto3; the filler learns the segment size from that first segment and spools
    the window after it. When recovery has ended (recovery.signal gone), the filler still
    answers the parent timeline's history file for a moment, then exits. The bytes are the
    bucket's, a missing file is exit 1."""
    for segno in (3, 4, 5):
        put(url, name_of(segno), segment(segno))
    history = b"1\t0/5000000\tno recovery target specified\n"
    put(url, "00000002.history", history)
    wal = tmp_path / "pg_wal"
    wal.mkdir()
    signal_file = tmp_path / "recovery.signal"
    signal_file.touch()
    spool = Spool.beside(wal / "RECOVERYXLOG", source_id(url))
    calls = (("00000003.history", "RECOVERYHISTORY", 1, None),
             ("00000002.history", "RECOVERYHISTORY", 0, history),
             (name_of(3), "RECOVERYXLOG", 0, segment(3)),
             (name_of(4), "RECOVERYXLOG", 0, segment(4)),
             ("00000001.history", "RECOVERYHISTORY", 1, None))
    for i, (name, target, status, body) in enumerate(calls):
        if i == 3:
            wait_for_file(spool.dir / name_of(5), "the window after the first segment")
        if i == 4:
            signal_file.unlink()
        done = subprocess.run([sys.executable, "-c", BOTO_PROBE, "restore", "-D", url,
                               "--prefetch", "2", name, str(wal / target)],
                              capture_output=True, text=True, check=False, timeout=120)
        lines = done.stderr.splitlines()
        assert (done.returncode, lines[-1]) == (status, "False"), done.stderr
        if body is None:
            assert "(no such key in any of its forms)" in lines[0]
        else:
            assert "from the prefetch spool" in lines[0]
            assert (wal / target).read_bytes() == body
        assert spool.busy()
    wait_until(lambda: not spool.busy(), "the filler to exit after recovery")
    assert spooled(spool) == []


def test_a_history_file_outside_pg_wal_starts_no_filler(url: str, tmp_path: Path) -> None:
    """A history file restored by hand (%p not in a pg_wal directory) starts no filler that
    would only idle: the call restores it itself, and leaves nothing beside %p."""
    put(url, "00000002.history", b"1\t0/5000000\tno recovery target specified\n")
    done = restore(url, "00000002.history", tmp_path / "RECOVERYHISTORY")
    assert done.returncode == 0, done.stderr
    assert os.listdir(tmp_path) == ["RECOVERYHISTORY"]
