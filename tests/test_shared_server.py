"""The tests marked ``shared_server`` share their worker's PostgreSQL (support/sharedserver.py):
none of them may do to it what would change it for the next test. Read from their source: a
marked test never calls, on its ``pg``, a method that stops, restarts, promotes, reconfigures
or copies the server, nor writes its configuration files."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent
#: PgServer's methods that change the server for whoever uses it next
CHANGING = {"stop", "start", "restart", "promote", "init", "configure", "make_standby",
            "base_backup", "recover_from_archive", "start_or_fail"}
#: what a marked test must not send as SQL
CHANGING_SQL = ("ALTER SYSTEM", "PG_RELOAD_CONF", "CREATE ROLE", "CREATE USER")


def marked(function: ast.FunctionDef) -> bool:
    return any(ast.unparse(decorator) == "pytest.mark.shared_server"
               for decorator in function.decorator_list)


def changes_the_server(function: ast.FunctionDef) -> list[str]:
    """What in ``function``'s body would change a shared server."""
    found = []
    for node in ast.walk(function):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "pg"
                and node.func.attr in CHANGING):
            found.append(f"line {node.lineno}: pg.{node.func.attr}()")
        if isinstance(node, ast.Attribute) and node.attr == "datadir" \
                and isinstance(node.value, ast.Name) and node.value.id == "pg":
            found.append(f"line {node.lineno}: pg.datadir")
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [f"line {node.lineno}: {sql}" for sql in CHANGING_SQL
                      if sql in node.value.upper()]
    return found


def marked_tests(source: str) -> list[ast.FunctionDef]:
    return [node for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef) and marked(node)]


def test_no_test_on_the_shared_server_changes_it() -> None:
    problems = [f"{path.name}::{function.name} {what}"
                for path in sorted(TESTS.glob("test_*.py"))
                for function in marked_tests(path.read_text())
                for what in changes_the_server(function)]
    assert problems == []


def test_the_rule_sees_a_stop_and_a_reconfiguration() -> None:
    """The check above is not blind: a marked test that stops its server, or sends ALTER
    SYSTEM, is named."""
    source = '''
@pytest.mark.shared_server
def test_x(pg):
    pg.sql("alter system set work_mem = '1MB'")
    pg.stop("fast")

def test_own(pg):
    pg.stop("fast")
'''
    (function,) = marked_tests(source)
    assert sorted(changes_the_server(function)) == ["line 4: ALTER SYSTEM", "line 5: pg.stop()"]
