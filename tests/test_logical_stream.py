"""pgoutput's real output (PostgreSQL 15: protocol versions 1, 2 and 3, text and binary) into
the change log, and the change log replayed into a copy of the starting database: the same
tables as the primary's. The workload (support.logical.run_workload) has pgbench, a streamed
transaction with a subtransaction rolled back after it streamed, a streamed transaction
aborted, two-phase transactions committed and rolled back, TRUNCATE, an unchanged TOAST
column, a REPLICA IDENTITY FULL table, every common type and logical messages. Also: a log
cut at random points resumes from the slot with every transaction once; bad bytes in a real
stream stop it with the LSN and nothing written past the last good commit."""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.changelog import Message, consume, log_files, open_store, read_log, runs
from support.logical import (
    LOGICAL_CONF,
    TABLES,
    create_slot,
    current_lsn,
    prepare_database,
    run_workload,
    stream_slot,
)
from support.replay import compare_tables, replay
from support.servers import PgServer, running_server

from receivewal.errors import ProtocolError
from receivewal.logical.consumer import ChangeLogConsumer, PluginSettings
from receivewal.logical.pgoutput import PgoutputOptions
from receivewal.wal.lsn import format_lsn

pytestmark = [pytest.mark.server, pytest.mark.slow]
PUBLICATION = 'Every "table", here'  # a name only quoting gets through
CAPTURES = [(1, False), (1, True), (2, False), (2, True), (3, False), (3, True)]


@dataclass
class Primary:
    pg: PgServer
    end: int  # the WAL position after the workload

    def dsn(self, dbname: str) -> str:
        return f"host=127.0.0.1 port={self.pg.port} user=postgres dbname={dbname}"


def slot_name(version: int, binary: bool) -> str:
    return f"v{version}_{'binary' if binary else 'text'}"


def options(version: int, binary: bool) -> PgoutputOptions:
    return PgoutputOptions(version, streaming="on" if version >= 2 else "off",
                           two_phase=version >= 3, binary=binary, messages=True)


@pytest.fixture(scope="module")
def primary() -> Iterator[Primary]:
    """One server: database ``app`` with the workload done after every slot was created,
    ``start`` a copy of app's state before it (the replays' template)."""
    with running_server(LOGICAL_CONF) as pg:
        prepare_database(pg, "app")
        prepare_database(pg, "start")
        pg.sql(f'CREATE PUBLICATION "{PUBLICATION.replace(chr(34), chr(34) * 2)}" '
               "FOR ALL TABLES", "app")
        for version, binary in CAPTURES:
            name = slot_name(version, binary)
            create_slot(pg, "app", name, two_phase=version >= 3)
        create_slot(pg, "app", "resumed", two_phase=True)
        run_workload(pg, "app")
        yield Primary(pg, current_lsn(pg, "app"))


def capture(primary: Primary, slot: str, version: int, binary: bool) -> list[Message]:
    """Everything the slot sends (not confirmed: it can be read again)."""
    got: list[Message] = []
    stream_slot(primary.pg, "app", slot, list(options(version, binary).start_options(
        [PUBLICATION])), lambda lsn, payload: got.append((lsn, payload)), until=primary.end)
    return got


@pytest.fixture(scope="module")
def captures(primary: Primary) -> dict[tuple[int, bool], list[Message]]:
    return {(version, binary): capture(primary, slot_name(version, binary), version, binary)
            for version, binary in CAPTURES}


@pytest.mark.parametrize(("version", "binary"), CAPTURES,
                         ids=[slot_name(v, b) for v, b in CAPTURES])
