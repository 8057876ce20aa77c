"""pglogical_output, the plugin Debian's postgresql-15-pglogical ships, on a real server: its
Startup message and change stream decoded into the change log, and the log replayed into a
copy of the starting database gives the primary's tables. The workload is
test_logical_stream's without what this protocol does not carry (logical messages,
TRUNCATE: pglogical queues it in a table of its own) and without a table that has no
primary key for updates (pglogical refuses one in a replication set that replicates them)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.changelog import Message, consume, read_log, runs
from support.changelog import open_store as open_log
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
from support.servers import PG_BIN, PgServer, running_server

from receivewal.logical.outputmessages import Startup
from receivewal.logical.pglogical import PglogicalDecoder, startup_parameters

pytestmark = [pytest.mark.server, pytest.mark.slow]
SETS = ["default", "default_insert_only"]
WITH_KEYS = ["items", "docs", "scratch", "typed", "pgbench_accounts", "pgbench_branches",
             "pgbench_tellers"]


def plugin_installed() -> bool:
    return PG_BIN is not None and (PG_BIN.parent / "lib" / "pglogical_output.so").exists()


@dataclass
class Provider:
    pg: PgServer
    end: int

    def dsn(self, dbname: str) -> str:
        return f"host=127.0.0.1 port={self.pg.port} user=postgres dbname={dbname}"


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    """A pglogical provider node: the extension loaded, database app's tables in the
    default sets (pgbench_history, without a key, in the insert-only one), the slots, then
    the workload; database start as app was before it."""
    if not plugin_installed():
        pytest.fail("pglogical_output is required: apt-get install postgresql-15-pglogical "
                    "(scripts/setup.sh does it as root)")
    conf = {**LOGICAL_CONF, "shared_preload_libraries": "'pglogical'"}
    with running_server(conf) as pg:
        prepare_database(pg, "app")
        prepare_database(pg, "start")
        pg.sql("CREATE EXTENSION pglogical", "app")
        pg.sql("SELECT pglogical.create_node(node_name := 'provider', dsn := "
               f"'host=127.0.0.1 port={pg.port} dbname=app user=postgres')", "app")
        for table in WITH_KEYS:
            pg.sql(f"SELECT pglogical.replication_set_add_table('default', '{table}')", "app")
        pg.sql("SELECT pglogical.replication_set_add_table('default_insert_only', "
               "'pgbench_history')", "app")
        for slot in ("pgl_text", "pgl_binary"):
            create_slot(pg, "app", slot, "pglogical_output")
        run_workload(pg, "app", messages=False, truncate=False, full_identity=False)
        yield Provider(pg, current_lsn(pg, "app"))


def capture(provider: Provider, slot: str, *, binary: bool) -> list[Message]:
    got: list[Message] = []
    version = int(provider.pg.sql("SHOW server_version_num"))
    options = startup_parameters(SETS, binary=binary, forward_origins=True,
                                 server_version=version)
    stream_slot(provider.pg, "app", slot, list(options),
                lambda lsn, payload: got.append((lsn, payload)), until=provider.end)
    return got


def test_replaying_the_change_log_gives_the_providers_tables(provider: Provider,
                                                            tmp_path: Path) -> None:
    """The real plugin's stream: its Startup message first (protocol 1, native, UTF-8, the
    server's version), then transactions; into the change log and replayed into a copy of the
    starting database, every table equals the provider's; the transaction from another node
    has its origin, the unchanged TOAST column is listed."""
    stream = capture(provider, "pgl_text", binary=False)
    decoder = PglogicalDecoder()
    startup = decoder.decode(*stream[0])
    assert isinstance(startup, Startup)
    assert startup.get("max_proto_version") == "1"
    assert startup.get("encoding") == "UTF8"
    assert (startup.get("pg_version_num") or "")[:2] == "15"  # the version it was built for
    assert startup.get("forward_changeset_origins") == "t"
    assert startup.get("binary.binary_basetypes") == "f"
    store = open_log(tmp_path, file_size=256 << 10, header=(("plugin", "pglogical_output"),))
    consume(store, stream, plugin="pglogical_output").close()
    store.close()
    records = read_log(tmp_path)
    provider.pg.sql("CREATE DATABASE replay_pglogical TEMPLATE start")
    replay(records, provider.dsn("replay_pglogical"))
    assert compare_tables(provider.dsn("app"), provider.dsn("replay_pglogical"),
                          [t for t in TABLES if t != "full_rows"]) == {}
    assert [(r["name"], r["origin_lsn"]) for r in records if r["op"] == "origin"] == [
        ("upstream", "0/ABCDEF")]
    docs = [r for r in records if r["op"] == "update" and r["table"] == "docs"]
    assert [(r["new"], r["unchanged_toast"]) for r in docs] == [
        ({"id": "1", "note": "second"}, ["body"])]
    relation = next(r for r in records if r["op"] == "relation" and r["table"] == "items")
    assert relation["columns"] == [{"name": "id", "type": None, "key": True},
                                   {"name": "name", "type": None, "key": False},
                                   {"name": "qty", "type": None, "key": False}]
    assert len(runs(records)) > 80


def test_binary_values_are_kept_as_bytes(provider: Provider, tmp_path: Path) -> None:
    """Asked for binary, the plugin grants it in its Startup message and sends the types'
    send format; its relation metadata has no types, so the change log keeps the bytes
    (base64), never guesses: an int4 key is its 4 big-endian bytes."""
    stream = capture(provider, "pgl_binary", binary=True)
    startup = PglogicalDecoder().decode(*stream[0])
    assert isinstance(startup, Startup)
    assert startup.get("binary.binary_basetypes") == "t"
    store = open_log(tmp_path, header=(("plugin", "pglogical_output"),))
    consume(store, stream, plugin="pglogical_output").close()
    store.close()
    inserted = [r["new"]["id"] for r in read_log(tmp_path)
                if r["op"] == "insert" and r["table"] == "items"]
    assert inserted[0] == {"binary_b64": base64.b64encode((1).to_bytes(4, "big")).decode()}
