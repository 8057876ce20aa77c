"""The package's structure, read from its own source: which module imports which."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from receivewal.daemon.signals import StopSignal
from receivewal.replication import connection

PACKAGE = Path(__file__).parent.parent / "receivewal"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports anywhere (also inside functions):
    ``from a.b import c`` counts as ``a.b.c`` when that is a module, else as ``a.b``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in modules else node.module)
    return found & modules


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    return {module_name(path): imported_modules(path, modules) - {module_name(path)}
            for path in paths}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of two or more modules that import each other in a loop (Tarjan's strongly
    connected components), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_is_read_from_the_source() -> None:
    """The graph knows the package's modules and a lazy import inside a function
    (check/analyze imports check/report only when it writes the report)."""
    graph = import_graph()
    assert "receivewal.check.report" in graph["receivewal.check.analyze"]
    assert "receivewal.wal.lsn" in graph["receivewal.check.report"]


def test_no_two_modules_import_each_other_in_a_circle() -> None:
    """No module of receivewal imports, directly or through others, a module that imports it
    back, counting the imports made lazily inside functions too."""
    assert circles(import_graph()) == []


def test_the_replication_connection_hands_out_only_receivewal_types() -> None:
    """psycopg stays behind its door: only replication/connection.py imports it, and every
    name another module takes from that module is receivewal's own (no psycopg enum, class or
    result crosses the connection's interface)."""
    door = "receivewal.replication.connection"
    foreign: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [alias.name for alias in node.names]
                module = node.module if isinstance(node, ast.ImportFrom) else None
                if module_name(path) != door and any(
                        name.split(".")[0] == "psycopg" for name in [module or "", *names]):
                    foreign.append(f"{module_name(path)} imports psycopg")
                if module == door:
                    foreign.extend(
                        f"{module_name(path)} takes {name} ({owner}) from the connection"
                        for name in names
                        if not (owner := getattr(getattr(connection, name), "__module__",
                                                 door)).startswith("receivewal."))
    assert foreign == []


@pytest.mark.parametrize("module", ["receivewal.daemon.monitor", "receivewal.daemon.proctitle"])
def test_masking_passwords_does_not_load_psycopg(module: str) -> None:
    """The monitor and the process title mask passwords in connection strings without loading
    psycopg: the masking is the root module receivewal.secrets, not the connection's."""
    code = f"import sys, {module}; print('psycopg' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_only_the_waiting_module_waits_on_descriptors() -> None:
    """One waiting machinery: replication/waiting.py is the only module that makes a selector
    (the supervisor's sleep between reconnects waits through it too)."""
    waiting = "receivewal.replication.waiting"
    makers = [module_name(path) for path in sorted(PACKAGE.rglob("*.py"))
              if module_name(path) != waiting
              and ("import selectors" in path.read_text() or "Selector()" in path.read_text())]
    assert makers == []


def test_a_stop_signal_ends_the_supervisors_sleep() -> None:
    """SIGTERM during the sleep between reconnects: the sleep returns with the stop requested
    (instead of running its 60 seconds), having ticked while it waited."""
    stop = StopSignal()
    stop.install()
    ticks: list[None] = []
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    try:
        timer.start()
        stop.sleep(60, on_tick=lambda: ticks.append(None))
    finally:
        timer.cancel()
        stop.uninstall()
    assert stop.signal_name == "SIGTERM"
    assert ticks


DURABILITY = "receivewal.archive.durable"
_DURABLE_OS_CALLS = {"fsync", "fdatasync", "rename", "replace", "renames", "mkstemp"}


