"""``receivewal stream`` with a ``--slot`` the server lacks, as a user runs it against a real
PostgreSQL 15 (issue 35 item 9): the error names the slot and says how to create it, as
``logical`` does ("create it with --create-slot"); the drop-in keeps pg_receivewal's own
words."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.servers import PgServer, make_shared_dir
from support.streams import log_events, receivewal

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    base = make_shared_dir("receivewal-slothint-")
    server = PgServer(base, "primary")
    try:
        server.init(initdb_args=("--wal-segsize=1",))
        server.start()
        yield server
    finally:
        server.stop()


def test_a_missing_slot_says_how_to_create_it(pg: PgServer, tmp_path: Path) -> None:
    done = receivewal("stream", "-D", str(tmp_path), "-d", pg.dsn, "--slot", "nosuch",
                      "--no-loop", "--log-format", "json", timeout=60)
    assert done.returncode != 0, done.stderr
    text = " ".join(str(e.get("error", "")) + str(e.get("message", ""))
                    for e in log_events(done.stderr)) + done.stderr
    assert 'replication slot "nosuch" does not exist' in text, done.stderr
    assert "create it with --create-slot" in text, done.stderr
    assert "--create-slot-if-missing" in text, done.stderr
    assert "Traceback" not in done.stderr