def test_replaying_the_change_log_gives_the_primarys_tables(
        primary: Primary, captures: dict[tuple[int, bool], list[Message]], tmp_path: Path,
        version: int, binary: bool) -> None:
    """The slot's output through the consumer into the change log, the log replayed into a
    copy of the starting database: every table equals the primary's. The log holds what the
    workload did: both messages, the unchanged TOAST column listed, the old row of the FULL
    table, each run contiguous and in commit order."""
    store = open_store(tmp_path, file_size=256 << 10)
    consume(store, captures[(version, binary)], options(version, binary)).close()
    store.close()
    records = read_log(tmp_path)
    target = f"replay_{slot_name(version, binary)}"
    primary.pg.sql(f"CREATE DATABASE {target} TEMPLATE start")
    messages = replay(records, primary.dsn(target))
    assert compare_tables(primary.dsn("app"), primary.dsn(target), TABLES) == {}
    assert [(m["transactional"], m["prefix"], m["content_b64"]) for m in messages] == [
        (False, "app", "bm90IHRyYW5zYWN0aW9uYWw="), (True, "app", "dHJhbnNhY3Rpb25hbA==")]
    docs = [r for r in records if r["op"] == "update" and r["table"] == "docs"]
    assert [(r["new"], r["unchanged_toast"]) for r in docs] == [
        ({"id": "1", "note": "second"}, ["body"])]
    assert [(r["name"], r["origin_lsn"]) for r in records if r["op"] == "origin"] == [
        ("upstream", "0/ABCDEF")]
    full = [r["old"] for r in records if r["op"] in ("update", "delete")
            and r["table"] == "full_rows"]
    assert full == [{"id": "1", "val": "a"}, {"id": "2", "val": "b"}]
    typed = [r["new"] for r in records if r["op"] == "update" and r["table"] == "typed"]
    assert typed[0]["f4"] == "1.21338016e+08"
    assert typed[0]["f8"] == "1e+15"
    commits = [r["commit_lsn"] for r in records if r["op"] == "begin"]
    assert commits == sorted(commits, key=lambda text: int(text.replace("/", ""), 16))
    assert len(log_files(tmp_path)) > 1  # rotated: each file read alone above


def test_the_captures_hold_every_kind_of_message(
        captures: dict[tuple[int, bool], list[Message]]) -> None:
    """What the workload must make the server send, by protocol version: stream blocks and
    aborts of a subtransaction and of a whole transaction from version 2; begin prepare,
    prepare, commit prepared, rollback prepared and stream prepare from version 3; none of
    these in version 1. Without this, the replays above would prove less."""
    def kinds(version: int) -> set[str]:
        return {chr(payload[0]) for _, payload in captures[(version, True)]}

    def aborts(version: int) -> set[str]:
        return {"sub" if payload[1:5] != payload[5:9] else "top"
                for _, payload in captures[(version, True)] if payload[:1] == b"A"}

    assert kinds(1) >= set("BCRIUDTM")
    assert not kinds(1) & set("SEcAbPKrp")
    assert kinds(2) >= set("SEcA")
    assert aborts(2) == {"sub", "top"}
    assert kinds(3) >= set("SEcAbPKrp")


@pytest.mark.parametrize("damage", ["truncated", "unknown type", "unannounced relation",
                                    "fewer columns"])
