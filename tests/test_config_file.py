"""An instance's configuration file (issue 35 §9): ``NAME=value`` lines with the environment's
names, read before the command's options through ``--config FILE`` or ``RECEIVEWAL_CONFIG``; an
option given or a variable already set wins; a bad line is refused naming file:line, never its
text (it may hold a password).

Each case runs the console script in a fresh interpreter (the file fills that process's
environment); no server needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def receivewal(*args: str, env: dict[str, str] | None = None,
               ) -> subprocess.CompletedProcess[str]:
    """``receivewal ARGS`` with the test's environment less every RECEIVEWAL_* variable, plus
    ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVEWAL_")}
    return subprocess.run([sys.executable, "-m", "receivewal", *args], capture_output=True,
                          text=True, check=False, timeout=120, env={**base, **(env or {})})


@pytest.fixture
def archives(tmp_path: Path) -> tuple[Path, Path]:
    """Two empty archive directories: the file's and another."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    return tmp_path / "a", tmp_path / "b"


def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "db1.env"
    path.write_text(text)
    return str(path)


def test_the_file_names_what_the_environment_would(tmp_path: Path,
                                                   archives: tuple[Path, Path]) -> None:
    """RECEIVEWAL_DIRECTORY from the file is verify's -D, through --config FILE,
    --config=FILE and RECEIVEWAL_CONFIG, on the lean path and through click (status)."""
    config = _config(tmp_path, f'# db1\n\nRECEIVEWAL_DIRECTORY="{archives[0]}"\n; c\nPGHOST=x\n')
    for args, env in ((["--config", config, "verify"], None),
                      ([f"--config={config}", "verify", "-j", "1"], None),
                      (["verify"], {"RECEIVEWAL_CONFIG": config})):
        done = receivewal(*args, env=env)
        assert str(archives[0]) in done.stdout, (args, done.stderr)
    done = receivewal("--config", config, "status")
    assert f"no state file {archives[0]}" in done.stdout, done.stderr


def test_an_option_or_a_variable_given_wins_over_the_file(
        tmp_path: Path, archives: tuple[Path, Path]) -> None:
    """-D on the command line, or RECEIVEWAL_DIRECTORY already set, beats the file's."""
    config = _config(tmp_path, f"RECEIVEWAL_DIRECTORY={archives[0]}\n")
    done = receivewal("--config", config, "verify", "-D", str(archives[1]))
    assert f"archive {archives[1]}:" in done.stdout, done.stderr
    done = receivewal("--config", config, "verify",
                      env={"RECEIVEWAL_DIRECTORY": str(archives[1])})
    assert f"archive {archives[1]}:" in done.stdout, done.stderr


@pytest.mark.parametrize(("line", "problem"), [
    ("PGPASSWORD hunter2-secret", "not NAME=value"),
    ("PG PASSWORD=hunter2-secret", "not a variable name"),
    ("PGPASSWORD='hunter2-secret", "does not end with its quote"),
])
def test_a_bad_line_is_refused_by_file_and_line_never_echoed(
        tmp_path: Path, line: str, problem: str) -> None:
    """One line naming file:line and what is wrong, no traceback, and never the line's text
    (a password may be in it); exit 2 as a usage error, and 126 for a restore call (never 1:
    PostgreSQL would take it for a file the archive lacks and end recovery there)."""
    config = _config(tmp_path, f"# db1\nRECEIVEWAL_SLOT=s\n{line}\n")
    for args, env, status in ((["--config", config, "verify"], None, 2),
                              (["restore", "x", "y"], {"RECEIVEWAL_CONFIG": config}, 126),
                              (["status"], {"RECEIVEWAL_CONFIG": config}, 2)):
        done = receivewal(*args, env=env)
        assert done.returncode == status, done
        assert done.stderr.startswith(f"receivewal: error: {config}:3: "), done.stderr
        assert problem in done.stderr
        assert len(done.stderr.splitlines()) == 1
        assert "hunter2" not in done.stderr + done.stdout


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    """A configuration file that cannot be read: one line naming it, exit 2."""
    done = receivewal("--config", str(tmp_path / "none.env"), "verify")
    assert (done.returncode, done.stderr) == (
        2, f"receivewal: error: cannot read the configuration file {tmp_path / 'none.env'}: "
        "No such file or directory\n")


def test_quotes_comments_and_the_last_of_a_name(tmp_path: Path) -> None:
    """Quotes are removed, comments and blank lines skipped, a repeated name's last value
    kept, '=' inside a value kept."""
    from receivewal.commands.configfile import read_config  # noqa: PLC0415 - new in issue 35

    config = _config(tmp_path, "A=1\n  # x\n;y\nB = 'two words'\nA=\"3\"\nC=x=y\nD=\n")
    assert read_config(config) == {"A": "3", "B": "two words", "C": "x=y", "D": ""}
