"""``./scripts/demo`` installs only what the demo runs and says what it installs (issue 35 item
11): on a machine that lacks rsync, age, pglogical and the rest of what the test suite uses,
the demo's plan (``RECEIVEWAL_SETUP_PLAN=1``: said, nothing installed) names none of them and
receivewal without extras, while ``scripts/test``'s plan names them, each with what it is for."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).parent.parent
#: What setup.sh runs besides bash's builtins; everything else looks missing.
TOOLS = ("bash", "ls", "sort", "tail", "basename", "dirname", "id", "cat")
SUITE_ONLY = ("rsync", "age", "pglogical", "default-jre-headless", "e2fsprogs")


def _fresh_environment() -> dict[str, str]:
    """This process's environment without the RECEIVEWAL_* variables ``scripts/test`` exports
    (its extras, whether it needs Java): the plan is a fresh shell's."""
    return {name: value for name, value in os.environ.items()
            if not name.startswith("RECEIVEWAL_")}


def plan(tmp_path: Path, *argv: str, **env: str) -> str:
    """What setup.sh would install, run with only :data:`TOOLS` on PATH."""
    tools = tmp_path / "bin"
    tools.mkdir(exist_ok=True)
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found is not None, tool
        if not (tools / tool).exists():
            (tools / tool).symlink_to(found)
    done = subprocess.run(list(argv), cwd=tmp_path, capture_output=True, text=True,
                          check=False, timeout=60,
                          env={**_fresh_environment(), "PATH": str(tools),
                               "RECEIVEWAL_SETUP_PLAN": "1", **env})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_demo_installs_only_what_it_runs(tmp_path: Path) -> None:
    said = plan(tmp_path, "bash", str(ROOT / "scripts" / "demo"))
    lines = said.splitlines()
    assert lines[0].startswith("setup (demo): apt-get would install: "), said
    for package in SUITE_ONLY:
        assert package not in said, said
    assert lines[-1].startswith("setup (demo): pip would install into "), said
    assert lines[-1].endswith(": receivewal and its dependencies"), said


def test_the_suites_setup_names_each_package_and_what_it_is_for(tmp_path: Path) -> None:
    said = plan(tmp_path, "bash", "-c", f"source {ROOT / 'scripts' / 'setup.sh'}",
                RECEIVEWAL_EXTRAS="test,s3", RECEIVEWAL_NEEDS_JAVA="1")
    first = said.splitlines()[0]
    for package in ("rsync", "age", "default-jre-headless"):
        assert package in first, said
    assert "  rsync: barman recover, in tests/test_barman.py" in said.splitlines(), said
    assert said.splitlines()[-1].endswith(": receivewal[test,s3] and its dependencies"), said


def test_the_readme_says_how_long_the_suite_takes_and_what_it_changes_on_the_host() -> None:
    """The quick start gives the suite's time on a 2-core machine (one number, dated) and
    what the tests do to the host as root: the .deb installed and removed, the group, the
    private systemd."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert re.search(r"about \*\*\d+ minutes\*\* on a 2-core machine \(`scripts/test`, 3 worker "
                     r"processes; \d{4}-\d\d-\d\d\)", readme), "the suite's duration"
    for words in ("installs it with `dpkg -i`", "removes it with `apt-get remove`",
                  "adds the `postgres` user to that `receivewal` group",
                  "under a private systemd", "says what it installs"):
        assert words in readme, words
