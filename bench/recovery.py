"""Point-in-time recovery of a base backup: ``cp`` against ``receivewal restore`` as PostgreSQL's
restore_command, on the same WAL. Run by hand (not in CI)::

    .venv/bin/python bench/recovery.py [--segments 48] [--rounds 2] [--modes cp,plain,...]

It starts a private PostgreSQL 15, initialises pgbench (``--scale``, 5 by default), takes a
base backup, writes ``--segments`` segments of pgbench WAL after it and archives them twice
with ``receivewal stream --endpos``: plain and
``-Z zstd``; the zstd archive's files are also uploaded to a local S3 server (SeaweedFS, started
as the tests start it). Then it recovers a fresh copy of the backup ``--rounds`` times per mode,
the modes alternating, with:

- ``cp``: ``cp ARCHIVE/%f %p`` on the plain archive (the baseline);
- ``plain`` / ``zstd``: ``receivewal restore -D ARCHIVE %f %p`` on each archive;
- ``plain-prefetch`` / ``zstd-prefetch``: the same with ``--prefetch 8``;
- ``bucket``: ``receivewal restore -D s3://BUCKET/PREFIX %f %p`` (prefetch on, its default);
- ``bucket-noprefetch``: the same with ``--prefetch 0``.

With ``--reference REF`` (a git revision, e.g. ``main``), every mode also runs as
``ref-MODE`` with that revision's package, alternating with this checkout's: the two are
compared under the same load.

Each recovery is timed from ``pg_ctl start`` to the end of recovery (the server leaves recovery
when the archive has no next file), and the recovered server must hold the primary's rows.
Printed: seconds per run, the best per mode, the ratio to ``cp`` and the extra cost per
restore_command call. Run as root (the server runs as ``postgres``, which reads a copy of the
package through the system python3, as a system-wide installation would) or as the server
user.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from support.postgres_user import S3_PACKAGES, install_for_postgres, readable_by_postgres
from support.seaweed import SeaweedS3, running_seaweed
from support.servers import IS_ROOT, PgServer, make_shared_dir, pg_bin

from receivewal.archive.bucket import Bucket
from receivewal.archive.directory import Archive
from receivewal.archive.identity import claim_identity
from receivewal.wal.lsn import format_lsn, parse_lsn
from receivewal.wal.names import is_other_wal_file_name, parse_segment_file_name

SEGMENT = 16 << 20
MODES = ("cp", "plain", "plain-prefetch", "zstd", "zstd-prefetch", "bucket",
         "bucket-noprefetch")
CHECK = "SELECT count(*), sum(delta) FROM pgbench_history"


@dataclass(frozen=True)
class Run:
    mode: str
    seconds: float
    restored: int  # files PostgreSQL restored from the archive


def make_wal(server: PgServer, segments: int, scale: int) -> tuple[PgServer, int]:
    """pgbench's tables at ``scale``, a base backup, then at least ``segments`` segments of
    pgbench WAL after it; the backup and the end LSN (a segment boundary, after a switch)."""
    subprocess.run([pg_bin("pgbench"), "-i", "-q", "-s", str(scale), "-h", "127.0.0.1", "-p",
                    str(server.port), "-U", "postgres", "postgres"], check=True,
                   capture_output=True)
    for slot in ("plain", "zstd"):
        server.sql(f"SELECT pg_create_physical_replication_slot('{slot}', true)")
    backup = server.base_backup("backup")
    start = parse_lsn(server.current_lsn())
    while parse_lsn(server.current_lsn()) - start < segments * SEGMENT:
        subprocess.run([pg_bin("pgbench"), "-n", "-c", "2", "-t", "2000", "-h", "127.0.0.1",
                        "-p", str(server.port), "-U", "postgres", "postgres"], check=True,
                       capture_output=True)
    end = parse_lsn(server.switch_wal())
    return backup, (end + SEGMENT - 1) // SEGMENT * SEGMENT


def archive(server: PgServer, directory: Path, slot: str, end: int, *method: str) -> None:
    """``receivewal stream`` from the slot into ``directory`` up to ``end``."""
    directory.mkdir()
    subprocess.run([sys.executable, "-m", "receivewal", "stream", "-D", str(directory),
                    "-d", server.dsn, "-S", slot, "--endpos", format_lsn(end), "-n",
                    "--log-format", "json", *method],
                   check=True, capture_output=True, timeout=600)
    readable_by_postgres(directory)


def upload(store: SeaweedS3, directory: Path) -> str:
    """Put the archive's identity object (as the daemon does first) and WAL files (segments,
    history files) under a prefix; its URL."""
    os.environ.update(store.env())
    url = f"s3://{store.bucket}/recovery"
    bucket = Bucket.connect(url)
    identity = Archive(directory).read_identity()
    if identity is None:
        raise SystemExit(f"{directory} has no identity file: restore needs the prefix's")
    claim_identity(bucket, identity)
    for path in sorted(directory.iterdir()):
        parsed = parse_segment_file_name(path.name, SEGMENT)
        if (parsed is not None and not parsed.partial) or is_other_wal_file_name(path.name):
            bucket.put_new(path.name, path)
    return url


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent).stdout.strip()


def export_package(revision: str, into: Path) -> Path:
    """The ``receivewal`` package of a git revision, written under ``into``."""
    into.mkdir()
    archive = subprocess.run(["git", "archive", revision, "receivewal"], check=True,
                             capture_output=True, cwd=Path(__file__).resolve().parent.parent)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    for source in (into / "receivewal" / "wal").glob("*.c"):
        built = Path(__file__).resolve().parent.parent / "receivewal" / "wal"
        for ext in built.glob(f"{source.stem}*.so"):  # the C scanner, as built here
            shutil.copy(ext, source.parent / ext.name)
    return into / "receivewal"


def recover(backup: PgServer, base: Path, name: str, command: str, expected: str, *,
            logs: Path | None = None) -> Run:
    """Recover a fresh copy of the backup with ``command``; time start to promotion (the
    server's log copied into ``logs``)."""
    server = PgServer(base, name)
    shutil.copytree(backup.datadir, server.datadir, symlinks=True)
    if IS_ROOT:
        subprocess.run(["chown", "-R", "postgres:postgres", str(server.datadir)], check=True)
    try:
        began = time.monotonic()
        server.recover_from_archive(command, timeout=600)
        seconds = time.monotonic() - began
        got = server.sql(CHECK)
        if got != expected:
            raise AssertionError(f"{name}: recovered {got}, the primary has {expected}")
        restored = server.logfile.read_text().count("from archive")
        if logs is not None:
            shutil.copy(server.logfile, logs / f"{name}.log")
    finally:
        server.stop("immediate")
        shutil.rmtree(server.datadir, ignore_errors=True)
    return Run(name.rsplit("-", maxsplit=1)[0], seconds, restored)


def report(runs: list[Run]) -> None:
    """Per mode: the runs, the best and the median, and against cp: the best over the best,
    and the median of each round's ratio to that round's cp run (steadier under a load that
    changes between rounds)."""
    by_mode = {mode: [r.seconds for r in runs if r.mode == mode]
               for mode in dict.fromkeys(r.mode for r in runs)}
    calls = max(r.restored for r in runs)
    cp = by_mode.get("cp")
    print(f"\n{'mode':<22} {'runs s':<30} {'best s':>7} {'median':>7} {'best vs cp':>10} "
          f"{'round/cp median [min..max]':>27} {'ms/call extra':>13}")
    for mode, seconds in by_mode.items():
        each = " ".join(f"{s:.2f}" for s in seconds)
        best, median = min(seconds), statistics.median(seconds)
        if cp:
            rounds = sorted(s / c for s, c in zip(seconds, cp, strict=False))
            ratio = f"{best / min(cp):>9.2f}x"
            spread = (f"{statistics.median(rounds):.2f}x [{rounds[0]:.2f}..{rounds[-1]:.2f}]")
            extra = f"{(best - min(cp)) / calls * 1000:>13.1f}"
        else:
            ratio, spread, extra = "", "", ""
        print(f"{mode:<22} {each:<30} {best:>7.2f} {median:>7.2f} {ratio:>10} {spread:>27} "
              f"{extra:>13}")
    print(f"({calls} files restored per recovery; load average now "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--segments", type=int, default=48, help="segments of WAL to replay")
    parser.add_argument("--rounds", type=int, default=2, help="recoveries per mode")
    parser.add_argument("--scale", type=int, default=5,
                        help="pgbench -i scale (15 MB each): the base backup's size")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes")
    parser.add_argument("--logs", type=Path, metavar="DIR",
                        help="keep each recovery's server log in this directory")
    parser.add_argument("--reference", metavar="REF",
                        help="also run each mode (but cp) with this git revision's package")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",")]
    if set(modes) - set(MODES):
        parser.error(f"unknown modes {sorted(set(modes) - set(MODES))}; known: {MODES}")
    base = make_shared_dir("receivewal-recovery-")
    server = PgServer(base)
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        server.init({"max_wal_size": "'4GB'", "checkpoint_timeout": "'30min'",
                     "wal_keep_size": "'4GB'"})
        stack.callback(server.stop, "immediate")
        server.start_or_fail()
        backup, end = make_wal(server, args.segments, args.scale)
        archive(server, base / "plain", "plain", end)
        archive(server, base / "zstd", "zstd", end, "-Z", "zstd")
        expected = server.sql(CHECK)
        server.stop()
        print(f"{args.segments}+ segments of pgbench WAL up to {format_lsn(end)}", flush=True)
        restores = {"": install_for_postgres(base, S3_PACKAGES)}
        if args.reference:
            print(f"ref- modes: the package of {args.reference} ("
                  f"{git('rev-parse', '--short', args.reference)})", flush=True)
            restores["ref-"] = install_for_postgres(
                base, S3_PACKAGES, package=export_package(args.reference, base / "ref"),
                lib_name="pylib-ref")
        env = ""
        if {"bucket", "bucket-noprefetch"} & set(modes):
            store = stack.enter_context(running_seaweed(base / "s3"))
            url = upload(store, base / "zstd")
            env = " ".join(f"{k}={v}" for k, v in store.env().items())
        commands = {"cp": f'cp "{base / "plain"}/%f" "%p"'}
        for tag, restore in restores.items():
            commands |= {
                f"{tag}plain": f"{restore} -D {base / 'plain'} --prefetch 0 %f %p",
                f"{tag}plain-prefetch": f"{restore} -D {base / 'plain'} --prefetch 8 %f %p",
                f"{tag}zstd": f"{restore} -D {base / 'zstd'} --prefetch 0 %f %p",
                f"{tag}zstd-prefetch": f"{restore} -D {base / 'zstd'} --prefetch 8 %f %p"}
            if env:
                commands[f"{tag}bucket"] = f"{env} {restore} -D {url} %f %p"
                commands[f"{tag}bucket-noprefetch"] = (f"{env} {restore} -D {url} --prefetch 0 "
                                                       "%f %p")
        runs = []
        for i in range(args.rounds):
            for mode in [f"{tag}{m}" for m in modes for tag in restores if m != "cp"
                         or not tag]:
                runs.append(recover(backup, base, f"{mode}-{i}", commands[mode], expected,
                                    logs=args.logs))
                print(f"  {mode} round {i + 1}: {runs[-1].seconds:.2f} s, "
                      f"{runs[-1].restored} files restored, data equal", flush=True)
    report(runs)


if __name__ == "__main__":
    main()
