"""``receivewal apply`` into PostgreSQL against PostgreSQL's own logical replication (a
subscription on the same publication), rows per second side by side on the same changes.

Run by hand (not in CI; tests/test_benchmarks.py runs it at its smallest size):
    .venv/bin/python bench/apply_throughput.py [--rows 100000] [--runs 3]

It starts a private PostgreSQL 15 (wal_level=logical) with a database ``src`` (a table of
``--rows`` rows with a primary key, published), creates one pgoutput slot per run for the
subscription and one for receivewal, then changes the table: ``--rows`` inserts, as many
updates and a fifth as many deletes, in transactions of 1,000 rows. receivewal's slot is
streamed into a change log once (``receivewal logical``, not timed); then, alternating, each
run applies the same changes into a fresh empty copy of the table:

- ``subscription``: ``CREATE SUBSCRIPTION ... WITH (create_slot = false, slot_name = ...,
  copy_data = false)`` on that run's slot (the server decodes the WAL and its apply worker
  applies it), timed until the subscription has confirmed the end LSN and the table holds
  the source's rows;
- ``receivewal apply``: ``receivewal apply -D LOG --to ...`` run to completion (it reads the
  change log, already decoded), with its CPU time and peak RSS.

It prints each run's pair (the subscription's wall time, apply's wall time, CPU and peak RSS,
and their ratio), then, per tool, the median wall time, changes per second, and for receivewal
its CPU and peak RSS, the load average, the ratio of the medians and the median of the pairs'
ratios. The subscription does more work (it decodes the WAL too): ``receivewal logical`` +
``apply`` together are printed as well.

With ``--delta`` each run also applies the same log into Delta tables (``receivewal apply
--to delta:DIR``, a fresh directory each run, the delta extra): its wall time, changes per
second, CPU, peak RSS and the Delta commits it made (per 100,000 changes), the table read back
with deltalake and checked against the source's rows. ``--delta-only`` leaves out the
subscription and the PostgreSQL target (the log's size alone then moves the figures: peak RSS
against ``--rows``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stream_throughput import compile_package, run_one
from support.logical import LOGICAL_CONF
from support.servers import PgServer, running_server

BATCH = 1000
SCHEMA = "CREATE TABLE t (id int PRIMARY KEY, v text, n int)"


def dsn(pg: PgServer, dbname: str) -> str:
    return f"host=127.0.0.1 port={pg.port} user=postgres dbname={dbname}"


def change(pg: PgServer, rows: int) -> int:
    """The changes: inserts, updates and deletes in transactions of BATCH rows; their count."""
    for first in range(1, rows + 1, BATCH):
        last = min(rows, first + BATCH - 1)
        pg.sql(f"INSERT INTO t SELECT g, md5(g::text), g FROM generate_series({first}, {last}) g",
               "src")
    for first in range(1, rows + 1, BATCH):
        last = min(rows, first + BATCH - 1)
        pg.sql(f"UPDATE t SET n = n + 1, v = v || 'u' WHERE id BETWEEN {first} AND {last}", "src")
    deletes = rows // 5
    for first in range(1, deletes + 1, BATCH):
        last = min(deletes, first + BATCH - 1)
        pg.sql(f"DELETE FROM t WHERE id BETWEEN {first} AND {last}", "src")
    return 2 * rows + deletes


def subscription_run(pg: PgServer, run: int, end: str, expected: str) -> float:
    """Wall seconds for the subscription on slot ``native_<run>`` to catch up to ``end``."""
    db = f"native_{run}"
    pg.sql(f"CREATE DATABASE {db}")
    pg.sql(SCHEMA, db)
    start = time.monotonic()
    pg.sql(f"CREATE SUBSCRIPTION sub_{run} CONNECTION '{dsn(pg, 'src')}' PUBLICATION pub WITH "
           f"(create_slot = false, slot_name = 'native_{run}', copy_data = false)", db)
    while True:
        done = pg.sql(f"SELECT latest_end_lsn >= '{end}' FROM pg_stat_subscription "
                      f"WHERE subname = 'sub_{run}' AND latest_end_lsn IS NOT NULL", db)
        if done == "t" and pg.sql("SELECT count(*) || ':' || sum(n) FROM t", db) == expected:
            break
        if time.monotonic() - start > 3600:
            raise SystemExit("the subscription did not catch up in an hour")
        time.sleep(0.02)
    wall = time.monotonic() - start
    pg.sql(f"ALTER SUBSCRIPTION sub_{run} DISABLE", db)
    pg.sql(f"ALTER SUBSCRIPTION sub_{run} SET (slot_name = NONE)", db)
    pg.sql(f"DROP SUBSCRIPTION sub_{run}", db)
    return wall


def timed(argv: list[str], said: list[str] | None = None) -> tuple[float, float, int]:
    """(wall s, CPU s, peak RSS KiB) of one process run to completion (it must exit 0); its
    standard output's lines into ``said``."""
    start = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        errors = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - start
        out.seek(0)
        if said is not None:
            said.extend(out.read().decode().splitlines())
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[2:4]} failed: {errors[-2000:].decode()}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def apply_run(pg: PgServer, run: int, log: Path, expected: str) -> tuple[float, float, int]:
    """(wall s, CPU s, peak RSS KiB) of ``receivewal apply`` into a fresh copy of the table."""
    db = f"applied_{run}"
    pg.sql(f"CREATE DATABASE {db}")
    pg.sql(SCHEMA, db)
    sample = timed([sys.executable, "-m", "receivewal", "apply", "-D", str(log), "--to",
                    dsn(pg, db)])
    held = pg.sql("SELECT count(*) || ':' || sum(n) FROM t", db)
    if held != expected:
        raise SystemExit(f"receivewal apply left {held}, the source holds {expected}")
    return sample[0], sample[1], sample[2]


