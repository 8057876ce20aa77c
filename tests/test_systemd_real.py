"""receivewal@.service under a real systemd (PID 1 of private namespaces, tests/support/systemd).

The package from scripts/build-deb is installed inside with dpkg -i, so the unit is the one in
systemd/ as the package ships it. One drop-in shortens WatchdogSec and RestartSec, so that the
watchdog and restart checks take seconds instead of minutes; everything else is the unit's.
PostgreSQL runs inside too (a transient unit on the namespace's own loopback).

The tests share one booted system and run in order: start (server down first), streaming,
restore as postgres, stop, kill -9, watchdog; then a logical instance of the same template,
and one whose stream the server refuses for good (exit 4: not restarted).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.failnotes import on_failure
from support.servers import PG_BIN, PgServer, make_shared_dir, pg_bin
from support.streams import wait_for
from support.systemd import NamespacedSystemd, namespaced_systemd, unavailable

from receivewal.wal.lsn import parse_lsn

UNIT = "receivewal@db1.service"
#: How long a condition may take to come about inside the namespace (a bound, not a wait: on
#: a machine at load 8-10 one took more than the former 60 s). The system itself lives for
#: SYSTEM_LIMIT seconds at most, the module's tests all in one.
PATIENCE = 240
SYSTEM_LIMIT = 1800
settle = functools.partial(wait_for, timeout=PATIENCE)
ARCHIVE = "/var/lib/receivewal/db1"
WATCHDOG_SECONDS = 5
SEGMENT = 16 * 1024 * 1024

pytestmark = [
    pytest.mark.systemd,
    pytest.mark.server,
    pytest.mark.slow,
    pytest.mark.skipif(unavailable() is not None, reason=str(unavailable())),
]


@dataclass
class Rig:
    """The booted system, the server's data directory (initdb'd on the host) and its port."""

    system: NamespacedSystemd
    server: PgServer

    def sql(self, query: str) -> str:
        return self.system.run(
            pg_bin("psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p",
            str(self.server.port), "-U", "postgres", "-d", "postgres", "-c", query,
        ).stdout.strip()

    def start_server(self) -> None:
        self.system.run("systemd-run", "--unit=pg", "-p", "User=postgres", "-p", "Group=postgres",
                        pg_bin("postgres"), "-D", str(self.server.datadir))

        def accepting() -> bool:
            return self.system.run(pg_bin("pg_isready"), "-q", "-h", "127.0.0.1", "-p",
                                   str(self.server.port), check=False).returncode == 0
        settle(accepting, what="the server inside to accept connections")

    def show(self, *properties: str) -> dict[str, str]:
        return self.system.show(UNIT, *properties)

    def inside(self, path: str) -> Path:
        """A path of the namespace's root, seen from the host."""
        return Path(f"/proc/{self.system.pid1}/root{path}")

    def flushed_in_status(self) -> int:
        status = self.show("StatusText")["StatusText"]
        assert status.startswith("Streaming timeline 1, flushed 0/"), status
        return parse_lsn(status.rsplit(" ", 1)[1])

    def state_flushed(self) -> int | None:
        state = json.loads(self.inside(f"{ARCHIVE}/.receivewal-state.json").read_text())
        value = state.get("flushed_lsn")
        return None if value is None else parse_lsn(value)


