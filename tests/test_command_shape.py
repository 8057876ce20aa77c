"""One shape for every command (issue 35 §8): the archive is ``-D`` everywhere (``verify``'s
argument still works), an option reads the same ``RECEIVEWAL_*`` variable in every command
that has it, every help names its variables one way, ``(env NAME)``, and the help says what
the look-alike options mean.

Run through click on the real command group and through the console script's lean path; no
server needed.
"""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from receivewal.commands import catalog, verify_call
from receivewal.commands.cli import LAZY_COMMANDS, cli
from receivewal.commands.cli import main as console_main
from receivewal.commands.plain import Option

#: (command, long option) that read a variable of their own, on purpose: backup's tars are
#: not stream's segments.
OWN_VARIABLES = {("backup", "--compress")}


def _command(name: str) -> click.Command:
    cmd: click.Command | None = cli.get_command(click.Context(cli), name)
    assert cmd is not None
    return cmd


def _options() -> list[tuple[str, click.Option]]:
    return [(name, param) for name in sorted(LAZY_COMMANDS) for param in _command(name).params
            if isinstance(param, click.Option)]


def _variables(param: click.Option) -> list[str]:
    envvar = param.envvar
    return [envvar] if isinstance(envvar, str) else list(envvar or [])


def test_verify_takes_the_archive_with_dash_d_as_every_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``verify -D DIR`` reports what ``verify DIR`` does, on the lean path and through
    click (``--help`` aside, the same command line)."""
    outputs = []
    for args in (["verify", "-D", str(tmp_path)], ["verify", str(tmp_path)],
                 ["verify", "--directory", str(tmp_path), str(tmp_path)]):
        status = console_main(args)
        outputs.append((status, capsys.readouterr().out))
        clicked = CliRunner().invoke(cli, args)
        assert (clicked.exit_code, clicked.output) == outputs[-1]
    assert outputs[0] == outputs[1] == outputs[2]
    assert f"archive {tmp_path}:" in outputs[0][1]
    assert verify_call.parse(["-D", "/srv/wal", "--json"]) == verify_call.Call(
        directory="/srv/wal", as_json=True)


def test_verify_refuses_two_archives_and_none(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """-D and the argument naming two archives is a usage error (2) saying so, as is naming
    none."""
    assert console_main(["verify", "-D", str(tmp_path), str(tmp_path / "other")]) == 2
    assert "name two archives" in capsys.readouterr().err
    assert console_main(["verify", "--json"]) == 2
    assert "give the archive: -D" in capsys.readouterr().err


def test_verify_reads_the_directory_variable_the_argument_wins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """RECEIVEWAL_DIRECTORY names the archive as for every command; an argument wins over it
    (a script's ``verify DIR`` in a shell that has the instance's environment)."""
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setenv("RECEIVEWAL_DIRECTORY", str(tmp_path))
    console_main(["verify"])
    assert f"archive {tmp_path}:" in capsys.readouterr().out
    console_main(["verify", str(other)])
    assert f"archive {other}:" in capsys.readouterr().out
    assert f"archive {other}:" in CliRunner().invoke(cli, ["verify", str(other)]).output


def test_an_option_reads_the_same_variable_in_every_command() -> None:
    """Each option of the catalog that has a variable reads it in every command that takes
    the option (a command may read one of its own first, as backup's -D)."""
    rows = {name: row for row in vars(catalog).values()
            if isinstance(row, Option) and row.env
            for name in row.names if name.startswith("--")}
    differ = [(command, long, row.env, _variables(param))
              for command, param in _options()
              for long in param.opts if (row := rows.get(long)) is not None
              and (command, long) not in OWN_VARIABLES and row.env not in _variables(param)]
    assert differ == []


def test_every_help_names_its_variables_one_way() -> None:
    """Every option that reads a variable names it in its help as ``env NAME`` (``(env
    NAME)``, or inside a parenthesis it already has), in every command."""
    unnamed = [(command, param.opts[-1], variable) for command, param in _options()
               for variable in _variables(param) if f"env {variable}" not in (param.help or "")]
    assert unnamed == []


def test_stream_says_which_compression_is_which() -> None:
    """stream's -Z/--compress is the files at rest, --compression the stream on the wire;
    each help names the other."""
    params = {p.name: p for p in _command("stream").params if isinstance(p, click.Option)}
    compress, compression = params["compress"].help or "", params["compression"].help or ""
    assert compress.startswith("At rest:")
    assert "--compression" in compress
    assert compression.startswith("On the wire:")
    assert "--compress" in compression


def test_cleanup_help_says_its_short_options_are_pg_archivecleanups() -> None:
    """cleanup's -d and -n are pg_archivecleanup's, and its help says so."""
    text = " ".join(CliRunner().invoke(cli, ["cleanup", "--help"]).output.split())
    assert "-d is its debug output and -n its dry run" in text