def delta_run(base: Path, run: int, log: Path, expected: str
              ) -> tuple[float, float, int, int]:
    """(wall s, CPU s, peak RSS KiB, Delta commits) of ``receivewal apply --to delta:DIR``
    into a fresh directory; the table read back must hold the source's rows."""
    from deltalake import DeltaTable  # noqa: PLC0415 - the delta extra, with --delta only

    where = base / f"delta_{run}"
    said: list[str] = []
    wall, cpu, rss = timed([sys.executable, "-m", "receivewal", "apply", "-D", str(log),
                            "--to", f"delta:{where}"], said)
    found = re.search(r"\((\d+) Delta commits for \d+ changes read\)", said[-1] if said else "")
    if found is None:
        raise SystemExit(f"receivewal apply --to delta: said {said[-1:]}, not its commits")
    table = DeltaTable(str(where / "public" / "t")).to_pyarrow_table(columns=["n"])
    held = f"{table.num_rows}:{sum(int(n) for n in table.column('n').to_pylist())}"
    if held != expected:
        raise SystemExit(f"receivewal apply --to delta left {held}, the source holds {expected}")
    shutil.rmtree(where)
    return wall, cpu, rss, int(found.group(1))


def bench(rows: int, runs: int, *, delta: bool, delta_only: bool) -> None:
    # the launcher starts an apply worker at most once per wal_retrieve_retry_interval (5 s
    # by default): runs that follow each other closely would time that wait, not the apply
    with running_server(LOGICAL_CONF | {"max_logical_replication_workers": "8",
                                        "max_worker_processes": "16",
                                        "wal_retrieve_retry_interval": "50ms"}) as pg:
        pg.sql("CREATE DATABASE src")
        pg.sql(SCHEMA, "src")
        pg.sql("CREATE PUBLICATION pub FOR TABLE t", "src")
        for run in range(runs):
            pg.sql(f"SELECT pg_create_logical_replication_slot('native_{run}', 'pgoutput')",
                   "src")
        base = Path(tempfile.mkdtemp(prefix="apply-bench-"))
        log = base / "log"
        log.mkdir()
        common = [sys.executable, "-m", "receivewal", "logical", "-D", str(log), "-d",
                  dsn(pg, "src"), "-S", "rw", "-P", "pub", "--log-format", "json"]
        timed([*common, "--create-slot"])
        changes = change(pg, rows)
        end = pg.sql("SELECT pg_current_wal_lsn()", "src")
        expected = pg.sql("SELECT count(*) || ':' || sum(n) FROM t", "src")
        logged, _ = run_one([*common, "--endpos", end, "--no-loop"], env=dict(os.environ))
        native: list[float] = []
        applied: list[tuple[float, float, int]] = []
        deltas: list[tuple[float, float, int, int]] = []
        try:
            for run in range(runs):
                order = ("subscription", "apply") if run % 2 == 0 else ("apply", "subscription")
                for tool in ((*order, "delta") if delta else order) if not delta_only \
                        else ("delta",):
                    if tool == "subscription":
                        native.append(subscription_run(pg, run, end, expected))
                    elif tool == "apply":
                        applied.append(apply_run(pg, run, log, expected))
                    else:
                        deltas.append(delta_run(base, run, log, expected))
        finally:
            shutil.rmtree(base, ignore_errors=True)
    load = os.getloadavg()[0]
    if deltas:
        print_delta(changes, rows, deltas, load)
    if delta_only:
        return
    print(f"{changes} changes ({rows} inserts, {rows} updates, {rows // 5} deletes; "
          f"transactions of {BATCH}), {runs} alternating runs, load average {load:.1f}")
    print(f"{'run':>4} {'subscription s':>15} {'apply s':>8} {'apply CPU s':>12} "
          f"{'apply RSS MB':>13} {'apply / subscription':>21}")
    for run, (wall, (apply_wall, apply_cpu, apply_rss)) in enumerate(zip(native, applied,
                                                                         strict=True)):
        print(f"{run + 1:>4} {wall:15.2f} {apply_wall:8.2f} {apply_cpu:12.2f} "
              f"{apply_rss / 1024:13.1f} {wall / apply_wall:20.2f}x")
    wall_native = statistics.median(native)
    wall_apply = statistics.median(w for w, _, _ in applied)
    cpu = statistics.median(c for _, c, _ in applied)
    rss = statistics.median(r for _, _, r in applied) / 1024
    peak = max(r for _, _, r in applied) / 1024
    print("medians:")
    print(f"{'tool':28} {'wall s':>8} {'changes/s':>11} {'CPU s':>7} {'RSS MB':>7}")
    print(f"{'subscription':28} {wall_native:8.2f} {changes / wall_native:11.0f}")
    print(f"{'receivewal apply':28} {wall_apply:8.2f} {changes / wall_apply:11.0f} {cpu:7.2f} "
          f"{rss:7.1f}")
    both = wall_apply + logged[0]
    print(f"{'receivewal logical + apply':28} {both:8.2f} {changes / both:11.0f}")
    ratios = [n / a for n, (a, _, _) in zip(native, applied, strict=True)]
    print(f"receivewal apply peak RSS: {peak:.1f} MB (largest of the runs)")
    print(f"receivewal apply / subscription, changes/s: {wall_native / wall_apply:.2f}x "
          f"(median of the runs' ratios {statistics.median(ratios):.2f}x, "
          f"{min(ratios):.2f}-{max(ratios):.2f}x; with the log's capture: "
          f"{wall_native / both:.2f}x)")