@pytest.fixture(scope="module")
def rig(deb: Path) -> Iterator[Rig]:
    if PG_BIN is None:
        pytest.fail("PostgreSQL server binaries are required (install postgresql or set PG_BIN)")
    base = make_shared_dir("receivewal-pg-")
    server = PgServer(base, "primary")
    server.init({"wal_level": "logical"})  # for the logical instance too
    with namespaced_systemd(limit=SYSTEM_LIMIT) as system:
        system.run("dpkg", "-i", str(deb), timeout=300)
        system.write("/etc/receivewal/db1.env", "\n".join([
            "PGHOST=127.0.0.1", f"PGPORT={server.port}", "PGUSER=postgres",
            "RECEIVEWAL_SLOT=receivewal_db1", "RECEIVEWAL_CREATE_SLOT_IF_MISSING=true",
            "RECEIVEWAL_STATUS_INTERVAL=1", "RECEIVEWAL_RECONNECT_DELAY=0.5",
            "RECEIVEWAL_RECONNECT_DELAY_MAX=1", "",
        ]))
        system.write("/etc/receivewal/db1.pgpass", "")
        system.write(f"/etc/systemd/system/{UNIT}.d/test.conf",
                     f"[Service]\nWatchdogSec={WATCHDOG_SECONDS}s\nRestartSec=1s\n")
        system.run("systemctl", "daemon-reload")
        yield Rig(system, server)


@pytest.fixture(autouse=True)
def journal_on_failure(rig: Rig, request: pytest.FixtureRequest) -> None:
    """A failed test's report ends with the journal of the receivewal units and the server."""
    def journal() -> str:
        return rig.system.run("journalctl", "--no-pager", "-o", "short-monotonic", "-n", "300",
                              "-u", "receivewal@*", "-u", "pg.service", check=False).stdout
    on_failure(request.node, "journal of receivewal@* and pg.service", journal)


def test_start_waits_for_the_server_and_for_ready(rig: Rig) -> None:
    """With the server down, the unit does not fail or loop on restarts: it stays
    "activating" with STATUS "Waiting for server: <reason>", `systemctl start` blocks until
    READY=1, which comes once the server is up and streaming has started."""
    rig.system.run("systemctl", "start", "--no-block", UNIT)
    settle(lambda: rig.show("StatusText")["StatusText"].startswith("Waiting for server:"),
           what="the waiting STATUS")
    shown = rig.show("StatusText", "ActiveState", "NRestarts")
    assert "Connection refused" in shown["StatusText"]
    assert (shown["ActiveState"], shown["NRestarts"]) == ("activating", "0")
    rig.start_server()
    rig.system.run("systemctl", "start", UNIT, timeout=PATIENCE)  # returns once READY=1 came
    shown = rig.show("ActiveState", "SubState", "NRestarts", "StatusText")
    assert (shown["ActiveState"], shown["SubState"], shown["NRestarts"]) == \
        ("active", "running", "0")
    assert shown["StatusText"].startswith("Streaming timeline 1"), shown["StatusText"]


def test_streams_under_the_hardening_and_logs_json(rig: Rig) -> None:
    """STATUS follows the flushed LSN; the journal has the daemon's lines as JSON and no sign
    of the sandbox refusing a system call (SIGSYS, EPERM); systemd-analyze security rates the
    loaded unit 1.2 or better."""
    rig.sql("CREATE TABLE t (id int, pad text)")
    rig.sql("INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g")
    end = parse_lsn(rig.sql("SELECT pg_current_wal_lsn()"))
    settle(lambda: rig.flushed_in_status() >= end, what="STATUS to show the flush")
    journal = rig.system.run("journalctl", "-o", "json", "--no-pager", f"_SYSTEMD_UNIT={UNIT}",
                             "+", f"UNIT={UNIT}").stdout
    entries = [json.loads(line) for line in journal.splitlines()]
    ours = [e for e in entries if e.get("SYSLOG_IDENTIFIER") == "receivewal-db1"]
    events = [json.loads(e["MESSAGE"])["event"] for e in ours]
    assert "waiting_for_server" in events
    assert "streaming_started" in events
    text = "\n".join(str(e.get("MESSAGE")) for e in entries)
    for refusal in ("SIGSYS", "status=31", "Bad system call", "Operation not permitted",
                    "Permission denied"):
        assert refusal not in text, refusal
    assert rig.show("NRestarts")["NRestarts"] == "0"
    rating = rig.system.run("systemd-analyze", "security", "--no-pager", UNIT).stdout
    exposure = rating.rsplit("Overall exposure level for ", 1)[1].split(": ", 1)[1].split()[0]
    assert float(exposure) <= 1.2, rating[-300:]  # as docs/operations.md says


