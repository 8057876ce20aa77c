"""One PostgreSQL server per test process (a pytest-xdist worker), for the tests that only use
a server: they never stop, kill, restart, reconfigure or promote it, nor read its data
directory beyond pg_wal. Such a test is marked ``shared_server`` and its ``pg`` is this server
(conftest.py), started when the first of them asks; a test that needs a server of its own
keeps the fresh one ``pg`` gives otherwise.

Each test leaves the server as it found it (:func:`tidy`): the sessions it opened are ended,
its replication slots, publications, databases and the tables of the public schema dropped.
Its archive, slot names and tables are its own while it runs (the tests of one worker run one
after the other). The server's WAL goes on from test to test, on timeline 1, as any server's
does. Should the tidying fail, the server is stopped and the next test gets a new one.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from support.servers import PgServer, make_shared_dir

#: what tidy() ends and drops, in this order
END_SESSIONS = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND backend_type IN ('client backend', 'walsender')")
OTHER_SESSIONS = ("SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                  "AND backend_type IN ('client backend', 'walsender')")
DROP_SLOTS = "SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots"
DATABASES = "SELECT datname FROM pg_database WHERE datname NOT IN ('postgres', 'template0', " \
            "'template1')"
PUBLICATIONS = "SELECT pubname FROM pg_publication"
FRESH_PUBLIC = ("DROP SCHEMA public CASCADE; CREATE SCHEMA public AUTHORIZATION "
                "pg_database_owner; GRANT USAGE ON SCHEMA public TO PUBLIC")


class WorkerServer:
    """The server of this test process, started on first use (:meth:`get`)."""

    def __init__(self) -> None:
        self.server: PgServer | None = None
        self.base: Path | None = None

    def get(self) -> PgServer:
        """The running server; a new one if there is none yet (or the last was given up)."""
        if self.server is None:
            self.base = make_shared_dir("receivewal-pg-worker-")
            server = PgServer(self.base, "primary")
            server.init()
            server.start()
            self.server = server
        return self.server

    def tidy(self) -> None:
        """Leave the server as the next test expects to find it (see the module's text); if
        that fails, give it up (:meth:`close`): the next test gets a new one."""
        server = self.server
        if server is None:
            return
        try:
            tidy(server)
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        """Stop the server and remove its directory."""
        if self.server is not None:
            self.server.stop("immediate")
            self.server = None
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None


def tidy(server: PgServer, timeout: float = 30) -> None:
    """End every other session of ``server``; drop its replication slots, publications and
    databases (but postgres and the templates), and the public schema's objects."""
    deadline = time.monotonic() + timeout
    server.sql(END_SESSIONS)
    while server.sql(OTHER_SESSIONS) != "0":
        if time.monotonic() > deadline:
            raise TimeoutError("sessions of the shared server did not end")
        time.sleep(0.05)
        server.sql(END_SESSIONS)
    server.sql(DROP_SLOTS)
    for publication in server.sql(PUBLICATIONS).split():
        server.sql(f'DROP PUBLICATION "{publication}"')
    for database in server.sql(DATABASES).split("\n"):
        if database:
            server.sql(f'DROP DATABASE "{database}" WITH (FORCE)')
    server.sql(FRESH_PUBLIC)
