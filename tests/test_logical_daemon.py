"""The logical receiver run by the daemon's supervisor on a scripted connection: bad input in
the stream (a truncated message, an unknown type, a relation never announced, a tuple with
fewer columns than its relation) ends the daemon with exit 1 and an error naming the LSN,
without retrying, and the change log holds exactly the transactions committed before it,
durable; a slot that is missing, invalidated or of another plugin is an error at once."""

from __future__ import annotations

import errno
import os
import signal
import struct
from dataclasses import replace
from pathlib import Path

import pytest
from support import logical_wire as w
from support.changelog import read_log, runs
from support.scripted import ScriptedConnection, status_updates
from support.stopflag import Stop

from receivewal.daemon.events import Event, Flushed
from receivewal.daemon.lifecycle import Failed
from receivewal.daemon.settings import Settings
from receivewal.daemon.supervisor import Supervisor
from receivewal.logicalreceiver.logicalsettings import LogicalSettings
from receivewal.logicalreceiver.receiver import LogicalReceiver
from receivewal.replication.link import CopyData, CopyDone, WalRun
from receivewal.replication.messages import build_xlogdata
from receivewal.wal.lsn import format_lsn

T0 = 849_000_000_000_000
ITEMS = w.relation(16384, "public", "items", [(True, "id", 23, -1), (False, "name", 25, -1)])
SYSTEM = ("7400000000000000001", "1", "0/3000000", "app")


class Server(ScriptedConnection):
    """A scripted logical walsender: IDENTIFY_SYSTEM on database app, the slot as given."""

    def __init__(self, script: list[bytes | WalRun], stop: Stop,
                 slot: tuple[str | None, ...] | None = (
                     "logical", "pgoutput", "app", "reserved", "0/0"),
                 ) -> None:
        super().__init__(script, stop)
        self.slot = slot
        self.commands: list[str] = []
        self.scattered = False  # whether runs whatever their walStarts were asked for

    def query(self, sql: str) -> list[tuple[str | None, ...]]:
        self.commands.append(sql)
        if sql == "IDENTIFY_SYSTEM":
            return [SYSTEM]
        if "pg_replication_slots" in sql:
            return [] if self.slot is None else [self.slot]
        raise AssertionError(f"unexpected command {sql}")

    def read_batch(self, timeout: float, until: int | None = None, scattered: bool = False,
                   ) -> WalRun | CopyData | CopyDone | None:
        """The script, then SIGTERM (the supervisor's handler stops the daemon)."""
        self.scattered = self.scattered or scattered
        if not self.script and not self.ended:
            os.kill(os.getpid(), signal.SIGTERM)
            return None
        return super().read_batch(timeout, until, scattered)

    def close(self) -> None:
        pass


class ScriptedSupervisor(Supervisor):
    """The supervisor, its connection the scripted server's; every connection counted."""

    def __init__(self, settings: LogicalSettings, conn: Server) -> None:
        super().__init__(settings.base, LogicalReceiver(settings), prompt=None,
                         listeners=(self._seen,), log_events=False)
        self.conn = conn
        self.connections = 0
        self.seen: list[Event] = []

    def _seen(self, event: Event) -> None:
        self.seen.append(event)

    def connect(self) -> Server:  # type: ignore[override]
        self.connections += 1
        return self.conn


def settings(directory: Path) -> LogicalSettings:
    base = Settings(directory=directory, conninfo="", slot="logical", status_interval=0,
                    hot_standby_feedback=False, reconnect_delay=0, reconnect_delay_max=0)
    return LogicalSettings(base, publications=("pub",), proto_version=1).validate()


def transaction(start: int, xid: int, value: str) -> list[bytes | WalRun]:
    """One committed transaction of one insert, its messages at start, +0x10, +0x20."""
    return [build_xlogdata(start, start, 0, w.begin(start + 0x20, T0, xid)),
            build_xlogdata(start + 0x10, start + 0x10, 0,
                           w.insert(16384, [("t", str(xid).encode()), ("t", value.encode())])),
            build_xlogdata(start + 0x20, start + 0x20, 0,
                           w.commit(start + 0x20, start + 0x30, T0))]


def damaged(insert: bytes, damage: str) -> bytes:
    return {"truncated": insert[:-3], "unknown type": b"\x01" + insert[1:],
            "unannounced relation": insert[:1] + b"\x00\x0f\x42\x3f" + insert[5:],
            "fewer columns": insert[:6] + (1).to_bytes(2, "big")
            + insert[8:8 + 1 + 4 + int.from_bytes(insert[9:13], "big")]}[damage]


@pytest.mark.parametrize("damage", ["truncated", "unknown type", "unannounced relation",
                                    "fewer columns"])