def test_postgres_restores_from_the_service_archive_once_in_its_group(rig: Rig) -> None:
    """The service's archive is open to the package's receivewal group and nobody else:
    `receivewal restore` run as postgres fails until a DBA adds postgres to that group
    (usermod -aG receivewal postgres); then it gives the server's segment byte for byte."""
    name = rig.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
    rig.sql("INSERT INTO t SELECT g, 'switch' FROM generate_series(1, 100) g")
    rig.sql("SELECT pg_switch_wal()")
    settle(lambda: rig.inside(f"{ARCHIVE}/{name}").exists(), what=f"{name} to be complete")
    target = f"/tmp/restored-{name}"
    restore = ["runuser", "-u", "postgres", "--", "/usr/bin/receivewal", "restore", "-D",
               ARCHIVE, name, target]
    refused = rig.system.run(*restore, check=False)
    assert refused.returncode != 0, refused.stdout
    assert not rig.inside(target).exists()
    rig.system.run("usermod", "-aG", "receivewal", "postgres")
    rig.system.run(*restore)
    assert rig.inside(target).read_bytes() == \
        rig.inside(f"{rig.server.datadir}/pg_wal/{name}").read_bytes()


def test_stop_fsyncs_the_partial_and_exits_0(rig: Rig) -> None:
    """`systemctl stop` (SIGTERM) exits 0 with the .partial holding the server's bytes up to
    the last flush; after the next start STATUS does not show less as flushed."""
    rig.sql("INSERT INTO t SELECT g, 'after' FROM generate_series(1, 5000) g")
    end = parse_lsn(rig.sql("SELECT pg_current_wal_lsn()"))
    settle(lambda: rig.flushed_in_status() >= end, what="the insert to be flushed")
    before = rig.flushed_in_status()
    rig.system.run("systemctl", "stop", UNIT, timeout=PATIENCE)
    shown = rig.show("ActiveState", "Result", "ExecMainStatus")
    assert shown == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0"}
    name = rig.sql(f"SELECT pg_walfile_name('{rig.sql('SELECT pg_current_wal_lsn()')}')")
    partial = rig.inside(f"{ARCHIVE}/{name}.partial").read_bytes()
    server_file = rig.inside(f"{rig.server.datadir}/pg_wal/{name}").read_bytes()
    assert partial[: end % SEGMENT] == server_file[: end % SEGMENT]
    rig.system.run("systemctl", "start", UNIT, timeout=PATIENCE)
    assert rig.flushed_in_status() >= before


def test_kill_9_restarts_and_flushed_does_not_go_back(rig: Rig) -> None:
    """SIGKILL of the main process: systemd restarts it (Restart=on-failure); STATUS then
    shows at least what the state file said was flushed, not the restreamed segment start."""
    rig.sql("INSERT INTO t SELECT g, 'more' FROM generate_series(1, 5000) g")
    end = parse_lsn(rig.sql("SELECT pg_current_wal_lsn()"))
    settle(lambda: (rig.state_flushed() or 0) >= end, what="the state file to have the flush")
    durable = rig.state_flushed()
    assert durable is not None
    old = rig.show("MainPID", "NRestarts")
    rig.system.run("systemctl", "kill", "--signal=SIGKILL", "--kill-whom=main", UNIT)
    settle(lambda: rig.show("NRestarts")["NRestarts"] == str(int(old["NRestarts"]) + 1)
           and rig.show("ActiveState")["ActiveState"] == "active", what="the restart")
    assert rig.show("MainPID")["MainPID"] != old["MainPID"]
    settle(lambda: rig.show("StatusText")["StatusText"].startswith("Streaming timeline 1, "),
           what="streaming again")
    assert rig.flushed_in_status() >= durable


