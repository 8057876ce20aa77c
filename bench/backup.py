"""Base backups side by side with the tools they replace: ``receivewal backup`` against
``pg_basebackup``, and ``receivewal recover``'s unpack against ``zstd -dc | tar -x``. Run by hand
(not in CI)::

    .venv/bin/python bench/backup.py [--scale 20] [--rounds 3] [--pairs backup,server,recover]
                                     [--reference main]

It starts a private PostgreSQL 15 with pgbench's tables (``--scale``, 15 MB each) and
``receivewal stream`` archiving its WAL into a directory, then runs ``--rounds`` rounds; each
round runs every pair, the two sides back to back, the side that goes first alternating from
one round to the next:

* ``backup``: ``pg_basebackup -Ft -X none -c fast --compress=client-zstd
  --manifest-checksums=SHA256`` (client-side zstd level 3, no WAL: the archive has it; the
  manifest's checksums computed by the server, checked by nobody) against ``receivewal backup
  -D ARCHIVE --fast`` (zstd level 3 at rest, every file's SHA-256 checked against the manifest
  as it arrives, fsynced, then the wait until the archive holds the backup's WAL);
* ``server``: the same ``pg_basebackup`` (client-side zstd) against ``receivewal backup --fast
  --compress zstd:workers=2 --server-compress`` (the server compresses with two workers, the
  client decompresses to check every file); ``pg_basebackup --compress=server-zstd:workers=2``
  runs beside them, for the record;
* ``recover``: ``zstd -dc base.tar.zst | tar -x -C DIR`` then ``sync -f DIR`` (nothing checked)
  against ``receivewal recover ID --to PGDATA`` of the same backup (every file checked against
  the manifest, durable: see ``recovery/unpack.py``).

With ``--reference REF`` (a git revision), every receivewal side also runs with that revision's
package, in the same rounds.

It prints each run (wall seconds, CPU seconds of the process and its children, peak RSS), then
per side the median wall time, MB/s of database, median CPU and the largest peak RSS, and per
pair the median of the rounds' ratios (receivewal / the peer: lower is better), with the load
average of every round.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from support.backups import pgbench
from support.servers import PgServer, make_shared_dir, pg_bin

ROOT = Path(__file__).resolve().parent.parent
PAIRS = ("backup", "server", "recover")
PGBB = "pg_basebackup client-zstd"
PGBB_SERVER = "pg_basebackup server-zstd:workers=2"
BACKUP, BACKUP_SERVER = "receivewal backup", "receivewal backup --server-compress"
UNTAR, RECOVER = "zstd -dc | tar -x, sync -f", "receivewal recover"


@dataclass(frozen=True)
class Run:
    """One command's run: wall and CPU seconds (itself and its children), peak RSS in MB."""

    wall: float
    cpu: float
    rss: float


def run(argv: list[str], *, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> tuple[Run, str]:
    """Run ``argv`` to its end; its figures and its standard output. CPU is wait4's; the peak
    RSS GNU time's (a forked Python's own RSS before the exec would count in wait4's)."""
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr, \
            tempfile.NamedTemporaryFile() as peak:
        began = time.monotonic()
        child = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", peak.name, *argv],
                                 stdout=stdout, stderr=stderr, env=env, cwd=cwd)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.monotonic() - began
        child.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        stderr.seek(0)
        said, errors = stdout.read().decode(), stderr.read().decode()
        rss_kb = int(Path(peak.name).read_text().split()[-1])
    if child.returncode:
        raise SystemExit(f"{' '.join(argv[:6])} ... failed: {errors.strip()[-2000:]}")
    return Run(wall, usage.ru_utime + usage.ru_stime, rss_kb / 1024), said


def export_package(revision: str, into: Path) -> Path:
    """The ``receivewal`` package of a git revision under ``into`` (with this checkout's
    compiled modules); the directory to put on PYTHONPATH."""
    into.mkdir()
    archive = subprocess.run(["git", "archive", revision, "receivewal"], check=True,
                             capture_output=True, cwd=ROOT)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    for built in (ROOT / "receivewal").rglob("*.so"):
        target = into / built.relative_to(ROOT)
        if target.parent.is_dir():
            shutil.copy(built, target)
    return into


