"""Start-up, side by side with the peers: ``receivewal restore`` of one segment against ``cp``,
and ``receivewal stream`` from exec to START_REPLICATION against ``pg_receivewal``; with
``--only backup`` or ``--only logical``, ``receivewal backup`` from exec to BASE_BACKUP against
``pg_basebackup``, or ``receivewal logical`` from exec to START_REPLICATION against
``pg_recvlogical``. Run by hand (not in CI)::

    .venv/bin/python bench/startup.py [--rounds 15] [--reference main] [--only backup]

It starts a private PostgreSQL 15 (``log_replication_commands``, millisecond log times),
archives one segment with ``receivewal stream --endpos``, and copies this checkout's package
byte-compiled where the server user reads it, as the recovery bench does. Then, alternating
``--rounds`` times:

- ``cp ARCHIVE/SEG OUT`` against ``python3 -m receivewal restore -D ARCHIVE --prefetch 0 SEG
  OUT`` (the call checks the segment's page headers, system identifier and record CRCs, and
  fsyncs OUT; ``cp`` does neither), wall time of each process;
- ``pg_receivewal -D NEW -d DSN -E NOW -n`` (NOW: the server's flush position) against
  ``python3 -S -m receivewal stream`` with the same options, each into a new directory: exec
  to the server's log line of its START_REPLICATION (a plain installation's interpreter:
  ``-S`` leaves out this virtual environment's editable-install hook, which an installed
  package does not have; the dependencies come from its site-packages on PYTHONPATH);
- ``--only backup``: ``pg_basebackup -D NEW -Ft -X none -c fast --compress=client-zstd`` against
  ``python3 -S -m receivewal backup -D ARCHIVE --fast``, exec to the server's log line of its
  BASE_BACKUP, then SIGINT (both give the backup up);
- ``--only logical`` (the server at ``wal_level=logical``, a publication of all tables, one
  pgoutput slot for each): ``pg_recvlogical --start -E NOW -o proto_version=1 -o
  publication_names=pub`` against ``python3 -S -m receivewal logical -D NEW -P pub -E NOW -n``,
  exec to the server's log line of its START_REPLICATION.

``--reference REV`` adds the package of another git revision to every round (``ref-`` rows),
alternated with this checkout's. Printed: each round's figures, then the median of each and its
ratio to the peer's median, and the load average before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from support.postgres_user import install_for_postgres, readable_by_postgres
from support.servers import PgServer, make_shared_dir, pg_bin

from receivewal.wal.lsn import format_lsn, parse_lsn

SEGMENT = 16 << 20
SITE = next(p for p in sys.path if p.endswith("site-packages"))


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def export_package(revision: str, into: Path) -> Path:
    """The ``receivewal`` package of a git revision under ``into``, with this checkout's
    compiled extensions."""
    into.mkdir()
    here = Path(__file__).resolve().parent.parent
    tar = subprocess.run(["git", "archive", revision, "receivewal"], check=True,
                         capture_output=True, cwd=here).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    for built in (here / "receivewal").rglob("*.so"):
        shutil.copy(built, into / built.relative_to(here))
    return into / "receivewal"


def archive_one_segment(server: PgServer, directory: Path) -> str:
    """One completed segment of WAL archived by ``receivewal stream``; its name."""
    server.sql("SELECT pg_create_physical_replication_slot('bench', true)")
    server.sql("CREATE TABLE filler AS SELECT g, md5(g::text) FROM generate_series(1, 100000) g")
    end = parse_lsn(server.switch_wal())
    end = (end + SEGMENT - 1) // SEGMENT * SEGMENT
    directory.mkdir()
    subprocess.run([sys.executable, "-m", "receivewal", "stream", "-D", str(directory), "-d",
                    server.dsn, "-S", "bench", "--endpos", format_lsn(end), "-n",
                    "--log-format", "json"], check=True, capture_output=True, timeout=300)
    readable_by_postgres(directory)
    return sorted(p.name for p in directory.iterdir() if len(p.name) == 24)[-1]


def children_cpu() -> float:
    """CPU seconds of this process's finished children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_call(command: str, out: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one shell-less run of ``command`` (split on spaces, leading
    NAME=value words put into its environment); ``out`` removed after."""
    words = command.split()
    env = dict(os.environ)
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    began, cpu = time.perf_counter(), children_cpu()
    subprocess.run(words, check=True, env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - began
    out.unlink()
    return seconds, children_cpu() - cpu


def to_start_replication(server: PgServer, argv: list[str], env: dict[str, str],
                         directory: Path | None,
                         command: str = "START_REPLICATION") -> tuple[float, float]:
    """(seconds from exec of ``argv`` to the server's log line of its ``command``, the CPU
    seconds of the whole run: it is stopped by SIGINT once that line is there, if its end
    position has not ended it); ``directory`` made before and removed after."""
    if directory is not None:
        directory.mkdir()
    offset = server.logfile.stat().st_size
    began, cpu = time.time(), children_cpu()
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    stamp = None
    try:
        while stamp is None and time.time() - began < 60:
            stamp = _command_logged(server, offset, command)
            if stamp is None and process.poll() is not None:
                stamp = _command_logged(server, offset, command)
                break
            time.sleep(0.005)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
    cpu = children_cpu() - cpu
    if directory is not None:
        shutil.rmtree(directory)
    if stamp is None:
        raise SystemExit(f"no {command} in the server's log for {argv}")
    return stamp - began, cpu


def _command_logged(server: PgServer, offset: int, command: str) -> float | None:
    """The time of the first line of ``command`` in the server's log after ``offset``."""
    with server.logfile.open("rb") as log:
        log.seek(offset)
        lines = log.read().decode(errors="replace").splitlines()
    for line in lines:
        if f"command: {command}" in line:
            when = datetime.strptime(line[:23] + " +0000", "%Y-%m-%d %H:%M:%S.%f %z")
            return when.timestamp()
    return None


