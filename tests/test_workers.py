"""How pytest-xdist shares the suite (tests/support/workers.py): the modules that share a
session fixture with side effects, or a costly one, are in one group, so one worker runs them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support.workers import LONGEST_FIRST, SPLIT_PER_TEST, WORKER_GROUPS, worker_group

TESTS = Path(__file__).parent
#: Session fixtures (tests/conftest.py) and the group of every module that asks for them
#: (``two_archives`` is built once per run for all workers: support.sparkarchives; every
#: worker has its own ``seaweed_server``, which any module may share: no group).
SHARED = {"deb": "deb", "spark": "spark"}


def fixtures_asked_for(module: Path) -> set[str]:
    """The parameter names of the module's functions (tests and fixtures)."""
    tree = ast.parse(module.read_text(), str(module))
    return {arg.arg for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
            for arg in node.args.args}


@pytest.mark.parametrize("module", sorted(TESTS.glob("test_*.py")), ids=lambda p: p.name)
def test_a_module_that_shares_a_session_fixture_is_in_its_group(module: Path) -> None:
    """Modules that ask for the .deb or the Spark session are in that fixture's group."""
    asked = fixtures_asked_for(module) & set(SHARED)
    for name in asked:
        assert worker_group(f"tests/{module.name}::test_x") == SHARED[name], (module.name, name)


def test_every_grouped_module_exists() -> None:
    """WORKER_GROUPS names modules of this suite (a renamed module would leave its group)."""
    assert sorted(name for name in WORKER_GROUPS if not (TESTS / name).is_file()) == []


def test_the_tests_of_one_module_share_a_worker_and_grouped_modules_one_unit() -> None:
    """A module is one unit of work (parameters and all); a group's modules are one unit."""
    assert worker_group("tests/test_restore.py::test_a[c]") == \
        worker_group("tests/test_restore.py::test_b") == "tests/test_restore.py"
    assert worker_group("tests/test_package.py::test_a") == \
        worker_group("tests/test_systemd_real.py::test_b") == "deb"


def test_a_split_module_is_one_unit_per_test() -> None:
    """The tests of a SPLIT_PER_TEST module are units of their own, a test's parameters
    with it; no such module asks for a module-scoped fixture (it would start once per test)."""
    assert worker_group("tests/test_benchmarks.py::test_a") == "tests/test_benchmarks.py::test_a"
    assert worker_group("tests/test_benchmarks.py::test_b[x]") == \
        "tests/test_benchmarks.py::test_b"
    for name in SPLIT_PER_TEST:
        assert "scope=" not in (TESTS / name).read_text(), name


def names_of_tests(module: Path) -> set[str]:
    """The names of the module's test functions."""
    tree = ast.parse(module.read_text(), str(module))
    return {node.name for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_the_longest_units_first_are_units_of_this_suite() -> None:
    """LONGEST_FIRST names groups, modules and tests of split modules that exist (else it
    would order nothing)."""
    units = set(WORKER_GROUPS.values()) | {f"tests/{p.name}" for p in TESTS.glob("test_*.py")}
    units |= {f"tests/{name}::{test}" for name in SPLIT_PER_TEST
              for test in names_of_tests(TESTS / name)}
    assert sorted(set(LONGEST_FIRST) - units) == []
