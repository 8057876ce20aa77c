"""``receivewal logical`` run as a user runs it, against a real PostgreSQL 15 with
wal_level=logical: the change log it writes, replayed into a copy of the starting database,
gives the primary's tables (pgoutput protocol 1, 2 and 3, text and binary, and
pglogical_output); SIGKILLed 20 times while the workload runs, it still holds every committed
transaction exactly once, in commit order, and nothing of an aborted one. The workload
(support.logical.run_workload): pgbench, a transaction streamed past logical_decoding_work_mem
(64kB) with a savepoint rolled back inside it, one aborted, two-phase transactions committed
and rolled back, TRUNCATE, a TOASTed column left unchanged by an UPDATE, logical messages."""

from __future__ import annotations

import random
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.changelog import Message, log_files, read_log, runs
from support.logical import (
    BIG,
    LOGICAL_CONF,
    TABLES,
    current_lsn,
    prepare_database,
    replication_dsn,
    run_workload,
    wait_until_released,
)
from support.replay import compare_tables, replay
from support.servers import PG_BIN, PgServer, free_port, pg_bin, running_server
from support.streams import receivewal, start_receivewal

from receivewal.daemon.state import read_state
from receivewal.replication.commands import start_logical_replication_command
from receivewal.replication.connection import ReplicationConnection
from receivewal.replication.copystream import CopyStream
from receivewal.replication.link import WalRun
from receivewal.replication.messages import PrimaryKeepalive
from receivewal.wal.lsn import format_lsn, parse_lsn

pytestmark = [pytest.mark.server, pytest.mark.slow]
CAPTURES = [(1, False), (1, True), (2, False), (2, True), (3, False), (3, True)]
PGL_TABLES = ["items", "docs", "scratch", "typed", "pgbench_accounts", "pgbench_branches",
              "pgbench_tellers"]
KILLS = 20


