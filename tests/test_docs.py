"""README.md and docs/: the README is the newcomer's page and links the rest; links resolve, and
the options that the quoted commands use exist."""

from __future__ import annotations

import ast
import itertools
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
COMMANDS = ("stream", "logical", "status", "restore", "verify", "analyze", "relay", "backup",
            "recover")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
#: The rounds' notebook quotes its commands as they were run that day (some with tools of the
#: development machine); the commands to run today are on docs/benchmarks.md.
HISTORY = ROOT / "docs" / "benchmarks-history.md"
BENCH_COMMAND = re.compile(r"(?:^|\s)(\S*python\S*) bench/(\w+)\.py\b([^#]*)")
SCRIPT = re.compile(r"(?<![\w/.-])(?:\./|bash )?(scripts/[\w-]+(?:\.sh)?)")


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(path: Path) -> set[str]:
    return {anchor(line.lstrip("#")) for line in prose_lines(path) if line.startswith("#")}


def prose_lines(path: Path) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def code_lines(path: Path) -> list[str]:
    """The lines of fenced and indented code blocks and of inline code spans, with shell
    continuations joined."""
    lines, fenced, joined = [], False, ""
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            joined += line.rstrip("\\")
            if not line.endswith("\\"):
                lines.append(joined)
                joined = ""
        else:
            lines.extend(re.findall(r"`([^`]+)`", line))
    return lines


@cache
def help_text(command: str) -> str:
    return subprocess.run([sys.executable, "-m", "receivewal", command, "--help"],
                          capture_output=True, text=True, check=True, timeout=60).stdout


def test_readme_quick_start_is_the_two_commands() -> None:
    """The quick start is two commands, each doing its own setup: the demo and the tests."""
    text = README.read_text()
    block = text.split("## Quick start", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    assert [line.split()[0] for line in block.splitlines()] == ["./scripts/demo", "./scripts/test"]


def test_readme_links_every_page_of_docs() -> None:
    """Every page under docs/ is reachable from the README, the fault table among them."""
    linked = {target.split("#")[0] for target in LINK.findall(README.read_text())}
    assert "docs/faults.md" in linked
    assert {f"docs/{page.name}" for page in PAGES} <= linked


def test_every_link_between_readme_and_docs_resolves() -> None:
    """A relative link names a file that exists, and its #anchor a heading of that file."""
    broken = []
    for page in [README, *PAGES]:
        for target in LINK.findall("\n".join(prose_lines(page))):
            if re.match(r"[a-z]+:", target):
                continue  # an absolute URL
            name, _, fragment = target.partition("#")
            path = (page.parent / name).resolve() if name else page
            if not path.exists() or (fragment and fragment not in headings(path)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_options_of_quoted_commands_exist() -> None:
    """Every --option written after `receivewal COMMAND` in the README and docs is one that
    `receivewal COMMAND --help` lists."""
    unknown, quoted = [], 0
    for page in [README, *PAGES]:
        for line in code_lines(page):
            for command, rest in re.findall(rf"receivewal ({'|'.join(COMMANDS)})\b([^#]*)", line):
                for option in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest):
                    quoted += 1
                    if option not in help_text(command):
                        unknown.append(f"{page.relative_to(ROOT)}: receivewal {command} {option}")
    assert quoted > 20
    assert unknown == []


@cache
def bench_help(name: str) -> str:
    return subprocess.run([sys.executable, str(ROOT / "bench" / f"{name}.py"), "--help"],
                          capture_output=True, text=True, check=True, timeout=120).stdout


@cache
def bench_modes(name: str) -> tuple[str, ...]:
    """The MODES a benchmark script declares (read from its source: () when it has none)."""
    tree = ast.parse((ROOT / "bench" / f"{name}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["MODES"]:
            modes = ast.literal_eval(node.value)
            assert isinstance(modes, tuple)
            return modes
    return ()


def test_quoted_benchmark_commands_run_as_written() -> None:
    """Every benchmark command the README and docs quote (the rounds' notebook aside) runs as
    written from a clean clone once scripts/setup.sh has made .venv: .venv/bin/python runs a
    script of bench/, every --option given is one its --help lists, every --modes value one
    of its modes."""
    wrong, quoted = [], 0
    for page in [README, *PAGES]:
        if page == HISTORY:
            continue
        for line in code_lines(page):
            for python, name, rest in BENCH_COMMAND.findall(line):
                quoted += 1
                where = f"{page.relative_to(ROOT)}: bench/{name}.py"
                if python != ".venv/bin/python" or not (ROOT / "bench" / f"{name}.py").exists():
                    wrong.append(f"{where}: run by {python}")
                    continue
                words = shlex.split(rest)
                for option in (w.split("=")[0] for w in words if w.startswith("--")):
                    if option not in bench_help(name):
                        wrong.append(f"{where} {option}")
                for flag, value in itertools.pairwise(words):
                    if flag == "--modes":
                        wrong.extend(f"{where}: mode {mode!r}" for mode in value.split(",")
                                     if mode not in bench_modes(name))
    assert quoted >= 10
    assert wrong == []


def test_quoted_scripts_exist() -> None:
    """Every scripts/ command the README and docs quote is a file of scripts/."""
    quoted = {name for page in [README, *PAGES] for line in code_lines(page)
              for name in SCRIPT.findall(line)}
    assert "scripts/setup.sh" in quoted
    assert sorted(name for name in quoted if not (ROOT / name).is_file()) == []


#: The pages for developers; every other page, and the README, is for users.
DEVELOPER_PAGES = {"architecture.md", "faults.md"}
#: What a developer's note looks like in a user's page: an issue's number or section, a module
#: of the package by its dotted name or its path.
DEVELOPER_NOTE = re.compile(
    r"\b[Ii]ssue \d+|§|(?<![/\w-])receivewal[./](?:archive|backup|commands|daemon|wal|restore|check"
    r"|logical|relay|replication)[./]"
    r"|`(?:archive|backup|commands|daemon|wal|restore|check|logical|relay|replication)/[a-z_]+")


def test_user_docs_speak_of_commands_and_files_only() -> None:
    """README.md and the user's pages of docs/ name no issue and no module of the package
    (docs/architecture.md and docs/faults.md, for developers, do)."""
    found = [f"{page.relative_to(ROOT)}:{number}: {match.group(0)}"
             for page in [README, *PAGES] if page.name not in DEVELOPER_PAGES
             for number, line in enumerate(page.read_text().splitlines(), 1)
             for match in DEVELOPER_NOTE.finditer(line)]
    assert found == []
