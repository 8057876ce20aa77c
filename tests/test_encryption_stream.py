"""Encryption at rest, wired (issue 28 §4): ``stream --encrypt-to`` seals each segment when it
is completed, ``restore``/``verify`` take ``--identity``, against a real PostgreSQL 15.

One primary (1 MiB segments) and one archive for the whole module, streamed in three runs that
walk a key rotation: {OLD}, then {OLD, NEW}, then {NEW}; each run resumes from the sealed files
the one before left. A base backup taken before the first run recovers through
``restore_command = receivewal restore --identity FILE``: with both keys it reaches every
marker row; with the new key alone (the wrong key for the oldest files) or with no key the
restore exits 126 naming the file and who can read it, and PostgreSQL stops instead of
promoting with rows lost. The ``age`` command line decrypts every sealed file to the server's
own pg_wal file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import zstandard
from support.agekeys import KeyPair, age_command, age_keygen
from support.bucketcalls import restore
from support.postgres_user import install_for_postgres, readable_by_postgres
from support.recovery import copy_of, recover_or_stop
from support.seaweed import SeaweedS3
from support.servers import PgServer, make_shared_dir
from support.streams import log_events, lsn_to_int, receivewal

from receivewal.archive.bucket import Bucket
from receivewal.archive.recipients import recipient_set, recipients_file_text
from receivewal.wal.names import looks_like_segment

pytestmark = pytest.mark.server

SEGMENT = 1 << 20
IDENTITY = ".receivewal-archive.json"
MARKERS_PER_RUN = 3


@dataclass(frozen=True)
class Setup:
    base: Path
    primary: PgServer
    backup: PgServer
    archive: Path
    old: KeyPair
    new: KeyPair
    both: Path  # an identity file holding both keys
    runs: list[list[str]]  # the segment files each run sealed
    markers: int
    command: str  # the restore_command prefix, runnable by the server user


def write_markers(primary: PgServer, first: int, count: int) -> None:
    """Marker rows ``first`` .. ``first + count - 1``, each in a segment of its own."""
    for n in range(first, first + count):
        primary.sql(f"INSERT INTO marker VALUES ({n})")
        primary.sql("INSERT INTO filler SELECT g, repeat('x', 150) FROM generate_series(1, 2000) g")
        primary.switch_wal()


def stream(primary: PgServer, archive: Path, *args: str, env: dict[str, str] | None = None,
           ) -> subprocess.CompletedProcess[str]:
    """One run of ``receivewal stream`` from ``primary`` into ``archive``."""
    return receivewal("stream", "-D", str(archive), "-d", primary.dsn, "-S", "crypt", "-n",
                      *args, env=env)


def sealed_files(archive: Path) -> list[str]:
    return sorted(p.name for p in archive.iterdir() if p.name.endswith(".age"))


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    base = make_shared_dir("receivewal-crypt-")
    primary = PgServer(base, "primary")
    try:
        primary.init(initdb_args=("--wal-segsize=1",))
        primary.start()
        primary.sql("SELECT pg_create_physical_replication_slot('crypt', true)")
        primary.sql("CREATE TABLE marker (n int)")
        primary.sql("CREATE TABLE filler (id bigint, pad text)")
        backup = primary.base_backup("backup")
        old, new = age_keygen(base / "old.key"), age_keygen(base / "new.key")
        both = base / "both.key"
        both.write_text(old.path.read_text() + new.path.read_text())
        for key in (old.path, new.path, both):
            key.chmod(0o644)  # the server user runs restore_command (a test's keys only)
        archive = base / "archive"
        archive.mkdir()
        runs, markers = [], 0
        for recipients in ([old.recipient], [old.recipient, new.recipient], [new.recipient]):
            write_markers(primary, markers + 1, MARKERS_PER_RUN)
            markers += MARKERS_PER_RUN
            before = set(sealed_files(archive))
            end = primary.current_lsn()
            done = stream(primary, archive, "-E", end,
                          *(arg for r in recipients for arg in ("--encrypt-to", r)))
            assert done.returncode == 0, done.stderr[-3000:]
            runs.append(sorted(set(sealed_files(archive)) - before))
        primary.sql("CHECKPOINT")
        yield Setup(base, primary, backup, archive, old, new, both, runs, markers,
                    install_for_postgres(base, ("pyrage",)))
    finally:
        primary.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def age_decrypt(key: Path, path: Path) -> bytes:
    done = subprocess.run([age_command(), "-d", "-i", str(key), str(path)],
                          capture_output=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_each_run_seals_its_segments_to_its_set_and_the_record_lists_the_sets(
        setup: Setup) -> None:
    """Every completed segment is one file, NAME.FINGERPRINT.age, named for its run's set (no
    recipients file beside it); no plain complete segment is left; the identity record lists
    the three sets in order; the age command line decrypts each file with a key of its set to
    the server's own pg_wal file, and refuses it with a key outside its set."""
    archive = setup.archive
    plain = [p.name for p in archive.iterdir()
             if looks_like_segment(p.name) and not p.name.endswith(".partial")]
    assert plain == []
    sets = [recipient_set([setup.old.recipient]),
            recipient_set([setup.old.recipient, setup.new.recipient]),
            recipient_set([setup.new.recipient])]
    record = json.loads((archive / IDENTITY).read_text())
    assert [s["fingerprint"] for s in record["recipient_sets"]] == \
        [s.fingerprint for s in sets]
    for run, recipients in zip(setup.runs, sets, strict=True):
        assert run, "a run sealed nothing"
        for name in run:
            assert name == f"{name[:24]}.{recipients.fingerprint}.age"
            assert not (archive / (name + ".recipients")).exists()
            key = setup.new.path if setup.new.recipient in recipients.recipients \
                else setup.old.path
            assert age_decrypt(key, archive / name) == (setup.primary.pg_wal / name[:24]) \
                .read_bytes(), name
    outsider = setup.runs[0][0]  # {OLD} only: the new key cannot open it
    refused = subprocess.run([age_command(), "-d", "-i", str(setup.new.path),
                              str(archive / outsider)], capture_output=True, check=False)
    assert refused.returncode != 0
    assert not refused.stdout