def command_rounds(which: str, server: PgServer, base: Path, packages: dict[str, str],
                   rounds: int) -> None:
    """``--only backup`` or ``--only logical``: each package's command against its peer,
    alternating, exec to the server's log line of its BASE_BACKUP or START_REPLICATION."""
    def ours(tag: str) -> tuple[list[str], dict[str, str]]:
        lib = packages[tag].split()[0].removeprefix("PYTHONPATH=")
        return ([sys.executable, "-S", "-m", "receivewal", which],
                dict(os.environ, PYTHONPATH=f"{lib}:{SITE}"))

    new = base / "new"
    if which == "logical":
        server.sql("CREATE PUBLICATION pub FOR ALL TABLES")
        for slot in ("peer", *packages):
            server.sql(f"SELECT pg_create_logical_replication_slot('bench_{slot}', 'pgoutput')")
        peer = "pg_recvlogical"
        command = "START_REPLICATION"
    else:
        peer = "pg_basebackup"
        command = "BASE_BACKUP"
    times: dict[str, list[tuple[float, float]]] = {
        name: [] for name in [peer, *(f"receivewal {which} ({tag})" for tag in packages)]}
    runs: dict[str, tuple[list[str], dict[str, str], Path | None]]
    for i in range(rounds):
        now = server.sql("SELECT pg_current_wal_flush_lsn()")
        if which == "logical":
            runs = {peer: ([pg_bin("pg_recvlogical"), "-d", server.dsn, "-S", "bench_peer",
                            "--start", "-f", "-", "-E", now, "-n", "-o", "proto_version=1",
                            "-o", "publication_names=pub"], dict(os.environ), None)}
            runs |= {f"receivewal logical ({tag})": (
                [*ours(tag)[0], "-D", str(new), "-d", server.dsn, "-S", f"bench_{tag}", "-P",
                 "pub", "-E", now, "-n"], ours(tag)[1], new) for tag in packages}
        else:
            runs = {peer: ([pg_bin("pg_basebackup"), "-D", str(new), "-Ft", "-X", "none", "-c",
                            "fast", "--compress=client-zstd", "-d", server.dsn],
                           dict(os.environ), new)}
            runs |= {f"receivewal backup ({tag})": (
                [*ours(tag)[0], "-D", str(base / "archive"), "-d", server.dsn, "--fast",
                 "--no-sync"], ours(tag)[1], None) for tag in packages}
        for name, (argv, env, directory) in runs.items():
            times[name].append(to_start_replication(server, argv, env, directory, command))
        line = "  ".join(f"{name} {values[-1][0] * 1000:.0f} ({values[-1][1] * 1000:.0f})"
                         for name, values in times.items())
        print(f"  round {i + 1}, ms (CPU ms): {line}", flush=True)
    summary(f"exec to {command}", peer, times)