def durability_calls(path: Path) -> list[str]:
    """Where ``path`` fsyncs, renames or makes temporary files itself: ``os.fsync``,
    ``os.rename``, ``os.replace`` (also imported by name from os) and any use of tempfile."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "os" and node.attr in _DURABLE_OS_CALLS:
            found.append(f"os.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found.extend(f"from os import {a.name}" for a in node.names
                         if a.name in _DURABLE_OS_CALLS)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            names = [module or "", *(a.name for a in node.names)]
            found.extend("import tempfile" for n in names if n.split(".")[0] == "tempfile")
    return [f"{module_name(path)}:{node_line}" for node_line in found]


def test_durability_calls_are_in_the_durable_module_only() -> None:
    """One module creates temporary files, fsyncs and renames (the writer seam of issue 19):
    no other module of the package calls os.fsync, os.rename or os.replace, or uses tempfile."""
    assert durability_calls(PACKAGE / "archive" / "durable.py")  # the check sees them
    elsewhere = [call for path in sorted(PACKAGE.rglob("*.py"))
                 if module_name(path) != DURABILITY for call in durability_calls(path)]
    assert elsewhere == []


def test_the_copy_loop_knows_only_its_consumer() -> None:
    """The COPY loop drives the StreamConsumer interface and nothing else: it imports nothing
    of the archive, nor the physical session, its start-up or its feed (a logical change log
    is another consumer); the session writes through ArchiveFeed, not the writer's classes;
    and no module hooks into completed files other than through the event stream."""
    graph = import_graph()
    loop = graph["receivewal.daemon.copyloop"]
    assert [name for name in loop if name.startswith("receivewal.archive")] == []
    assert loop & {"receivewal.daemon.session", "receivewal.daemon.startpoint",
                   "receivewal.daemon.archivefeed"} == set()
    assert "receivewal.daemon.archivefeed" in graph["receivewal.daemon.session"]
    assert "receivewal.archive.writer" not in graph["receivewal.daemon.session"]
    assert not [path for path in sorted(PACKAGE.rglob("*.py")) if "on_completed" in
                path.read_text()]


PHYSICAL = {"receivewal.daemon.session", "receivewal.daemon.startpoint",
            "receivewal.daemon.archivefeed", "receivewal.daemon.walreceiver",
            "receivewal.daemon.uploader"}


@pytest.mark.parametrize("module", ["receivewal.daemon.supervisor", "receivewal.daemon.copyloop",
                                    "receivewal.daemon.monitor", "receivewal.daemon.metrics",
                                    "receivewal.daemon.events", "receivewal.daemon.lifecycle",
                                    "receivewal.daemon.signals"])
def test_what_a_logical_receiver_reuses_knows_no_archive(module: str) -> None:
    """The supervisor runs a Receiver, the COPY loop drives a StreamConsumer, the monitor and
    the metrics take events: none imports the archive, nor the WAL archive's session, start-up,
    feed, receiver or uploader (a logical change log plugs in beside them)."""
    imported = import_graph()[module]
    assert [name for name in imported if name.startswith("receivewal.archive")] == []
    assert imported & PHYSICAL == set()


FLUSHED_NAMES = {"flushed", "_flushed", "durable", "_durable"}
FLUSHED_READERS = {"receivewal.daemon.monitor", "receivewal.daemon.metrics"}


def flushed_assignments(path: Path) -> list[tuple[str, ast.expr]]:
    """Every assignment in ``path`` to an attribute named like the flushed position, with the
    value assigned."""
    found: list[tuple[str, ast.expr]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        value = getattr(node, "value", None)
        found.extend((target.attr, value) for target in targets
                     if isinstance(target, ast.Attribute) and target.attr in FLUSHED_NAMES
                     and value is not None)
    return found


def test_the_flushed_position_has_one_holder() -> None:
    """Only the segment writer moves the flushed position (the syncer's worker records what
    it finished, the writer takes it); the monitor and the metrics keep what a Flushed event
    carries, as it is (a parameter or their initial value, never a max or a sum); only the
    archive's feed states Flushed, from the writer; and only the WAL archive's receiver reads
    the last run's position from the state file, to hand it to the writer."""
    assert flushed_assignments(PACKAGE / "archive" / "writer.py")  # the check sees them
    moved = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if name == "receivewal.archive.writer":
            continue
        for attr, value in flushed_assignments(path):
            if name not in FLUSHED_READERS or not isinstance(value, ast.Name | ast.Constant):
                moved.append(f"{name}: {attr} = {ast.unparse(value)}")
    assert moved == []
    stating = [module_name(path) for path in sorted(PACKAGE.rglob("*.py"))
               if any(isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Flushed"
                      for node in ast.walk(ast.parse(path.read_text(), str(path))))]
    assert stating == ["receivewal.daemon.archivefeed"]
    reading = [module_name(path) for path in sorted(PACKAGE.rglob("*.py"))
               if "previous_flush(" in path.read_text()
               and module_name(path) != "receivewal.daemon.state"]
    assert reading == ["receivewal.daemon.walreceiver"]