def print_delta(changes: int, rows: int, deltas: list[tuple[float, float, int, int]],
                load: float) -> None:
    print(f"receivewal apply --to delta: {changes} changes ({rows} inserts, {rows} updates, "
          f"{rows // 5} deletes; transactions of {BATCH}), load average {load:.1f}")
    print(f"{'run':>4} {'wall s':>8} {'changes/s':>11} {'CPU s':>7} {'RSS MB':>7} "
          f"{'commits':>8} {'per 100,000 changes':>20}")
    for run, (wall, cpu, rss, commits) in enumerate(deltas):
        print(f"{run + 1:>4} {wall:8.2f} {changes / wall:11.0f} {cpu:7.2f} {rss / 1024:7.1f} "
              f"{commits:8d} {commits * 100_000 / changes:20.1f}")
    median_wall = statistics.median(w for w, _, _, _ in deltas)
    median_commits = statistics.median(c for _, _, _, c in deltas)
    print(f"delta: median {changes / median_wall:.0f} changes/s, CPU "
          f"{statistics.median(c for _, c, _, _ in deltas):.2f} s, peak RSS "
          f"{max(r for _, _, r, _ in deltas) / 1024:.1f} MB, "
          f"{median_commits * 100_000 / changes:.1f} Delta commits per 100,000 changes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows inserted (and updated)")
    parser.add_argument("--runs", type=int, default=3, help="alternating runs per tool")
    parser.add_argument("--delta", action="store_true",
                        help="also apply the log into Delta tables each run (the delta extra)")
    parser.add_argument("--delta-only", action="store_true",
                        help="only the Delta target: no subscription, no PostgreSQL target")
    args = parser.parse_args()
    compile_package()
    bench(args.rows, args.runs, delta=args.delta or args.delta_only, delta_only=args.delta_only)


if __name__ == "__main__":
    main()