class Bench:
    """The server, its archive, and the runs so far."""

    def __init__(self, base: Path, pg: PgServer, archive: Path,
                 packages: dict[str, Path]) -> None:
        self.base, self.pg, self.archive = base, pg, archive
        self.packages = packages  # tag ("" for this checkout) -> the package's root
        self.runs: dict[str, list[Run]] = {}
        self.ratios: dict[tuple[str, str], list[float]] = {}
        self.count = self.rounds = 0

    def receivewal(self, tag: str, *args: str) -> tuple[Run, str]:
        env = {**os.environ, "PYTHONPATH": str(self.packages[tag])}
        # not from the checkout's directory: ``-m`` would import the package found there
        return run([sys.executable, "-m", "receivewal", *args], env=env, cwd=self.base)

    def pg_basebackup(self, compress: str) -> Run:
        self.count += 1
        out = self.base / f"pgbb-{self.count}"
        done, _ = run([pg_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.pg.port),
                       "-U", "postgres", "-D", str(out), "-Ft", "-X", "none", "-c", "fast",
                       f"--compress={compress}", "--manifest-checksums=SHA256"])
        shutil.rmtree(out)
        return done

    def backup(self, tag: str, *args: str) -> tuple[Run, str]:
        done, said = self.receivewal(tag, "backup", "-D", str(self.archive), "-d", self.pg.dsn,
                                     "--fast", *args)
        return done, said.split()[1]

    def recover(self, tag: str, backup_id: str) -> Run:
        self.count += 1
        pgdata = self.base / f"recovered-{self.count}"
        done, _ = self.receivewal(tag, "recover", backup_id, "--to", str(pgdata),
                                  "-D", str(self.archive))
        shutil.rmtree(pgdata)
        return done

    def untar_of(self, ids: dict[str, str], tag: str) -> Run:
        return self.untar(ids[tag])

    def recover_of(self, ids: dict[str, str], tag: str) -> Run:
        return self.recover(tag, ids[tag])

    def untar(self, backup_id: str) -> Run:
        self.count += 1
        into = self.base / f"untarred-{self.count}"
        into.mkdir()
        tar = self.archive / "backups" / backup_id / "base.tar.zst"
        done, _ = run(["sh", "-c", 'zstd -q -dc "$1" | tar -x -C "$2" && sync -f "$2"', "sh",
                       str(tar), str(into)])
        shutil.rmtree(into)
        return done

    def note(self, name: str, done: Run) -> Run:
        self.runs.setdefault(name, []).append(done)
        print(f"    {name:<44} {done.wall:6.2f} s  CPU {done.cpu:5.2f} s  "
              f"RSS {done.rss:6.1f} MB", flush=True)
        return done

    def pair(self, peer: str, ours: str, first_peer: bool, peer_run: Callable[[], Run],
             our_run: Callable[[], Run]) -> None:
        """Run both sides, in the order asked; note the ratio."""
        sides = [(peer, peer_run), (ours, our_run)]
        if not first_peer:
            sides.reverse()
        done = {name: self.note(name, action()) for name, action in sides}
        self.ratios.setdefault((ours, peer), []).append(done[ours].wall / done[peer].wall)

    def one_round(self, number: int, pairs: list[str]) -> None:
        first_peer = number % 2 == 0
        self.rounds += 1
        print(f"round {number + 1} (load {load()})", flush=True)
        ids: dict[str, str] = {}
        for tag in self.packages:
            def ours_backup(tag: str = tag) -> Run:
                done, ids[tag] = self.backup(tag)
                return done

            def ours_server(tag: str = tag) -> Run:
                return self.backup(tag, "--compress", "zstd:workers=2", "--server-compress")[0]

            if "backup" in pairs or "recover" in pairs:
                self.pair(PGBB, tag + BACKUP, first_peer, lambda: self.pg_basebackup(
                    "client-zstd"), ours_backup)
            if "server" in pairs:
                self.pair(PGBB, tag + BACKUP_SERVER, first_peer, lambda: self.pg_basebackup(
                    "client-zstd"), ours_server)
                if not tag:
                    self.note(PGBB_SERVER, self.pg_basebackup("server-zstd:workers=2"))
            if "recover" in pairs:
                self.pair(UNTAR, tag + RECOVER, first_peer,
                          functools.partial(self.untar_of, ids, tag),
                          functools.partial(self.recover_of, ids, tag))

    def report(self, size: int) -> None:
        print(f"\ndatabase: {size / 1e6:.0f} MB; median of {self.rounds} rounds")
        for name, runs in self.runs.items():
            wall = statistics.median(r.wall for r in runs)
            print(f"  {name:<44} {wall:6.2f} s  {size / 1e6 / wall:6.1f} MB/s  CPU "
                  f"{statistics.median(r.cpu for r in runs):5.2f} s  peak RSS "
                  f"{max(r.rss for r in runs):6.1f} MB")
        for (ours, peer), ratios in self.ratios.items():
            walls = (statistics.median(r.wall for r in self.runs[ours])
                     / statistics.median(r.wall for r in self.runs[peer]))
            print(f"{ours} / {peer}: {statistics.median(ratios):.2f}x median of the rounds' "
                  f"ratios ({', '.join(f'{r:.2f}' for r in ratios)}); {walls:.2f}x of the "
                  "median walls")
        print(f"load average at the end: {load()}")


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=int, default=20, help="pgbench scale (15 MB each)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", default=",".join(PAIRS),
                        help=f"comma-separated, of {', '.join(PAIRS)}")
    parser.add_argument("--reference", metavar="REF",
                        help="also run receivewal's sides with this git revision's package")
    args = parser.parse_args()
    pairs = [p.strip() for p in args.pairs.split(",")]
    if set(pairs) - set(PAIRS):
        parser.error(f"unknown pairs {sorted(set(pairs) - set(PAIRS))}; known: {PAIRS}")

    base = make_shared_dir("receivewal-bench-backup-")
    pg = PgServer(base, "primary")
    streamer = None
    try:
        packages = {"": ROOT}
        if args.reference:
            packages[f"{args.reference}: "] = export_package(args.reference, base / "ref")
        pg.init()
        pg.start()
        subprocess.run(pgbench(pg, "-i", "-q", "-s", str(args.scale)), check=True,
                       capture_output=True)
        size = int(pg.sql("SELECT sum(pg_database_size(oid)) FROM pg_database"))
        archive = base / "archive"
        archive.mkdir()
        with (base / "stream.log").open("wb") as log:
            streamer = subprocess.Popen(
                [sys.executable, "-m", "receivewal", "stream", "-D", str(archive), "-d",
                 pg.dsn], stdout=subprocess.DEVNULL, stderr=log)
        time.sleep(3)
        bench = Bench(base, pg, archive, packages)
        for number in range(args.rounds):
            bench.one_round(number, pairs)
        bench.report(size)
    finally:
        if streamer is not None:
            streamer.terminate()
            streamer.wait(timeout=30)
        pg.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
