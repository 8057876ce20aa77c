"""The package's structure, read from its own source: which module imports which."""

from __future__ import annotations

import ast
import functools
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from receivewal.daemon.signals import StopSignal
from receivewal.replication import connection

PACKAGE = Path(__file__).parent.parent / "receivewal"


@functools.cache
def syntax_tree(path: Path) -> ast.Module:
    """``path`` parsed, once per process: every rule below walks the same trees (parsing the
    whole package again for each case took most of this module's time)."""
    return ast.parse(path.read_text(), str(path))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports anywhere (also inside functions):
    ``from a.b import c`` counts as ``a.b.c`` when that is a module, else as ``a.b``."""
    found: set[str] = set()
    for node in ast.walk(syntax_tree(path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in modules else node.module)
    return found & modules


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Each module of the package and the package's modules it imports (read once per
    process: the callers only read it)."""
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


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """``start`` and every module it imports, directly or through others (lazily too)."""
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module])
    return seen


def top_level_imports(path: Path) -> set[str]:
    """The first name of every module ``path`` imports anywhere (``click`` for
    ``from click.testing import ...``)."""
    found: set[str] = set()
    for node in ast.walk(syntax_tree(path)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def module_path(module: str) -> Path:
    """The source file of one of the package's modules."""
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


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
    """psycopg stays behind its doors: only replication/connection.py (the replication
    connection, libpq's pq layer) and apply/postgres.py (apply's target database, a plain
    client session) import it, and every name another module takes from the connection is
    receivewal's own (no psycopg enum, class or result crosses the connection's interface)."""
    door = "receivewal.replication.connection"
    target = "receivewal.apply.postgres"
    foreign: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(syntax_tree(path)):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [alias.name for alias in node.names]
                module = node.module if isinstance(node, ast.ImportFrom) else None
                if module_name(path) not in (door, target) and any(
                        name.split(".")[0] == "psycopg" for name in [module or "", *names]):
                    foreign.append(f"{module_name(path)} imports psycopg")
                if module == door:
                    foreign.extend(
                        f"{module_name(path)} takes {name} ({owner}) from the connection"
                        for name in names
                        if not (owner := getattr(getattr(connection, name), "__module__",
                                                 door)).startswith("receivewal."))
    assert foreign == []


def test_deltalake_stays_behind_the_delta_target() -> None:
    """One door to Delta Lake: apply/delta.py alone imports deltalake (the delta extra), and
    apply's driver loads it only for a ``delta:`` target, so a PostgreSQL target runs
    without the extra."""
    door = "receivewal.apply.delta"
    importers = [module_name(path) for path in sorted(PACKAGE.rglob("*.py"))
                 if "deltalake" in top_level_imports(path)]
    assert importers == [door]
    code = "import sys, receivewal.apply.run; print('deltalake' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


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
    for node in ast.walk(syntax_tree(path)):
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
    assert loop & {"receivewal.walreceiver.session", "receivewal.walreceiver.startpoint",
                   "receivewal.walreceiver.archivefeed"} == set()
    assert "receivewal.walreceiver.archivefeed" in graph["receivewal.walreceiver.session"]
    assert "receivewal.archive.writer" not in graph["receivewal.walreceiver.session"]
    assert not [path for path in sorted(PACKAGE.rglob("*.py")) if "on_completed" in
                path.read_text()]


def functions_calling(path: Path, names: set[str]) -> set[str]:
    """The functions of ``path`` (nested ones by their own name) that call one of ``names``,
    as ``f(...)``, ``os.f(...)`` or ``durable.f(...)``."""
    found = set()
    for node in ast.walk(syntax_tree(path)):
        if isinstance(node, ast.FunctionDef):
            for call in ast.walk(node):
                if isinstance(call, ast.Call):
                    func = call.func
                    name = func.id if isinstance(func, ast.Name) else \
                        func.attr if isinstance(func, ast.Attribute) else ""
                    if name in names:
                        found.add(node.name)
    return found


def test_a_file_is_finished_by_one_function() -> None:
    """One way to finish a file, as walmethods.c's close is: ``durable.finish_file`` fsyncs it,
    renames it into place and fsyncs the directory. It holds the package's only rename (no
    other function of durable renames, and durable offers no other), durable's own
    ``durable_file`` finishes through it, and every module that makes a temporary file
    (``create_temporary``) gives it its name through it."""
    durable_py = PACKAGE / "archive" / "durable.py"
    assert functions_calling(durable_py, {"replace", "rename"}) == {"finish_file"}
    assert "durable_file" in functions_calling(durable_py, {"finish_file"})
    from receivewal.archive import durable  # noqa: PLC0415

    assert not hasattr(durable, "rename")
    unfinished = [module_name(path) for path in sorted(PACKAGE.rglob("*.py"))
                  if path != durable_py and functions_calling(path, {"create_temporary"})
                  and not functions_calling(path, {"finish_file"})]
    assert unfinished == []


def test_restore_is_a_room_beside_the_daemon() -> None:
    """restore/ (restore_command and its prefetch spool) stands on archive/ and wal/ beside
    daemon/ and check/: only the command line imports it, and it imports neither the command
    line nor the daemon (its core and both receivers), replication, check, relay or logical
    rooms."""
    graph = import_graph()
    rooms = ("receivewal.commands", "receivewal.daemon", "receivewal.walreceiver",
             "receivewal.logicalreceiver", "receivewal.replication", "receivewal.check",
             "receivewal.relay", "receivewal.logical")
    inside = [m for m in graph if m.startswith("receivewal.restore")]
    assert "receivewal.restore.call" in inside
    up = sorted(f"{m} -> {t}" for m in inside for t in graph[m] if t.startswith(rooms))
    assert up == []
    users = sorted(m for m, targets in graph.items() if not m.startswith("receivewal.restore")
                   and any(t.startswith("receivewal.restore") for t in targets))
    assert [m for m in users if not m.startswith("receivewal.commands.")] == []


# The floors of the house, bottom up: a room imports only the rooms on the floors below its
# own (the modules at the package's top, errors, logs and secrets, are the ground; __main__
# is the command line's door). Rooms on one floor stand beside each other and import none
# of each other: the daemon's shared core knows no receiver, backup/ neither recovers nor
# expires, and the WAL receiver's meter reads retention's summary from a floor above it.
FLOORS = {
    "": 0,
    "wal": 1,
    "archive": 2, "replication": 2,
    "backup": 3, "daemon": 3, "logical": 3, "relay": 3, "restore": 3,
    "check": 4, "retention": 4, "logicalreceiver": 4, "apply": 4,
    "recovery": 5, "walreceiver": 5,
    "commands": 6,
}


def room_of(module: str) -> str:
    """The room (subpackage) of one of the package's modules; "" for the modules at its top
    (``__main__``, the entry point, counts as the command line's)."""
    if module == "receivewal.__main__":
        return "commands"
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) \
        else ""


