"""README.md and docs/: the README is the newcomer's page and links the rest; links resolve, and
the options that the quoted commands use exist."""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
COMMANDS = ("stream", "status", "restore", "verify", "analyze", "relay")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


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
