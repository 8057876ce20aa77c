"""Rules of a module's shape that the source states: a module over 500 lines says why on its
first line, and the ``TYPE_CHECKING = False`` spelling (which keeps ``typing`` unloaded) is
used only on restore's lean path, where it gains a call ~10 ms. No server needed."""

from __future__ import annotations

from pathlib import Path

from receivewal import restore

PACKAGE = Path(__file__).resolve().parent.parent / "receivewal"
LIMIT = 500
REASON = "# Over 500 lines: "


def _modules() -> dict[str, list[str]]:
    return {str(path.relative_to(PACKAGE.parent)): path.read_text().splitlines()
            for path in sorted(PACKAGE.rglob("*.py"))}


def _module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def test_a_long_module_says_why_on_its_first_line() -> None:
    """Over 500 lines, a module's first line is ``# Over 500 lines: <why>``."""
    silent = [path for path, lines in _modules().items()
              if len(lines) > LIMIT
              and not (lines[0].startswith(REASON) and len(lines[0]) > len(REASON) + 10)]
    assert silent == []


def test_type_checking_false_only_on_the_lean_path() -> None:
    """``TYPE_CHECKING = False`` is written only in modules of restore's lean path; elsewhere
    ``typing`` is loaded anyway and ``from typing import TYPE_CHECKING`` says the same."""
    tricked = {_module_name(path) for path, lines in _modules().items()
               if any(line.startswith("TYPE_CHECKING = False") for line in lines)}
    assert tricked
    assert tricked <= restore.LEAN