@dataclass
class Primary:
    pg: PgServer
    end: int  # the WAL position after the workload of database app

    def dsn(self, dbname: str) -> str:
        return f"host=127.0.0.1 port={self.pg.port} user=postgres dbname={dbname}"

    def logical(self, dbname: str, *args: str, env: dict[str, str] | None = None,
                ) -> subprocess.CompletedProcess[str]:
        """``receivewal logical`` on ``dbname`` run to completion."""
        done = receivewal("logical", "-d", self.dsn(dbname), "--log-format", "json",
                          "--reconnect-delay", "0.05", "--reconnect-delay-max", "0.5", *args,
                          env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return done


def slot_name(version: int, binary: bool) -> str:
    return f"v{version}_{'binary' if binary else 'text'}"


def pglogical_installed() -> bool:
    return PG_BIN is not None and (PG_BIN.parent / "lib" / "pglogical_output.so").exists()


@pytest.fixture(scope="module")
def primary() -> Iterator[Primary]:
    """One server (pglogical loaded): database app with a publication and the pgoutput
    slots, created by the command, before the workload; start, app's state before it;
    pgl, a pglogical provider with its slot, and pgl_start; kdb and kstart for the kill
    test."""
    if not pglogical_installed():
        pytest.fail("pglogical_output is required: apt-get install postgresql-15-pglogical")
    with running_server({**LOGICAL_CONF, "shared_preload_libraries": "'pglogical'"}) as pg:
        primary = Primary(pg, 0)
        prepare_database(pg, "app")
        for dbname in ("start", "pgl", "pgl_start", "kdb", "kstart"):  # the same rows
            pg.sql(f"CREATE DATABASE {dbname} TEMPLATE app")
        pg.sql("CREATE PUBLICATION pub FOR ALL TABLES", "app")
        pg.sql("CREATE PUBLICATION pub FOR ALL TABLES", "kdb")
        for version, binary in CAPTURES:
            primary.logical("app", "-S", slot_name(version, binary), "--create-slot",
                            *(["--two-phase"] if version >= 3 else []))
        for slot in ("compiled", "pure", "runs_c", "runs_py"):
            primary.logical("app", "-S", slot, "--create-slot", "--two-phase")
        _provider(primary)
        run_workload(pg, "app")
        run_workload_pglogical(pg)
        primary.end = current_lsn(pg, "app")
        yield primary


def _provider(primary: Primary) -> None:
    pg = primary.pg
    pg.sql("CREATE EXTENSION pglogical", "pgl")
    pg.sql("SELECT pglogical.create_node(node_name := 'provider', dsn := "
           f"'{primary.dsn('pgl')}')", "pgl")
    for table in PGL_TABLES:
        pg.sql(f"SELECT pglogical.replication_set_add_table('default', '{table}')", "pgl")
    pg.sql("SELECT pglogical.replication_set_add_table('default_insert_only', "
           "'pgbench_history')", "pgl")
    primary.logical("pgl", "-S", "pgl", "--plugin", "pglogical_output", "--create-slot")


def run_workload_pglogical(pg: PgServer) -> None:
    """What pglogical's protocol carries of the workload (no messages, no TRUNCATE, no
    table without a key for updates)."""
    run_workload(pg, "pgl", messages=False, truncate=False, full_identity=False, origin=False)


def pgoutput_args(version: int, binary: bool) -> list[str]:
    args = ["--proto-version", str(version), "--messages"]
    if version >= 3:
        args.append("--two-phase")
    return [*args, "--binary"] if binary else args


@pytest.mark.parametrize(("version", "binary"), CAPTURES,
                         ids=[slot_name(v, b) for v, b in CAPTURES])
def test_the_commands_change_log_replays_into_the_primarys_tables(
        primary: Primary, tmp_path: Path, version: int, binary: bool) -> None:
    """``receivewal logical -E END`` on a slot created before the workload, then its change
    log replayed into a copy of the starting database: every table equals the primary's;
    the files rotated (each read alone), zstd at rest for the binary runs; the slot confirmed
    to the last commit; status says the run stopped at --endpos with what it flushed."""
    name = slot_name(version, binary)
    out = tmp_path / "log"
    out.mkdir()
    at_rest = ["-Z", "zstd"] if binary else []
    primary.logical("app", "-D", str(out), "-S", name, "-P", "pub", "-E",
                    format_lsn(primary.end), "--file-size", "256kB", "-s", "0.5",
                    *at_rest, *pgoutput_args(version, binary))
    records = read_log(out)
    files = log_files(out)
    assert len(files) > 1
    assert all(path.name.endswith(".jsonl.zst") for path in files[:-1]) == binary
    target = f"replay_{name}"
    primary.pg.sql(f"CREATE DATABASE {target} TEMPLATE start")
    messages = replay(records, primary.dsn(target))
    assert compare_tables(primary.dsn("app"), primary.dsn(target), TABLES) == {}
    assert [(m["transactional"], m["prefix"]) for m in messages] == [
        (False, "app"), (True, "app")]
    assert [r["unchanged_toast"] for r in records
            if r["op"] == "update" and r["table"] == "docs"] == [["body"]]
    prepared = {r["op"] for r in records if "gid" in r}
    assert prepared == ({"begin_prepare", "prepare", "commit_prepared", "rollback_prepared"}
                        if version >= 3
                        else set())
    last_end = max(parse_lsn(r["end_lsn"]) for r in records if r["op"] == "commit")
    confirmed = parse_lsn(primary.pg.sql(
        f"SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{name}'"))
    assert confirmed >= last_end
    state = read_state(out)
    assert state is not None
    assert state.phase == "stopped"
    assert state.flushed_lsn is not None
    assert state.flushed_lsn >= last_end


def test_the_pure_python_path_writes_the_same_change_log(primary: Primary,
                                                         tmp_path: Path) -> None:
    """The compiled receive loop joins messages that follow on in the WAL into runs; the pure
    Python path hands them one by one: both write the same lines, each message at its own
    walStart."""
    logs = []
    for slot, pure in (("compiled", False), ("pure", True)):
        out = tmp_path / slot
        out.mkdir()
        primary.logical("app", "-D", str(out), "-S", slot, "-P", "pub", "-E",
                        format_lsn(primary.end), *pgoutput_args(3, False),
                        env={"RECEIVEWAL_PURE_PYTHON": "1"} if pure else None)
        logs.append([r for r in read_log(out) if r["op"] != "header"])
    assert logs[0] == logs[1]
    assert len(logs[0]) > 1000


def read_messages(primary: Primary, slot: str, *, native: bool,
                  ) -> tuple[list[Message], int, dict[int, int]]:
    """Every message the slot sends up to the workload's end, as the logical session reads
    them (runs whatever their walStarts), through the compiled loop or Python's; the most
    messages one run held; and each run's walEnd by the number of its last message."""
    conn = ReplicationConnection.open(replication_dsn(primary.pg, "app"))
    if not native:
        conn.native = None  # the pure Python path, for this connection
    got: list[Message] = []
    longest = 0
    ends: dict[int, int] = {}
    try:
        assert (conn.native is not None) == native
        conn.start_copy_both(start_logical_replication_command(
            slot, 0, [("proto_version", "1"), ("publication_names", '"pub"')]))
        stream = CopyStream(conn, (), scattered=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stream.send_status(0, 0, reply_requested=True, feedback=False)
            message = stream.read(0.2)
            if isinstance(message, WalRun):
                starts = message.starts if message.starts is not None else [message.wal_start]
                assert len(starts) == len(message.payload)
                got += [(lsn, bytes(payload)) for lsn, payload in zip(starts, message.payload,
                                                                      strict=True)]
                longest = max(longest, len(starts))
                ends[len(got) - 1] = message.wal_end
            elif isinstance(message, PrimaryKeepalive) and message.wal_end >= primary.end:
                return got, longest, ends
        raise TimeoutError(f"slot {slot} did not reach the end")
    finally:
        conn.close()
        wait_until_released(primary.pg, "app", slot)


def test_the_compiled_loop_hands_a_logical_stream_over_in_runs(primary: Primary) -> None:
    """Asked for scattered runs, the compiled receive loop hands a logical stream's messages
    over many at a time, each with its own walStart: the same messages at the same LSNs as
    Python's path, one by one, and each run's walEnd its last message's."""
    compiled, longest, compiled_ends = read_messages(primary, "runs_c", native=True)
    pure, single, pure_ends = read_messages(primary, "runs_py", native=False)
    assert compiled == pure
    assert compiled_ends == {number: pure_ends[number] for number in compiled_ends}
    assert len(compiled) > 1000
    assert single == 1
    assert longest > 1


def test_pglogical_output_replays_into_the_primarys_tables(primary: Primary,
                                                          tmp_path: Path) -> None:
    """``receivewal logical`` with plugin pglogical_output from the real plugin, every
    option from the environment as a systemd unit's env file gives them: the change log
    replayed into a copy of the starting database gives the provider's tables."""
    out = tmp_path / "log"
    out.mkdir()
    end = current_lsn(primary.pg, "pgl")
    primary.logical("pgl", env={
        "RECEIVEWAL_DIRECTORY": str(out), "RECEIVEWAL_SLOT": "pgl",
        "RECEIVEWAL_PLUGIN": "pglogical_output",
        "RECEIVEWAL_PUBLICATION": "default,default_insert_only",
        "RECEIVEWAL_ENDPOS": format_lsn(end)})
    records = read_log(out)
    assert records[0] == {"op": "header", "format": 1, "plugin": "pglogical_output",
                          "slot": "pgl"}
    primary.pg.sql("CREATE DATABASE replay_pgl TEMPLATE pgl_start")
    replay(records, primary.dsn("replay_pgl"))
    assert compare_tables(primary.dsn("pgl"), primary.dsn("replay_pgl"),
                          [*PGL_TABLES, "pgbench_history"]) == {}


def kill_workload(pg: PgServer, seconds: float) -> None:
    """pgbench for ``seconds`` (rate-limited) beside rounds of what breaks a naive receiver:
    a transaction streamed past logical_decoding_work_mem with a savepoint rolled back in it,
    one aborted, two-phase commit and rollback, TRUNCATE, a TOAST value left unchanged, a
    message."""
    bench = subprocess.Popen([pg_bin("pgbench"), "-h", "127.0.0.1", "-p", str(pg.port),
                              "-U", "postgres", "-n", "-c", "2", "-j", "2", "-R", "100", "-T",
                              str(int(seconds)), "kdb"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    round_ = 0
    while bench.poll() is None:
        base = 100_000 * (round_ + 1)
        pg.sql(f"BEGIN; INSERT INTO items SELECT g, 'kept', 1 FROM generate_series({base},"
               f" {base + BIG}) g; SAVEPOINT s; INSERT INTO items SELECT g, 'rolled back', 0"
               f" FROM generate_series({base + BIG + 1}, {base + 2 * BIG}) g;"
               " ROLLBACK TO SAVEPOINT s; UPDATE items SET qty = 2 WHERE id = "
               f"{base}; COMMIT", "kdb")
        pg.sql(f"BEGIN; INSERT INTO items SELECT g, 'aborted', 0 FROM generate_series("
               f"{base + 50_000}, {base + 50_000 + BIG}) g; ROLLBACK", "kdb")
        pg.sql(f"BEGIN; INSERT INTO items VALUES ({base + 90_000}, '2pc', 1);"
               f" PREPARE TRANSACTION 'c{round_}'", "kdb")
        pg.sql(f"COMMIT PREPARED 'c{round_}'", "kdb")
        pg.sql(f"BEGIN; INSERT INTO items VALUES ({base + 90_001}, '2pc aborted', 1);"
               f" PREPARE TRANSACTION 'r{round_}'", "kdb")
        pg.sql(f"ROLLBACK PREPARED 'r{round_}'", "kdb")
        pg.sql(f"INSERT INTO docs VALUES ({base}, repeat(md5('{base}'), 300), 'a');"
               f" UPDATE docs SET note = 'b' WHERE id = {base}", "kdb")
        pg.sql("INSERT INTO scratch (v) VALUES ('x'), ('y'); TRUNCATE scratch", "kdb")
        pg.sql(f"SELECT pg_logical_emit_message(true, 'round', '{round_}')", "kdb")
        round_ += 1
        time.sleep(0.2)
    assert bench.wait() == 0


def run_keys(records: list[dict[str, Any]]) -> list[tuple[str, int | None, str]]:
    """Each run as (its first op, xid, where it ends)."""
    return [(run[0]["op"], run[0].get("xid"), run[-1].get("end_lsn") or run[-1]["lsn"])
            for run in runs(records)]


def test_sigkill_twenty_times_keeps_every_commit_exactly_once(primary: Primary,
                                                             tmp_path: Path) -> None:
    """The receiver SIGKILLed 20 times at random while the workload runs (zstd at rest,
    small files: kills land while files are completed too), then run to the end: its log
    has the same runs, in the same order, as an uninterrupted receiver's of a slot made at
    the same time: each committed transaction exactly once, in commit order, and nothing of
    the aborted ones; replayed, the tables equal the primary's."""
    pg = primary.pg
    for slot in ("killed", "reference"):
        primary.logical("kdb", "-S", slot, "--create-slot", "--two-phase")
    out = tmp_path / "killed"
    out.mkdir()
    args = ["-D", str(out), "-S", "killed", "-P", "pub", "--two-phase", "--messages",
            "-Z", "zstd", "--file-size", "64kB", "-s", "0.2"]
    daemon = ["-d", primary.dsn("kdb"), "--reconnect-delay", "0.05",
              "--reconnect-delay-max", "0.3", "--log-format", "json"]
    worker = threading.Thread(target=kill_workload, args=(pg, 10))
    worker.start()
    rng = random.Random(27)  # noqa: S311 - reproducible kill times, not cryptography
    kills = 0
    try:
        while kills < KILLS:
            proc = start_receivewal("logical", *args, *daemon,
                                    stderr_path=tmp_path / "stderr")
            time.sleep(rng.uniform(0.2, 1.1))
            assert proc.poll() is None, (tmp_path / "stderr").read_text()[-2000:]
            proc.kill()
            proc.wait()
            kills += 1
    finally:
        worker.join()
    end = current_lsn(pg, "kdb")
    primary.logical("kdb", *args, "-E", format_lsn(end))
    reference = tmp_path / "reference"
    reference.mkdir()
    primary.logical("kdb", "-D", str(reference), "-S", "reference", "-P", "pub",
                    "--two-phase", "--messages", "-E", format_lsn(end))
    killed = read_log(out)
    expected = run_keys(read_log(reference))
    assert run_keys(killed) == expected
    assert len(expected) > 200  # a workload of substance (438 at load 10, ~1,000 quiet)
    assert not [r for r in killed if r["op"] == "insert"
                and r["new"].get("name") in ("aborted", "rolled back")]
    pg.sql("CREATE DATABASE replay_killed TEMPLATE kstart")
    replay(killed, primary.dsn("replay_killed"))
    assert compare_tables(primary.dsn("kdb"), primary.dsn("replay_killed"), TABLES) == {}


def test_a_slot_dropped_under_the_receiver_ends_it_with_a_clear_error(
        primary: Primary, tmp_path: Path) -> None:
    """--create-slot, again with --if-not-exists (exit 0, the slot existed); the receiver
    streams (``receivewal status`` says OK, the metrics endpoint serves its numbers); its
    walsender terminated and the slot dropped meanwhile (--drop-slot is run by
    tests/test_logical_trust.py): the receiver reconnects, finds no slot, and exits 1 saying
    so (not retrying forever)."""
    pg = primary.pg
    primary.logical("kdb", "-S", "dropme", "--create-slot")
    again = primary.logical("kdb", "-S", "dropme", "--create-slot", "--if-not-exists")
    assert '"event": "replication_slot_exists"' in again.stderr
    out = tmp_path / "log"
    out.mkdir()
    port = free_port()
    proc = start_receivewal("logical", "-D", str(out), "-S", "dropme", "-P", "pub", "-d",
                            primary.dsn("kdb"), "--reconnect-delay", "2", "--log-format",
                            "json", "--metrics-address", f"127.0.0.1:{port}",
                            stderr_path=tmp_path / "stderr")
    try:
        deadline = time.monotonic() + 30
        while (state := read_state(out)) is None or state.phase != "streaming":
            assert time.monotonic() < deadline, (tmp_path / "stderr").read_text()
            time.sleep(0.05)
        status = receivewal("status", "-D", str(out))
        assert status.returncode == 0, status.stdout
        assert status.stdout.startswith("RECEIVEWAL OK - streaming timeline 1")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
            metrics = page.read().decode()
        assert "receivewal_streaming 1.0" in metrics
        assert 'receivewal_slot_active{slot="dropme"} 1.0' in metrics
        # its walsender terminated and the slot dropped in one loop on the server: the
        # receiver reconnecting meanwhile (a loaded machine) only makes the loop go round
        pg.sql("DO $$ BEGIN LOOP BEGIN PERFORM pg_terminate_backend(active_pid) FROM"
               " pg_replication_slots WHERE slot_name = 'dropme' AND active_pid IS NOT NULL;"
               " PERFORM pg_drop_replication_slot('dropme'); EXIT; EXCEPTION WHEN"
               " object_in_use THEN PERFORM pg_sleep(0.01); END; END LOOP; END $$")
        assert proc.wait(timeout=60) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = (tmp_path / "stderr").read_text()
    assert 'replication slot \\"dropme\\" does not exist' in log