def climbing_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module in another room that is not on a floor below the importer's."""
    return sorted(f"{module} -> {target}" for module, targets in graph.items()
                  for target in targets if room_of(target) != room_of(module)
                  and FLOORS[room_of(target)] >= FLOORS[room_of(module)])


def test_the_floors_name_every_room() -> None:
    """Each subpackage has its floor, so that a new room cannot be added without saying
    where it stands."""
    folders = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert folders ^ (set(FLOORS) - {""}) == set()


def test_no_import_climbs_a_floor() -> None:
    """No module imports, at its top or inside a function, a module of a room on its own floor
    or above: the WAL receiver and the logical one stand on the daemon's shared core, which
    imports neither; recovery and retention stand on backup/, which imports neither."""
    assert climbing_imports({"receivewal.daemon.monitor": {"receivewal.walreceiver.session"},
                             "receivewal.backup.catalog": {"receivewal.wal.names"}}) == \
        ["receivewal.daemon.monitor -> receivewal.walreceiver.session"]  # the check sees one
    assert climbing_imports(import_graph()) == []


def test_the_layer_map_names_every_subpackage() -> None:
    """receivewal/__init__.py's layer map lists each subpackage of the package, so that a
    new room cannot be added without a line saying where it stands."""
    import receivewal  # noqa: PLC0415 - its docstring is what is read

    listed = set(re.findall(r"^ {4}(\w+)/ ", receivewal.__doc__ or "", re.MULTILINE))
    folders = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert folders - listed == set()


def test_the_dropin_does_not_import_click() -> None:
    """pg_receivewal-streampack reads pg_receivewal's command line as getopt_long does, from
    the declarations in commands/options.py: neither it nor any module it imports (lazily
    too) imports click, which is ``receivewal``'s own command line."""
    graph = import_graph()
    clicking = sorted(module for module in reachable(graph, "receivewal.commands.pg_receivewal")
                      if "click" in top_level_imports(module_path(module)))
    assert clicking == []


PHYSICAL = {"receivewal.walreceiver.session", "receivewal.walreceiver.startpoint",
            "receivewal.walreceiver.archivefeed", "receivewal.walreceiver.receiver",
            "receivewal.walreceiver.uploader"}


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


LOGICAL = {"receivewal.logicalreceiver.receiver", "receivewal.logicalreceiver.session",
           "receivewal.logicalreceiver.changefeed", "receivewal.logicalreceiver.logicalsettings"}