def test_bad_bytes_in_a_real_stream_stop_it_at_their_lsn(
        captures: dict[tuple[int, bool], list[Message]], tmp_path: Path, damage: str) -> None:
    """One Insert in the middle of the real stream damaged: the consumer raises a
    ProtocolError naming that message's LSN, and the log holds exactly the transactions
    committed before it, durable."""
    stream = captures[(1, False)]
    number = next(i for i, (_, payload) in enumerate(stream)
                  if payload[:1] == b"I" and i > len(stream) // 3)
    lsn, payload = stream[number]
    bad = {"truncated": payload[:-3], "unknown type": b"\x01" + payload[1:],
           "unannounced relation": payload[:1] + b"\x00\x0f\x42\x3f" + payload[5:],
           "fewer columns": _drop_last_column(payload)}[damage]
    store = open_store(tmp_path)
    consumer = ChangeLogConsumer(store, PluginSettings("pgoutput", options(1, False)))
    with pytest.raises(ProtocolError, match=f"at {format_lsn(lsn)}: "):
        feed(consumer, [*stream[:number], (lsn, bad), *stream[number + 1:]])
    durable = consumer.flush()
    consumer.close()
    store.close()
    before = runs(read_log(tmp_path))
    reference = tmp_path / "reference"
    reference.mkdir()
    whole = open_store(reference)
    consume(whole, stream[:number], options(1, False)).close()
    whole.close()
    assert before == runs(read_log(reference))
    assert durable == whole.written_through


def feed(consumer: ChangeLogConsumer, messages: list[Message]) -> None:
    for lsn, payload in messages:
        consumer.receive(lsn, payload)


def _drop_last_column(insert: bytes) -> bytes:
    """An Insert of pgbench_history (or any table) with its row one column short: the count
    lowered and the last value cut off."""
    count = int.from_bytes(insert[6:8], "big")
    position, columns = 8, []
    for _ in range(count):
        start = position
        kind = insert[position:position + 1]
        position += 1
        if kind in (b"t", b"b"):
            position += 4 + int.from_bytes(insert[position:position + 4], "big")
        columns.append(insert[start:position])
    return insert[:6] + (count - 1).to_bytes(2, "big") + b"".join(columns[:-1])


def test_a_log_cut_at_random_points_resumes_from_the_slot_exactly_once(
        primary: Primary, captures: dict[tuple[int, bool], list[Message]],
        tmp_path: Path) -> None:
    """The stream of one slot written with kills at six random runs (the directory as a kill
    leaves it: what the process had written, its partial file cut at a random byte), each
    state resumed from the server with START_REPLICATION at what the store holds: every
    committed transaction exactly once, in commit order, as the uninterrupted log has them."""
    rng = random.Random(5)  # noqa: S311 - test data, not cryptography
    version, binary = 3, True
    ends = sum(1 for _, payload in captures[(version, binary)] if payload[:1] in
               (b"C", b"c", b"P", b"p", b"K", b"r") or payload[:2] == b"M\x00")
    kill_at = set(rng.sample(range(1, ends), 6))
    live = tmp_path / "live"
    live.mkdir()
    store = open_store(live, file_size=64 << 10, compression="zstd")
    consumer = ChangeLogConsumer(store, PluginSettings("pgoutput", options(version, binary)))
    states: list[Path] = []
    seen = [store.written_through, 0]  # the last run's end, runs written

    def receive(lsn: int, payload: bytes) -> None:
        consumer.receive(lsn, payload)
        if store.written_through == seen[0]:
            return
        seen[0], seen[1] = store.written_through, seen[1] + 1
        if seen[1] in kill_at:
            store._flush_pending()  # the process had written it all when it was killed
            state = tmp_path / f"state{len(states)}"
            shutil.copytree(live, state)
            for partial in state.glob("*.partial"):
                data = partial.read_bytes()
                partial.write_bytes(data[:rng.randrange(len(data) + 1)])
            states.append(state)

    stream_slot(primary.pg, "app", "resumed", list(options(version, binary).start_options(
        [PUBLICATION])), receive, until=primary.end)
    consumer.close()
    store.close()
    expected = runs(read_log(live))
    assert len(states) == 6
    resumed_at = []
    for state in states:
        store = open_store(state, file_size=64 << 10, compression="zstd")
        resumed_at.append(store.written_through)
        consumer = ChangeLogConsumer(store, PluginSettings("pgoutput", options(version,
                                                                               binary)))
        stream_slot(primary.pg, "app", "resumed", list(options(version, binary).start_options(
            [PUBLICATION])), consumer.receive, until=primary.end, start=store.written_through)
        consumer.close()
        store.close()
        assert runs(read_log(state)) == expected, state.name
    assert len(set(resumed_at)) >= 4  # kills spread over the stream