def test_watchdog_holds_and_kills_a_stopped_process(rig: Rig) -> None:
    """Pings keep the unit alive past several watchdog periods; once the process is stopped
    (SIGSTOP) the watchdog fires and systemd restarts it."""
    def active_since() -> str:  # empty while the unit is not (yet again) active
        return rig.system.run("systemctl", "show", "--timestamp=unix",
                              "--property=ActiveEnterTimestamp", UNIT).stdout.strip()
    settle(lambda: "=@" in active_since(), what="the unit to be active")
    since = float(active_since().split("=@", 1)[1])
    restarts = rig.show("NRestarts")["NRestarts"]
    settle(lambda: time.time() - since > 2 * WATCHDOG_SECONDS, what="two watchdog periods")
    assert rig.show("NRestarts", "ActiveState") == {"NRestarts": restarts,
                                                    "ActiveState": "active"}
    main = rig.show("MainPID")["MainPID"]
    rig.system.run("kill", "-STOP", main)
    settle(lambda: rig.show("NRestarts")["NRestarts"] != restarts, what="the watchdog")
    journal = rig.system.run("journalctl", "--no-pager", "-o", "cat", f"UNIT={UNIT}").stdout
    assert "Watchdog timeout" in journal
    settle(lambda: rig.show("ActiveState")["ActiveState"] == "active", what="the restart")
    assert rig.show("MainPID")["MainPID"] != main


def test_a_logical_instance_of_the_same_template_keeps_a_change_log(rig: Rig) -> None:
    """RECEIVEWAL_COMMAND=logical in an instance's env file: the same unit streams a logical
    slot into the instance's change log, under the same hardening; `receivewal status` as the
    service's user words the state as a change log's; `systemctl stop` exits 0 with every
    committed row in the log."""
    unit, outdir = "receivewal@app.service", "/var/lib/receivewal/app"
    rig.sql("CREATE TABLE items (id int PRIMARY KEY, name text)")
    rig.sql("CREATE PUBLICATION pub FOR TABLE items")
    rig.sql("SELECT pg_create_logical_replication_slot('app_log', 'pgoutput')")
    rig.system.write("/etc/receivewal/app.env", "\n".join([
        "PGHOST=127.0.0.1", f"PGPORT={rig.server.port}", "PGUSER=postgres",
        "RECEIVEWAL_COMMAND=logical", "RECEIVEWAL_SLOT=app_log", "RECEIVEWAL_PUBLICATION=pub",
        "RECEIVEWAL_STATUS_INTERVAL=1", "",
    ]))
    rig.system.write("/etc/receivewal/app.pgpass", "")
    rig.system.run("systemctl", "start", unit, timeout=PATIENCE)  # returns once READY=1 came
    rig.sql("INSERT INTO items SELECT g, 'row ' || g FROM generate_series(1, 1000) g")
    end = parse_lsn(rig.sql("SELECT pg_current_wal_lsn()"))
    state_file = rig.inside(f"{outdir}/.receivewal-state.json")

    def flushed() -> int:
        value = json.loads(state_file.read_text()).get("flushed_lsn")
        return 0 if value is None else parse_lsn(value)
    settle(lambda: flushed() >= end, what="the change log to be confirmed past the insert")
    status = rig.system.run("runuser", "-u", "receivewal", "--", "/usr/bin/receivewal",
                            "status", "-D", outdir).stdout
    lines = status.splitlines()
    assert lines[0].startswith("RECEIVEWAL OK - streaming timeline 1"), status
    assert any(line.startswith("change log:") for line in lines), status
    assert not [line for line in lines if "segment" in line or "backup" in line], status
    assert json.loads(state_file.read_text())["receiver"] == "logical"
    rig.system.run("systemctl", "stop", unit, timeout=PATIENCE)
    assert rig.system.show(unit, "Result", "ExecMainStatus", "NRestarts") == {
        "Result": "success", "ExecMainStatus": "0", "NRestarts": "0"}
    records = [json.loads(line) for path in sorted(rig.inside(outdir).glob("*.jsonl*"))
               for line in path.read_text().splitlines()]
    assert sorted(int(r["new"]["id"]) for r in records if r["op"] == "insert") == \
        list(range(1, 1001))
    journal = rig.system.run("journalctl", "--no-pager", "-o", "cat", f"_SYSTEMD_UNIT={unit}",
                             "+", f"UNIT={unit}").stdout
    assert '"event": "streaming_started"' in journal
    for refusal in ("SIGSYS", "status=31", "Bad system call", "Operation not permitted",
                    "Permission denied"):
        assert refusal not in journal, refusal