@pytest.mark.parametrize("module", ["receivewal.daemon.supervisor", "receivewal.daemon.copyloop",
                                    "receivewal.daemon.monitor", "receivewal.daemon.metrics",
                                    "receivewal.daemon.events", "receivewal.daemon.lifecycle"])
def test_what_both_receivers_share_knows_neither(module: str) -> None:
    """The shared daemon knows no receiver: nothing of it imports the logical receiver's
    modules (nor the logical/ package) any more than the WAL archive's."""
    imported = import_graph()[module]
    assert imported & LOGICAL == set()
    assert [name for name in imported if name.startswith("receivewal.logical")] == []


def test_the_logical_receiver_stands_beside_the_wal_archives() -> None:
    """The logical receiver, its session, feed and settings import none of the WAL archive's
    session, start-up, feed, receiver or uploader (only the directory's lock of archive/);
    they run on the shared supervisor and COPY loop; the WAL archive's modules import none of
    them."""
    graph = import_graph()
    assert set(graph) >= LOGICAL
    for module in sorted(LOGICAL):
        assert graph[module] & PHYSICAL == set(), module
    assert "receivewal.daemon.copyloop" in graph["receivewal.logicalreceiver.session"]
    assert "receivewal.logicalreceiver.changefeed" in graph["receivewal.logicalreceiver.session"]
    for module in sorted(PHYSICAL):
        assert graph[module] & LOGICAL == set(), module
    supervisor_users = {m for m, targets in graph.items()
                        if "receivewal.daemon.supervisor" in targets}
    assert {"receivewal.commands.stream", "receivewal.commands.logical"} <= supervisor_users


FLUSHED_NAMES = {"flushed", "_flushed", "durable", "_durable"}
FLUSHED_READERS = {"receivewal.daemon.monitor", "receivewal.daemon.metrics"}


def flushed_assignments(path: Path) -> list[tuple[str, ast.expr]]:
    """Every assignment in ``path`` to an attribute named like the flushed position, with the
    value assigned."""
    found: list[tuple[str, ast.expr]] = []
    for node in ast.walk(syntax_tree(path)):
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
    archive's feed states Flushed, from the writer, and the change log's, from its
    consumer; and only the WAL archive's receiver reads the last run's position from the state
    file, to hand it to the writer."""
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
                      for node in ast.walk(syntax_tree(path)))]
    assert stating == ["receivewal.logicalreceiver.changefeed",
                       "receivewal.walreceiver.archivefeed"]
    reading = [module_name(path) for path in sorted(PACKAGE.rglob("*.py"))
               if "previous_flush(" in path.read_text()
               and module_name(path) != "receivewal.daemon.state"]
    assert reading == ["receivewal.walreceiver.receiver"]


LOCATION_DOOR = "receivewal.archive.location"
_STRING_TESTS = {"startswith", "endswith", "removeprefix", "partition", "find", "index", "split"}


def _names_a_scheme(node: ast.expr) -> bool:
    """Whether ``node`` is the object store's scheme or a URI's (a string with ``://``, a
    tuple holding one, or a name SCHEME)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and "://" in node.value
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_scheme(element) for element in node.elts)
    return (node.id if isinstance(node, ast.Name) else
            node.attr if isinstance(node, ast.Attribute) else "") == "SCHEME"


def bucket_url_tests(path: Path) -> list[str]:
    """Where ``path`` spells the object store's scheme itself (``"s3://"`` alone) or tests
    whether a text is a bucket's URL or a URI (a ``startswith``, a comparison or an ``in``
    with a string holding ``://``, or with SCHEME)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and node.value in {"s3://", "s3:"}:
            found.append(f"{module_name(path)}:{node.lineno}: spells {node.value!r}")
            continue
        tested = [*node.args] if isinstance(node, ast.Call) and isinstance(
            node.func, ast.Attribute) and node.func.attr in _STRING_TESTS else \
            [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
        if any(map(_names_a_scheme, tested)):
            found.append(f"{module_name(path)}: {ast.unparse(node)}")
    return found


def test_only_the_location_door_tells_a_bucket_from_a_directory() -> None:
    """One door to where the archive lives: archive/location.py alone spells ``s3://`` and
    tests whether the user's text names a bucket (or another URI); every other module asks it
    (``locate``, ``is_bucket_url``), so that no command decides it its own way."""
    assert bucket_url_tests(module_path(LOCATION_DOOR))  # the check sees the door's own
    elsewhere = [found for path in sorted(PACKAGE.rglob("*.py"))
                 if module_name(path) != LOCATION_DOOR for found in bucket_url_tests(path)]
    assert elsewhere == []
