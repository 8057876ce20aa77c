"""Shared fixtures: real PostgreSQL servers started by the tests themselves."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import failnotes
from support.clusters import TEMPLATES_ENV
from support.package import built_deb
from support.seaweed import SeaweedS3, running_seaweed
from support.servers import PG_BIN, PgServer, make_shared_dir, started_servers
from support.sharedserver import WorkerServer
from support.sparkarchives import TwoArchives, two_server_archives_once

from receivewal.wal.nativescan import load_native

DATA = Path(__file__).parent / "data"
OWN_TEMPLATES = pytest.StashKey[Path]()


#: Options for every JVM the Spark tests start (the embedded session, the analyze commands
#: they run, the Spark Connect server, the standalone cluster's daemons; its executors get them
#: in test_analyze_cluster's conf): only the quick JIT tier and the serial collector. A Spark
#: JVM's start spends most of its CPU compiling and collecting with threads that, on 2 shared
#: cores, compete with everything else: a session's start took 24-29 s with them against 77-80 s
#: without (load 10-13; a small job after it 19 s against 26-42 s). Nothing Spark computes
#: changes; a user's own SPARK_SUBMIT_OPTS / SPARK_DAEMON_JAVA_OPTS are kept.
SPARK_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SPARK_JVM_ENV = ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS")


def pytest_configure(config: pytest.Config) -> None:
    """One directory of initdb templates (support/clusters.py) for the session and the
    benchmarks it runs; made here unless a parent run (or the user) named one already.
    The Spark JVMs' options (SPARK_JVM_OPTIONS), unless the user set them."""
    for name in SPARK_JVM_ENV:
        os.environ.setdefault(name, SPARK_JVM_OPTIONS)
    config.addinivalue_line("markers", SHARED_SERVER_MARKER)
    if not os.environ.get(TEMPLATES_ENV):
        path = make_shared_dir("receivewal-initdb-")
        os.environ[TEMPLATES_ENV] = str(path)
        config.stash[OWN_TEMPLATES] = path


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the templates this session made."""
    path = config.stash.get(OWN_TEMPLATES, None)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
        os.environ.pop(TEMPLATES_ENV, None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed phase's report carries the notes its fixtures registered (support.failnotes:
    e.g. the journal of the systemd units a test drove)."""
    del call
    report = yield
    if report.failed:
        report.sections.extend(failnotes.sections(item))
    return report