def test_a_logical_instance_the_server_refuses_for_good_stays_down(rig: Rig) -> None:
    """The publication of a logical instance's slot dropped and created again, then a row:
    the server refuses the slot's stream at every start, so the instance exits 4 and the
    unit's RestartPreventExitStatus keeps it down (failed, no restart: it used to reconnect
    for ever, active and OK); the journal has the server's words, status says CRITICAL."""
    unit, outdir = "receivewal@stuck.service", "/var/lib/receivewal/stuck"
    if rig.system.run(pg_bin("pg_isready"), "-q", "-h", "127.0.0.1", "-p",
                      str(rig.server.port), check=False).returncode != 0:
        rig.start_server()  # run alone (-k): the first test started it otherwise
    rig.sql("CREATE TABLE IF NOT EXISTS stuck_items (id int PRIMARY KEY)")
    rig.sql("CREATE PUBLICATION stuck_pub FOR TABLE stuck_items")
    rig.sql("SELECT pg_create_logical_replication_slot('stuck_log', 'pgoutput')")
    rig.sql("DROP PUBLICATION stuck_pub")
    rig.sql("INSERT INTO stuck_items VALUES (1)")
    rig.sql("CREATE PUBLICATION stuck_pub FOR TABLE stuck_items")
    rig.system.write("/etc/receivewal/stuck.env", "\n".join([
        "PGHOST=127.0.0.1", f"PGPORT={rig.server.port}", "PGUSER=postgres",
        "RECEIVEWAL_COMMAND=logical", "RECEIVEWAL_SLOT=stuck_log",
        "RECEIVEWAL_PUBLICATION=stuck_pub", "RECEIVEWAL_STATUS_INTERVAL=1", "",
    ]))
    rig.system.write("/etc/receivewal/stuck.pgpass", "")
    rig.system.write(f"/etc/systemd/system/{unit}.d/test.conf", "[Service]\nRestartSec=1s\n")
    rig.system.run("systemctl", "daemon-reload")
    rig.system.run("systemctl", "start", "--no-block", unit)
    settle(lambda: rig.system.show(unit, "ActiveState")["ActiveState"] == "failed",
           what="the instance to fail and stay down")
    assert rig.system.show(unit, "ExecMainStatus", "NRestarts") == {
        "ExecMainStatus": "4", "NRestarts": "0"}
    journal = rig.system.run("journalctl", "--no-pager", "-o", "cat", f"_SYSTEMD_UNIT={unit}",
                             "+", f"UNIT={unit}").stdout
    assert 'publication \\"stuck_pub\\" does not exist' in journal, journal[-3000:]
    assert "server shut down?" not in journal
    status = rig.system.run("runuser", "-u", "receivewal", "--", "/usr/bin/receivewal",
                            "status", "-D", outdir, check=False)
    assert status.returncode == 2, status.stdout
    assert status.stdout.startswith("RECEIVEWAL CRITICAL - not running"), status.stdout
    assert 'publication "stuck_pub" does not exist' in status.stdout, status.stdout
    rig.sql("SELECT pg_drop_replication_slot('stuck_log')")