def summary(title: str, peer: str, figures: dict[str, list[tuple[float, float]]]) -> None:
    print(f"\n{title}: median of {len(figures[peer])} rounds (ratio to {peer}'s median); "
          "CPU of the whole process")
    base = statistics.median(w for w, _ in figures[peer])
    for name, pairs in figures.items():
        values = [w for w, _ in pairs]
        median = statistics.median(values)
        quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [median] * 3
        cpu = statistics.median(c for _, c in pairs)
        print(f"  {name:<28} {median * 1000:7.1f} ms  (quartiles {quartiles[0] * 1000:.1f}-"
              f"{quartiles[2] * 1000:.1f})  {median / base:5.2f}x   CPU {cpu * 1000:6.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--reference", metavar="REV",
                        help="also run this git revision's package, alternated with this one")
    parser.add_argument("--only", choices=("restore", "stream", "backup", "logical"),
                        default=None)
    args = parser.parse_args()
    base = make_shared_dir("receivewal-startup-")
    server = PgServer(base)
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        server.init({"log_min_messages": "log", "log_replication_commands": "on",
                     "log_line_prefix": "'%m [%p] '", "log_timezone": "'UTC'",
                     **({"wal_level": "logical"} if args.only == "logical" else {})})
        stack.callback(server.stop, "immediate")
        server.start_or_fail()
        segment = archive_one_segment(server, base / "archive")
        packages = {"this": install_for_postgres(base).removesuffix(" restore")}
        if args.reference:
            packages["ref"] = install_for_postgres(
                base, package=export_package(args.reference, base / "ref"),
                lib_name="pylib-ref").removesuffix(" restore")
        print(f"start-up, {args.rounds} rounds alternating; load before: {load()}", flush=True)
        if args.only in {"backup", "logical"}:
            command_rounds(args.only, server, base, packages, args.rounds)
            print(f"load after: {load()}")
            return
        out = base / "out" / segment
        out.parent.mkdir()
        restores = {"cp": f"cp {base / 'archive' / segment} {out}"} | {
            f"receivewal restore ({tag})":
                f"{prefix} restore -D {base / 'archive'} --prefetch 0 {segment} {out}"
            for tag, prefix in packages.items()}
        restore_times: dict[str, list[tuple[float, float]]] = {name: [] for name in restores}
        streams: dict[str, tuple[list[str], dict[str, str]]] = {
            "pg_receivewal": ([pg_bin("pg_receivewal")], dict(os.environ))}
        for tag, prefix in packages.items():
            lib = prefix.split()[0].removeprefix("PYTHONPATH=")
            streams[f"receivewal stream ({tag})"] = (
                [sys.executable, "-S", "-m", "receivewal", "stream"],
                dict(os.environ, PYTHONPATH=f"{lib}:{SITE}"))
        stream_times: dict[str, list[tuple[float, float]]] = {name: [] for name in streams}
        for i in range(args.rounds):
            if args.only != "stream":
                for name, command in restores.items():
                    restore_times[name].append(timed_call(command, out))
            if args.only != "restore":
                now = server.sql("SELECT pg_current_wal_flush_lsn()")  # what is sent
                for name, (argv, env) in streams.items():
                    stream_times[name].append(to_start_replication(
                        server, [*argv, "-D", str(base / "new"), "-d", server.dsn, "-E", now,
                                 "-n"], env, base / "new"))
            line = "  ".join(f"{name} {values[-1][0] * 1000:.0f} ({values[-1][1] * 1000:.0f})"
                             for name, values in (restore_times | stream_times).items()
                             if values)
            print(f"  round {i + 1}, ms (CPU ms): {line}", flush=True)
        if args.only != "stream":
            summary("restore of one segment", "cp", restore_times)
        if args.only != "restore":
            summary("exec to START_REPLICATION", "pg_receivewal", stream_times)
        print(f"load after: {load()}")


if __name__ == "__main__":
    main()