@pytest.fixture(params=["c", "python"])
def receive_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each receive loop in turn for the receivewal processes a test starts: the compiled one
    (skipped only where receivewal.replication._recv is not built) and pure Python, chosen
    with RECEIVEWAL_PURE_PYTHON."""
    path: str = request.param
    if path == "c" and load_native("receivewal.replication._recv") is None:
        pytest.skip("the C extension receivewal.replication._recv is not built here")
    monkeypatch.setenv("RECEIVEWAL_PURE_PYTHON", "0" if path == "c" else "1")
    return path


def server_logs(base: Path) -> str:
    """The end of each server log in ``base`` (a PgServer's ``<name>.log``)."""
    return "\n".join(f"== {path.name}\n{path.read_text(errors='replace')[-4000:]}"
                     for path in sorted(base.glob("*.log")))


@pytest.fixture
def server_base(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A directory for one test's servers, writable by the server user, removed afterwards;
    a failed test's report ends with the servers' logs."""
    base = make_shared_dir("receivewal-pg-")
    failnotes.on_failure(request.node, "server logs", lambda: server_logs(base))
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg(request: pytest.FixtureRequest, server_base: Path) -> Iterator[PgServer]:
    """A fresh primary (wal_level=replica, replication over 127.0.0.1), stopped afterwards;
    for a test marked ``shared_server``, the primary of its worker (see below)."""
    if PG_BIN is None:
        pytest.fail("PostgreSQL server binaries are required (install postgresql or set PG_BIN)")
    if request.node.get_closest_marker("shared_server"):
        yield request.getfixturevalue("worker_pg")
        return
    server = PgServer(server_base, "primary")
    server.init()
    server.start()
    yield server
    server.stop("immediate")


@pytest.fixture
def archive_dir() -> Iterator[Path]:
    """An empty archive directory that the server user can reach (for restore_command)."""
    base = make_shared_dir("receivewal-archive-")
    path = base / "archive"
    path.mkdir()
    yield path
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """An empty archive directory and an empty pg_wal, for restore's tests on files: one call
    at a time, so without prefetch (no filler forked from the test process; prefetch has its
    own tests in test_restore_prefetch.py and test_restore_bucket.py)."""
    monkeypatch.setenv("RECEIVEWAL_PREFETCH", "0")
    archive, pg_wal = tmp_path / "archive", tmp_path / "pg_wal"
    archive.mkdir()
    pg_wal.mkdir()
    return archive, pg_wal


@pytest.fixture(scope="session")
def two_archives() -> TwoArchives:
    """Two archives from two servers, built once per run (for every worker) for the analyze
    modules (local, Spark Connect, standalone cluster), which only read them."""
    return two_server_archives_once("receivewal-analyze-")


@pytest.fixture(scope="session")
def deb() -> Iterator[Path]:
    """scripts/build-deb's package, built once for the package and systemd tests, removed at
    the end of the session."""
    with built_deb() as path:
        yield path


SPARK_MODULES = ("test_analyze.py", "test_analyze_connect.py", "test_analyze_cluster.py",
                 "test_analyze_bucket.py", "test_analyze_changes.py", "test_analyze_asof.py")


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist (the test extra)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` sends each module to one worker as a whole, and the modules of one
    support.workers.WORKER_GROUPS group to the same worker."""
    if config.getvalue("dist") != "loadfile":
        return None
    from support.workers import ModuleGroupScheduling  # noqa: PLC0415 - only under xdist
    return ModuleGroupScheduling(config, log)


#: pytest-timeout's bound (pyproject.toml: 300 s) for a test marked ``spark``: its set-up may
#: start a JVM (or a cluster of them) and run a whole analysis, which at load 12-17 on this
#: 2-core machine took 260 s of test_analyze_connect's 300 (it passed, once); a bound, not a
#: wait: a passing run takes what it takes.
SPARK_TIMEOUT = 900


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked ``spark`` get SPARK_TIMEOUT unless they name their own."""
    for item in items:
        if item.get_closest_marker("spark") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SPARK_TIMEOUT))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m "... not spark ..."`` the Spark modules are not even imported, so the fast loop
    runs without the spark extra (pyspark, pyarrow) and Java installed."""
    if collection_path.name in SPARK_MODULES and "not spark" in (config.option.markexpr or ""):
        return True
    return None


@contextlib.contextmanager
def seaweed_in_temporary_directory() -> Iterator[SeaweedS3]:
    """A started SeaweedFS (``weed mini``) with its data in a temporary directory; stopped and
    removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="receivewal-s3-"))
    try:
        with running_seaweed(base) as server:
            yield server
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- one SeaweedFS per worker (issue 34 §5) -----------------------------------------------------
#: The modules that kill, stop or restart their S3 server start one of their own; every other
#: module has a bucket of its own on the worker's one server (``seaweed_server``): a start and
#: a stop took 3-15 s a module. A shared server refuses to be stopped by a module's view of
#: it (support.seaweed.SeaweedS3.bucket_view), so a module missing here fails plainly.
OWN_STORE_MODULES = ("test_bucket.py", "test_upload.py", "test_upload_faults.py",
                     "test_local_disk.py")


def module_bucket(module: Path) -> str:
    """The bucket of a test module on the shared server: a valid S3 name from its file name."""
    return "m-" + module.stem.lower().replace("_", "-")[:60]


@pytest.fixture(scope="module")
def seaweed(request: pytest.FixtureRequest) -> Iterator[SeaweedS3]:
    """A real S3 server (SeaweedFS ``weed mini``) for one test module: the worker's shared one
    with a bucket of the module's own, or, for OWN_STORE_MODULES (which kill and restart it),
    one started for the module and stopped afterwards."""
    if request.path.name in OWN_STORE_MODULES:
        with seaweed_in_temporary_directory() as server:
            yield server
        return
    shared: SeaweedS3 = request.getfixturevalue("seaweed_server")
    yield shared.bucket_view(module_bucket(request.path))
# -- end of one SeaweedFS per worker ---------------------------------------------------------


@pytest.fixture
def store(seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> SeaweedS3:
    """The module's S3 server, which this process and its children (restore calls, their
    prefetch fillers, which exit after 10 idle seconds) reach through boto3's chain."""
    for key, value in seaweed.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RECEIVEWAL_PREFETCH_IDLE", "10")
    return seaweed


@pytest.fixture(scope="session")
def seaweed_server() -> Iterator[SeaweedS3]:
    """The worker's S3 server: every module but OWN_STORE_MODULES has a bucket on it
    (``seaweed``), and the shared Spark session (``spark``) is started for it: its Python
    workers have this server's endpoint and credentials. Modules that read s3:// archives
    through that session use it as their ``seaweed`` (test_analyze_bucket)."""
    with seaweed_in_temporary_directory() as server:
        yield server


@pytest.fixture(scope="session")
def spark(seaweed_server: SeaweedS3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One embedded Spark session (two cores: the machine is shared) for every module that
    runs analyze in this process: its start-up took seconds per module. It starts with the
    endpoint and credentials of ``seaweed_server`` in the environment, as a DBA's configured
    chain would be before analyze starts, so its executors' Python workers read s3:// archives
    (make_session hands them that environment); the driver's environment is as it was after."""

    from receivewal.check.sparksession import make_session  # noqa: PLC0415 - the spark extra

    with pytest.MonkeyPatch.context() as patch:
        for name, value in seaweed_server.env().items():
            patch.setenv(name, value)
        session = make_session(scratch=tmp_path_factory.mktemp("spark"), master="local[2]")
    yield session
    session.stop()


# -- one PostgreSQL per worker (support/sharedserver.py) ----------------------------------------

SHARED_SERVER_MARKER = (
    "shared_server: the test's pg is its worker's server (it never stops, kills, restarts, "
    "reconfigures or promotes it); support/sharedserver.py")


@pytest.fixture(scope="session")
def worker_server() -> Iterator[WorkerServer]:
    """The server of this worker, started when the first test marked ``shared_server`` asks
    for it, stopped when the worker ends."""
    holder = WorkerServer()
    yield holder
    holder.close()


@pytest.fixture
def worker_pg(request: pytest.FixtureRequest, worker_server: WorkerServer) -> Iterator[PgServer]:
    """The worker's server for one test, tidied afterwards (its sessions, slots, publications,
    databases and tables gone); a failed test's report ends with the end of the server's log."""
    server = worker_server.get()
    failnotes.on_failure(request.node, "shared server log",
                         lambda: server.logfile.read_text(errors="replace")[-4000:]
                         if server.logfile.exists() else "")
    yield server
    worker_server.tidy()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The work the run did, beside --durations' slowest: the sum of every test's set-up, call
    and teardown seconds over all workers (what ``-n`` divides; the wall time is at least the
    longest unit of tests/support/workers.py)."""
    reports = [rep for reps in terminalreporter.stats.values() for rep in reps
               if isinstance(rep, pytest.TestReport)]
    if not reports:
        return
    phases = {when: sum(rep.duration for rep in reports if rep.when == when)
              for when in ("setup", "call", "teardown")}
    terminalreporter.write_line(
        f"total worker-seconds: {sum(phases.values()):.0f} s "
        f"(setup {phases['setup']:.0f}, call {phases['call']:.0f}, "
        f"teardown {phases['teardown']:.0f})")
    starts = started_servers()
    if starts is not None:
        terminalreporter.write_line(f"PostgreSQL server starts: {starts}")
