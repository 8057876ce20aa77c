"""The replication connection against a real server: the COPY stream read in receivewal's own
types, every wait on the socket and the stop signal together."""

from __future__ import annotations

import pytest
from support.servers import PgServer
from support.stopflag import Stop

from receivewal.replication.connection import ReplicationConnection, build_conninfo
from receivewal.replication.link import COPY_DONE, ResultStatus
from receivewal.replication.messages import XLOGDATA_TAG
from receivewal.wal.lsn import parse_lsn

pytestmark = pytest.mark.server



@pytest.mark.shared_server
def test_copy_stream_is_read_in_receivewal_types(pg: PgServer) -> None:
    """read_copy(timeout) waits for the server's CopyData and hands out its bytes, a stop
    signal ends a wait with None, COPY_DONE follows our CopyDone, and the results after the
    stream carry receivewal's ResultStatus, not psycopg's."""
    stop = Stop()
    conn = ReplicationConnection.open(build_conninfo(pg.dsn), stop=stop, timeout=60)
    try:
        _, timeline, xlogpos, _ = conn.query("IDENTIFY_SYSTEM")[0]
        assert timeline is not None
        assert xlogpos is not None
        conn.start_copy_both(f"START_REPLICATION PHYSICAL {xlogpos} TIMELINE {timeline}")
        pg.switch_wal()
        while (message := conn.read_copy(30.0)) is None or message is COPY_DONE \
                or message[0] != XLOGDATA_TAG:
            assert message is not COPY_DONE
        assert int.from_bytes(message[1:9], "big") == parse_lsn(xlogpos)
        stop.w.send(b"x")
        while (message := conn.read_copy(20.0)) is not None:  # what has arrived comes first
            assert message is not COPY_DONE
        assert stop.drained == 1, "the stop signal ended the wait"
        conn.end_copy()
        while (message := conn.read_copy(30.0)) is not COPY_DONE:
            pass
        statuses = []
        while (result := conn.next_result()) is not None:
            statuses.append(result.status)
        assert statuses == [ResultStatus.COMMAND_OK] * 2  # the COPY's end, then the command's
        assert all(type(status) is ResultStatus for status in statuses)
    finally:
        conn.close()