def test_bad_input_ends_the_daemon_naming_the_lsn(tmp_path: Path, damage: str) -> None:
    """Two good transactions, then one whose Insert is damaged, then a good one: the daemon
    exits 1 after one connection (no retry: the slot would send the same bytes again), the
    error names the damaged message's LSN, the log holds the first two transactions and
    nothing after, and the flush position reported stops at the second one's end."""
    stop = Stop()
    bad_insert = damaged(w.insert(16384, [("t", b"3"), ("t", b"three")]), damage)
    script: list[bytes | WalRun] = [
        build_xlogdata(0x1000, 0x1000, 0, ITEMS),
        *transaction(0x1100, 701, "one"),
        *transaction(0x1200, 702, "two"),
        build_xlogdata(0x1300, 0x1300, 0, w.begin(0x1320, T0, 703)),
        build_xlogdata(0x1310, 0x1310, 0, bad_insert),
        build_xlogdata(0x1320, 0x1320, 0, w.commit(0x1320, 0x1330, T0)),
        *transaction(0x1400, 704, "four"),
    ]
    conn = Server(script, stop)
    supervisor = ScriptedSupervisor(settings(tmp_path), conn)
    assert supervisor.run() == 1
    assert supervisor.connections == 1
    failed = [event for event in supervisor.seen if isinstance(event, Failed)]
    assert len(failed) == 1
    assert f"at {format_lsn(0x1310)}" in failed[0].error
    assert conn.started == "START_REPLICATION SLOT \"logical\" LOGICAL 0/0 " \
        "(\"proto_version\" '1', \"publication_names\" '\"pub\"')"
    logged = runs(read_log(tmp_path))
    assert [[(r["op"], r.get("xid")) for r in run] for run in logged] == [
        [("begin", 701), ("insert", 701), ("commit", 701)],
        [("begin", 702), ("insert", 702), ("commit", 702)]]
    flushed = [event.lsn for event in supervisor.seen if isinstance(event, Flushed)]
    assert flushed[-1] == 0x1230
    assert all(flush <= 0x1230 for _, flush, _ in status_updates(conn))


def test_a_run_of_messages_keeps_each_messages_lsn(tmp_path: Path) -> None:
    """The compiled receive loop hands messages that follow on in the WAL as one run: each
    reaches the change log with its own walStart (the one before's plus its length), and
    a message after a jump in walStart with its own."""
    stop = Stop()
    begin = w.begin(0x1F00, T0, 801)
    insert = w.insert(16384, [("t", b"1"), ("t", b"one")])
    script: list[bytes | WalRun] = [
        build_xlogdata(0x1000, 0x1000, 0, ITEMS),
        WalRun(0x1100, 0x1100, [memoryview(begin), memoryview(insert)], wire=0),
        build_xlogdata(0x1F00, 0x1F00, 0, w.commit(0x1F00, 0x2000, T0)),
    ]
    conn = Server(script, stop)
    assert ScriptedSupervisor(settings(tmp_path), conn).run() == 0  # the script's end stops it
    lines = runs(read_log(tmp_path))[0]
    assert [r["lsn"] for r in lines] == [format_lsn(0x1100), format_lsn(0x1100 + len(begin)),
                                         format_lsn(0x1F00)]
    assert status_updates(conn)[-1][1] == 0x2000
    assert conn.scattered  # the logical session asks for runs whatever their walStarts


def test_a_scattered_run_keeps_each_messages_own_lsn(tmp_path: Path) -> None:
    """The compiled receive loop asked for a logical stream's runs hands messages whatever
    their walStarts, each listed: every one reaches the change log with its own, among them
    one at 0/0 (the server sends a Relation so) and ones that go back."""
    stop = Stop()
    begin = w.begin(0x1F00, T0, 801)
    insert = w.insert(16384, [("t", b"1"), ("t", b"one")])
    commit = w.commit(0x1F00, 0x2000, T0)
    script: list[bytes | WalRun] = [
        WalRun(0, 0x1800, [memoryview(ITEMS), memoryview(begin), memoryview(insert),
                           memoryview(commit)], wire=0, starts=[0, 0x1100, 0x1E00, 0x1F00]),
    ]
    conn = Server(script, stop)
    assert ScriptedSupervisor(settings(tmp_path), conn).run() == 0
    records = read_log(tmp_path)
    assert [(r["op"], r["lsn"]) for r in records if r["op"] != "header"] == [
        ("relation", "0/0"), ("begin", format_lsn(0x1100)),
        ("insert", format_lsn(0x1E00)), ("commit", format_lsn(0x1F00))]
    assert status_updates(conn)[-1][1] == 0x2000


