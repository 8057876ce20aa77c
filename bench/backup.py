"""Base backups: ``receivewal backup`` against ``pg_basebackup -Ft -Z zstd``, and
``receivewal recover``'s unpack against ``tar -x``. Run by hand (not in CI)::

    .venv/bin/python bench/backup.py [--scale 20] [--rounds 3]

It starts a private PostgreSQL 15 with pgbench's tables (``--scale``), ``receivewal stream``
archiving its WAL into a directory, and, alternating ``--rounds`` times:

* ``receivewal backup -D ARCHIVE --fast`` (zstd level 3 on this side, every file's SHA-256
  checked against the manifest as it arrives, fsynced, then the wait for the WAL in the
  archive);
* ``pg_basebackup -D DIR -Ft -Z zstd -X none --checkpoint fast`` (zstd level 3 on this side,
  no WAL: the archive has it; it fsyncs too; the manifest's checksums CRC-32C, its default,
  computed by the server, checked by nobody), and the same with ``--manifest-checksums SHA256``
  (what receivewal asks the server for);
* ``receivewal recover --to PGDATA`` of the backup just taken (decompressed, every file checked
  against the manifest, fsynced);
* ``tar -x`` of the same ``.tar.zst`` files (``tar -I zstd``) into a new directory, then
  ``sync -f`` on it: no check.

It prints each one's wall time (median of the rounds), MB/s of database and the client's CPU
seconds (the server's are the same for both backups), the ratios, and the load average.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from support.backups import pgbench
from support.servers import PgServer, make_shared_dir, pg_bin

RECEIVEWAL = [sys.executable, "-m", "receivewal"]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(action: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child processes) of ``action``."""
    cpu, start = children_cpu(), time.monotonic()
    action()
    return time.monotonic() - start, children_cpu() - cpu


def run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv[:4])} ... failed: {done.stderr.strip()[-2000:]}")
    return done.stdout


def database_bytes(pg: PgServer) -> int:
    return int(pg.sql("SELECT sum(pg_database_size(oid)) FROM pg_database"))


BASEBACKUP, BACKUP = "pg_basebackup -Ft -Z zstd", "receivewal backup"
BASEBACKUP_SHA = "pg_basebackup ... SHA256"
RECOVER, UNTAR = "receivewal recover", "tar -x (zstd), sync -f"


def one_round(pg: PgServer, base: Path, archive: Path, round_: int,
              times: dict[str, list[tuple[float, float]]]) -> None:
    """pg_basebackup, receivewal backup, its recover and tar -x of its tar, timed."""
    out = base / f"pgbb-{round_}"
    times.setdefault(BASEBACKUP, []).append(timed(lambda: run(
        [pg_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres",
         "-D", str(out), "-Ft", "-Z", "zstd", "-X", "none", "--checkpoint", "fast"])))
    shutil.rmtree(out)
    times.setdefault(BASEBACKUP_SHA, []).append(timed(lambda: run(
        [pg_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres",
         "-D", str(out), "-Ft", "-Z", "zstd", "-X", "none", "--checkpoint", "fast",
         "--manifest-checksums", "SHA256"])))
    printed: list[str] = []
    times.setdefault(BACKUP, []).append(timed(lambda: printed.append(
        run([*RECEIVEWAL, "backup", "-D", str(archive), "-d", pg.dsn, "--fast"]))))
    backup_id = printed[0].split()[1]
    pgdata = base / f"recovered-{round_}"
    times.setdefault(RECOVER, []).append(timed(lambda: run(
        [*RECEIVEWAL, "recover", backup_id, "--to", str(pgdata), "-D", str(archive)])))
    untarred = base / f"untarred-{round_}"
    untarred.mkdir()
    stored = archive / "backups" / backup_id

    def untar() -> None:
        run(["tar", "-I", "zstd", "-xf", str(stored / "base.tar.zst"), "-C", str(untarred)])
        run(["sync", "-f", str(untarred)])

    times.setdefault(UNTAR, []).append(timed(untar))
    for path in (out, pgdata, untarred):
        shutil.rmtree(path)


def report(times: dict[str, list[tuple[float, float]]], size: int,
           args: argparse.Namespace) -> None:
    print(f"\ndatabase: {size / 1e6:.0f} MB (pgbench scale {args.scale}), "
          f"{args.rounds} rounds, median wall")
    medians = {name: statistics.median(w for w, _ in rows) for name, rows in times.items()}
    for name, rows in times.items():
        wall = medians[name]
        cpu = statistics.median(c for _, c in rows)
        print(f"  {name:<28} {wall:6.2f} s  {size / 1e6 / wall:7.1f} MB/s  "
              f"client CPU {cpu:6.2f} s")
    print(f"backup: receivewal / pg_basebackup, wall {medians[BACKUP] / medians[BASEBACKUP]:.2f}x"
          f" (/ pg_basebackup with SHA256 {medians[BACKUP] / medians[BASEBACKUP_SHA]:.2f}x)")
    print(f"unpack: recover / tar -x, wall {medians[RECOVER] / medians[UNTAR]:.2f}x")
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=int, default=20, help="pgbench scale (15 MB each)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    base = make_shared_dir("receivewal-bench-backup-")
    pg = PgServer(base, "primary")
    streamer = None
    try:
        pg.init()
        pg.start()
        run(pgbench(pg, "-i", "-q", "-s", str(args.scale)))
        size = database_bytes(pg)
        archive = base / "archive"
        archive.mkdir()
        log = (base / "stream.log").open("wb")
        streamer = subprocess.Popen([*RECEIVEWAL, "stream", "-D", str(archive), "-d", pg.dsn],
                                    stdout=subprocess.DEVNULL, stderr=log)
        time.sleep(3)
        times: dict[str, list[tuple[float, float]]] = {}
        for round_ in range(args.rounds):
            one_round(pg, base, archive, round_, times)
            print(f"round {round_ + 1}: " + ", ".join(f"{name} {rows[-1][0]:.2f} s"
                                                     for name, rows in times.items()))
        report(times, size, args)
    finally:
        if streamer is not None:
            streamer.terminate()
            streamer.wait(timeout=30)
        pg.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