def test_the_encrypted_archive_recovers_every_marker_with_the_identity(setup: Setup) -> None:
    """PITR of the base backup with restore_command = receivewal restore --identity FILE
    (both keys: the archive spans the rotation) reaches every marker row; the prefetch filler
    decrypts ahead of replay with the same identity file."""
    readable_by_postgres(setup.archive)
    server = copy_of(setup.backup, "recovered-both")
    command = f"RECEIVEWAL_PREFETCH_IDLE=3 {setup.command} -D {setup.archive} " \
              f"--identity {setup.both} %f %p"
    try:
        assert recover_or_stop(server, command), server.logfile.read_text()[-3000:]
        assert server.sql("SELECT count(*) FROM marker") == str(setup.markers)
        assert "from the prefetch spool" in server.logfile.read_text()  # the filler decrypts
    finally:
        server.stop("immediate")


def test_the_wrong_key_stops_recovery_with_126_naming_the_file(setup: Setup) -> None:
    """With the new key alone, the first segment sealed to {OLD} is refused: restore exits
    126 with one line naming the file and its recipients, and PostgreSQL stops instead of
    promoting with the marker rows lost."""
    readable_by_postgres(setup.archive)
    server = copy_of(setup.backup, "recovered-wrong")
    command = f"RECEIVEWAL_PREFETCH_IDLE=3 {setup.command} -D {setup.archive} " \
              f"--identity {setup.new.path} %f %p"
    try:
        promoted = recover_or_stop(server, command)
        log = server.logfile.read_text()
        assert not promoted, log[-3000:]
        errors = [line for line in log.splitlines()
                  if line.startswith("receivewal restore: error")]
        assert errors, log[-3000:]
        assert setup.old.recipient in errors[-1]
        assert str(setup.new.path) in errors[-1]
        assert "none of them can decrypt it" in errors[-1]
        assert "command not executable" in log  # PostgreSQL's words for 126
    finally:
        server.stop("immediate")


def restore_call(setup: Setup, name: str, target: Path, *args: str,
                 ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "receivewal", "restore", "-D",
                           str(setup.archive), "--prefetch", "0", *args, name, str(target)],
                          capture_output=True, text=True, check=False, timeout=60,
                          env={k: v for k, v in os.environ.items()
                               if k != "RECEIVEWAL_IDENTITY"})


def test_restore_without_an_identity_is_126_naming_who_can_read_it(setup: Setup,
                                                                   tmp_path: Path) -> None:
    """No --identity: exit 126 and one line naming the file, its recipients and the option;
    nothing written to %p. With it (the option or RECEIVEWAL_IDENTITY) the file is the
    server's."""
    name = setup.runs[1][0][:24]
    target = tmp_path / "RECOVERYXLOG"
    done = restore_call(setup, name, target)
    assert done.returncode == 126, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    for word in (name, setup.old.recipient, setup.new.recipient, "--identity"):
        assert word in lines[0], lines[0]
    assert not target.exists()
    done = restore_call(setup, name, target, "--identity", str(setup.old.path))
    assert done.returncode == 0, done.stderr
    assert target.read_bytes() == (setup.primary.pg_wal / name).read_bytes()