@pytest.mark.parametrize(("slot", "words"), [
    (None, 'replication slot "logical" does not exist'),
    (("logical", "pgoutput", "app", "lost", "0/0"), 'replication slot "logical" is invalidated'),
    (("physical", None, None, "reserved", "0/0"), "is a physical slot, not logical"),
    (("logical", "test_decoding", "app", "reserved", "0/0"), 'uses plugin "test_decoding"'),
    (("logical", "pgoutput", "other", "reserved", "0/0"), 'belongs to database "other"'),
])
def test_a_slot_that_cannot_stream_is_an_error_at_once(
        tmp_path: Path, slot: tuple[str | None, ...] | None, words: str) -> None:
    """A dropped, invalidated, physical or foreign slot: exit 1 on the first connection,
    nothing started, the error saying which."""
    conn = Server([], Stop(), slot)
    supervisor = ScriptedSupervisor(settings(tmp_path), conn)
    assert supervisor.run() == 1
    assert supervisor.connections == 1
    assert not hasattr(conn, "started")
    failed = [event for event in supervisor.seen if isinstance(event, Failed)]
    assert words in failed[0].error


def test_keepalives_are_answered_with_what_is_durable(tmp_path: Path) -> None:
    """A keepalive asking for a reply gets a status update at once; its flush position is the
    last durable commit while a transaction is open."""
    stop = Stop()
    script: list[bytes | WalRun] = [
        build_xlogdata(0x1000, 0x1000, 0, ITEMS),
        *transaction(0x1100, 701, "one"),
        build_xlogdata(0x1200, 0x1200, 0, w.begin(0x1300, T0, 702)),
        struct.pack(">cQqB", b"k", 0x1250, 0, 1),
    ]
    conn = Server(script, stop)
    assert ScriptedSupervisor(settings(tmp_path), conn).run() == 0
    assert status_updates(conn)[0] == (0x1250, 0x1130, 0)
    assert {message[:1] for message in conn.sent} == {b"r"}  # no hot standby feedback


def test_a_change_log_of_another_slot_is_not_resumed(tmp_path: Path) -> None:
    """OUTDIR written from slot "other": the receiver of slot "logical" exits 1 before it
    connects, naming the file and the slot it was written with (resuming would skip this
    slot's changes up to where the other one's ended)."""
    first = Server([build_xlogdata(0x1000, 0x1000, 0, ITEMS), *transaction(0x1100, 701, "one")],
                   Stop(), slot=("logical", "pgoutput", "app", "reserved", "0/0"))
    other = settings(tmp_path)
    other = LogicalSettings(replace(other.base, slot="other"), publications=("pub",),
                            proto_version=1)
    assert ScriptedSupervisor(other, first).run() == 0
    assert len(runs(read_log(tmp_path))) == 1
    conn = Server([], Stop())
    supervisor = ScriptedSupervisor(settings(tmp_path), conn)
    assert supervisor.run() == 1
    assert supervisor.connections == 0
    failed = [event for event in supervisor.seen if isinstance(event, Failed)]
    assert "holds another change log" in failed[0].error
    assert "slot 'other' (not 'logical')" in failed[0].error


def test_a_full_disk_is_retried_and_the_log_resumed(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk full once as the change log is flushed: the daemon reconnects (as stream does
    for a full disk) instead of exiting, the store is opened again (the partial file cut after
    its last complete transaction), and the transactions the server sends again are written
    once."""
    from receivewal.archive import durable  # noqa: PLC0415 - the write that fails

    real = durable.write_all
    failures = [OSError(errno.ENOSPC, "No space left on device")]

    def write_all(fd: int, data: memoryview) -> None:
        if failures:
            raise failures.pop()
        real(fd, data)

    monkeypatch.setattr(durable, "write_all", write_all)
    script: list[bytes | WalRun] = [
        build_xlogdata(0x1000, 0x1000, 0, ITEMS), *transaction(0x1100, 701, "one"),
        struct.pack(">cQqB", b"k", 0x1150, 0, 1), *transaction(0x1200, 702, "two")]
    connections: list[Server] = []

    class Reconnecting(ScriptedSupervisor):
        def connect(self) -> Server:  # type: ignore[override]
            connections.append(Server(list(script), Stop()))
            return connections[-1]

    supervisor = Reconnecting(settings(tmp_path), Server([], Stop()))
    assert supervisor.run() == 0
    assert len(connections) == 2
    assert [[(r["op"], r.get("xid")) for r in run] for run in runs(read_log(tmp_path))] == [
        [("begin", 701), ("insert", 701), ("commit", 701)],
        [("begin", 702), ("insert", 702), ("commit", 702)]]