def verify(setup: Setup, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "receivewal", "verify", str(setup.archive),
                           *args], capture_output=True, text=True, check=False, timeout=120)


def test_verify_checks_sealed_segments_with_the_identity_and_reports_them_without(
        setup: Setup) -> None:
    """verify --identity (both keys) decrypts and checks every segment: recoverable, exit 0.
    Without it, each sealed segment is a not_checked problem naming its recipients, and the
    verdict is unknown (exit 3), never a pass."""
    done = verify(setup, "--identity", str(setup.both), "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 0, done.stdout[-3000:]
    assert report["recoverable"]
    assert len(report["segments"]) >= sum(map(len, setup.runs))
    sets = [recipient_set([setup.old.recipient]),
            recipient_set([setup.old.recipient, setup.new.recipient]),
            recipient_set([setup.new.recipient])]
    assert report["sealed"] == {name: recipients.describe()
                                for run, recipients in zip(setup.runs, sets, strict=True)
                                for name in run}
    done = verify(setup, "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 3
    assert report["verdict"] == "unknown"
    unchecked = {p["file"] for p in report["problems"] if p["kind"] == "not_checked"}
    assert unchecked == {name for run in setup.runs for name in run}
    assert not report["recoverable"]


@pytest.mark.parametrize("point", ["sealing", "sealed"])
def test_a_power_cut_while_sealing_loses_nothing_and_leaves_no_plaintext_beside(
        setup: Setup, point: str) -> None:
    """SIGKILL in the completion job, before the sealed file exists ("sealing") or once it is
    durable but the .partial not yet removed ("sealed"): the slot was never told more than
    the .partial held durably; restore --partial serves the .partial; the next run completes
    the segment, removes the .partial beside the sealed file, and every sealed file is the
    server's segment."""
    primary, archive = setup.primary, setup.base / f"archive-cut-{point}"
    archive.mkdir()
    slot = f"cut_{point}"
    primary.sql(f"SELECT pg_create_physical_replication_slot('{slot}', true)")
    write_markers(primary, 1000, 2)
    end = primary.current_lsn()
    args = ("stream", "-D", str(archive), "-d", primary.dsn, "-S", slot, "-n", "-E", end,
            "--encrypt-to", setup.old.recipient)
    cut = receivewal(*args, env={"RECEIVEWAL_CRASH_AT": point})
    assert cut.returncode == -9, cut.stderr[-3000:]
    partials = sorted(p.name for p in archive.iterdir() if p.name.endswith(".partial"))
    assert partials, sorted(os.listdir(archive))
    crashed = partials[0][:24]
    fingerprint = recipient_set([setup.old.recipient]).fingerprint
    sealed = (archive / f"{crashed}.{fingerprint}.age").exists()
    assert sealed == (point == "sealed")
    crashed_end = (int(crashed[8:16], 16) << 32) + (int(crashed[16:], 16) + 1) * SEGMENT
    assert lsn_to_int(primary.sql(f"SELECT restart_lsn FROM pg_replication_slots "
                                  f"WHERE slot_name = '{slot}'")) < crashed_end
    if not sealed:  # the .partial keeps the WAL until the sealed file is durable
        target = setup.base / f"partial-{point}"
        served = subprocess.run([sys.executable, "-m", "receivewal", "restore", "-D",
                                 str(archive), "--prefetch", "0", "--partial", crashed,
                                 str(target)], capture_output=True, text=True, check=False)
        assert served.returncode == 0, served.stderr
        assert target.read_bytes() == (primary.pg_wal / crashed).read_bytes()
    again = receivewal(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    names = sorted(os.listdir(archive))
    assert f"{crashed}.{fingerprint}.age" in names
    assert crashed + ".partial" not in names
    for name in sealed_files(archive):
        assert age_decrypt(setup.old.path, archive / name) == \
            (primary.pg_wal / name[:24]).read_bytes(), name
    primary.sql(f"SELECT pg_drop_replication_slot('{slot}')")


def test_a_power_cut_while_sealing_a_compressed_segment_loses_nothing(setup: Setup) -> None:
    """-Z zstd: SIGKILL before the first completed segment is sealed (its compressed file may
    still be under its temporary name). The next run seals it: every NAME.zst.age decrypts
    and decompresses to the server's segment, and no .partial or temporary file is left
    beside a sealed one."""
    primary, archive = setup.primary, setup.base / "archive-cut-zstd"
    archive.mkdir()
    primary.sql("SELECT pg_create_physical_replication_slot('cut_zstd', true)")
    write_markers(primary, 3000, 2)
    args = ("stream", "-D", str(archive), "-d", primary.dsn, "-S", "cut_zstd", "-n", "-E",
            primary.current_lsn(), "-Z", "zstd", "--encrypt-to", setup.old.recipient)
    cut = receivewal(*args, env={"RECEIVEWAL_CRASH_AT": "sealing"})
    assert cut.returncode == -9, cut.stderr[-3000:]
    assert sealed_files(archive) == []
    again = receivewal(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    primary.sql("SELECT pg_drop_replication_slot('cut_zstd')")
    sealed = sealed_files(archive)
    assert len(sealed) >= 2
    names = os.listdir(archive)
    for name in sealed:
        assert name.endswith(f".zst.{recipient_set([setup.old.recipient]).fingerprint}.age")
        assert name[:24] + ".zst.partial" not in names
        plain = zstandard.ZstdDecompressor().decompressobj().decompress(
            age_decrypt(setup.old.path, archive / name))
        assert plain == (primary.pg_wal / name[:24]).read_bytes(), name
    assert not [n for n in names if n.endswith(".receivewal-tmp")]


def test_uploads_carry_the_sealed_objects_and_restore_from_the_bucket_decrypts(
        setup: Setup, store: SeaweedS3, tmp_path: Path) -> None:
    """With --upload-to, each sealed segment goes up as one object, NAME.FINGERPRINT.age, as
    it sits (never plain, no recipients object); the prefix's identity object lists the set;
    restore from the bucket with --identity gives the server's segment, and without it exits
    126 naming the object and its recipients. verify of the bucket with the identity passes."""
    primary, archive = setup.primary, setup.base / "archive-up"
    archive.mkdir()
    primary.sql("SELECT pg_create_physical_replication_slot('up', true)")
    write_markers(primary, 2000, 2)
    url = f"s3://{store.bucket}/crypt-{os.getpid()}/wal"
    done = receivewal("stream", "-D", str(archive), "-d", primary.dsn, "-S", "up", "-n",
                      "-E", primary.current_lsn(), "--upload-to", url,
                      "--encrypt-to", setup.new.recipient)
    assert done.returncode == 0, done.stderr[-3000:]
    primary.sql("SELECT pg_drop_replication_slot('up')")
    bucket = Bucket.connect(url)
    names = {name for name, _ in bucket.list_files()}
    sealed = sealed_files(archive)
    assert sealed
    for name in sealed:
        assert name in names
        assert name + ".recipients" not in names
        assert name[:24] not in names  # never plain
        assert bucket.get_bytes(name, 1 << 22) == (archive / name).read_bytes()
    identity = json.loads(bucket.get_bytes(IDENTITY, 1 << 16))
    assert [s["recipients"] for s in identity["recipient_sets"]] == [[setup.new.recipient]]
    name = sealed[0][:24]
    target = tmp_path / "RECOVERYXLOG"
    without = restore(url, name, target, "--prefetch", "0")
    assert without.returncode == 126, without.stderr
    assert setup.new.recipient in without.stderr
    assert f"{url}/{sealed[0]}" in without.stderr
    assert not target.exists()
    served = restore(url, name, target, "--prefetch", "0", "--identity", str(setup.new.path))
    assert served.returncode == 0, served.stderr
    assert target.read_bytes() == (primary.pg_wal / name).read_bytes()
    checked = subprocess.run([sys.executable, "-m", "receivewal", "verify", url, "--identity",
                              str(setup.new.path), "--json"], capture_output=True, text=True,
                             check=False, timeout=120)
    report = json.loads(checked.stdout)
    assert {s["file"] for s in report["segments"]} >= set(sealed)
    assert not [p for p in report["problems"] if p["severity"] == "error"], report["problems"]


def test_analyzes_executor_decrypts_a_sealed_segment_with_the_identity(setup: Setup) -> None:
    """analyze's executor side (the task row Spark hands each executor, run here without
    Spark): with the identity file, a sealed segment and its sealed followers are decrypted
    and scanned clean, records and time marks included; without one, it is not_checked."""
    from receivewal.check.analyze import scan_row  # noqa: PLC0415 - the executor's function
    from receivewal.check.crosscheck import FollowerRun  # noqa: PLC0415

    name = setup.runs[1][0]
    segno = int(name[16:24], 16)

    after = next(n for n in sealed_files(setup.archive) if int(n[16:24], 16) == segno + 1)

    def row(identity: str | None) -> SimpleNamespace:
        follower = FollowerRun(1, segno + 1, 1, "", False, True, after.split(".")[1])
        return SimpleNamespace(
            archive=str(setup.archive), base=str(setup.archive), file=name, compression="",
            timeline=1, segno=segno, partial=False, followers=json.dumps([follower]),
            file_bytes=(setup.archive / name).stat().st_size, segment_size=SEGMENT,
            compressibility=False, identity=identity)

    scanned = scan_row(row(str(setup.both)))
    assert scanned["problems"] == []
    assert scanned["records"] > 0
    assert scanned["marks"]
    refused = scan_row(row(None))
    assert [p["kind"] for p in refused["problems"]] == ["not_checked"]


def old_layout(setup: Setup, archive: Path) -> None:
    """A copy of the archive as receivewal wrote it before sealed files were named for their
    set: each ``NAME.FINGERPRINT.age`` as ``NAME.age``, with ``NAME.age.recipients`` beside it
    (the bytes :func:`recipients_file_text` wrote)."""
    shutil.copytree(setup.archive, archive)
    sets = {s.fingerprint: s for s in (
        recipient_set([setup.old.recipient]),
        recipient_set([setup.old.recipient, setup.new.recipient]),
        recipient_set([setup.new.recipient]))}
    for name in sealed_files(archive):
        stem, fingerprint, _ = name.rsplit(".", 2)
        (archive / name).rename(archive / f"{stem}.age")
        (archive / f"{stem}.age.recipients").write_bytes(recipients_file_text(sets[fingerprint]))


def test_an_archive_sealed_beside_recipients_files_restores_and_verifies(
        setup: Setup, tmp_path: Path) -> None:
    """The older layout (each sealed file beside its recipients file) stays readable: restore
    with a key of each run's set gives the server's segments, without a key exit 126 naming
    the file's recipients, and verify with both keys passes, naming each file's set."""
    archive = setup.base / "archive-old-layout"
    old_layout(setup, archive)
    target = tmp_path / "RECOVERYXLOG"
    for run, key in zip(setup.runs, (setup.old, setup.both, setup.new), strict=True):
        name = run[0][:24]
        path = key.path if isinstance(key, KeyPair) else key
        done = subprocess.run([sys.executable, "-m", "receivewal", "restore", "-D",
                               str(archive), "--prefetch", "0", "--identity", str(path), name,
                               str(target)], capture_output=True, text=True, check=False,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert target.read_bytes() == (setup.primary.pg_wal / name).read_bytes()
    name = setup.runs[1][0][:24]
    without = subprocess.run([sys.executable, "-m", "receivewal", "restore", "-D", str(archive),
                              "--prefetch", "0", name, str(tmp_path / "x")], capture_output=True,
                             text=True, check=False, timeout=60,
                             env={k: v for k, v in os.environ.items()
                                  if k != "RECEIVEWAL_IDENTITY"})
    assert without.returncode == 126, without.stderr
    assert f"{name}.age" in without.stderr
    assert setup.new.recipient in without.stderr
    assert setup.old.recipient in without.stderr
    checked = subprocess.run([sys.executable, "-m", "receivewal", "verify", str(archive),
                              "--identity", str(setup.both), "--json"], capture_output=True,
                             text=True, check=False, timeout=120)
    assert checked.returncode == 0, checked.stdout[-3000:]
    report = json.loads(checked.stdout)
    assert set(report["sealed"]) == {f"{n.rsplit('.', 2)[0]}.age"
                                     for run in setup.runs for n in run}


def test_a_sealed_file_without_its_recipients_file_is_not_resumed_from_and_is_sealed_again(
        setup: Setup) -> None:
    """The resume scan trusts a sealed file of the older layout by its age header and
    recipients file: the newest one without its recipients file is passed over (said in the
    log), its segment streamed again and sealed again, now named for its set; the file then
    decrypts to the server's."""
    archive = setup.base / "archive-rescan"
    old_layout(setup, archive)
    newest = sealed_files(archive)[-1]
    (archive / (newest + ".recipients")).unlink()
    again = receivewal("stream", "-D", str(archive), "-d", setup.primary.dsn, "-n",
                       "-E", setup.primary.current_lsn(), "--encrypt-to", setup.new.recipient)
    assert again.returncode == 0, again.stderr[-3000:]
    rejected = [e for e in log_events(again.stderr) if e["event"] == "segment_file_rejected"]
    assert [e["file"] for e in rejected] == [newest]
    assert "has no recipients file" in str(rejected[0]["reason"])
    resealed = f"{newest[:24]}.{recipient_set([setup.new.recipient]).fingerprint}.age"
    assert age_decrypt(setup.new.path, archive / resealed) == \
        (setup.primary.pg_wal / newest[:24]).read_bytes()
