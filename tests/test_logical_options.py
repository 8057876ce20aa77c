"""``receivewal logical``'s options, declared once (commands/logical_options.py): each one, on
the command line and from its RECEIVEWAL_* variable, reaches its settings field; the
connection is replication=database with the change log's session settings; what cannot run
is a usage error."""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from receivewal.commands import options
from receivewal.commands.group import cli
from receivewal.commands.logical import logical_command
from receivewal.commands.logical_options import LogicalOptions, build_logical_settings
from receivewal.commands.options import CONNECTION, declared_options, typed_values
from receivewal.errors import ConfigurationError
from receivewal.logicalreceiver.logicalsettings import LogicalSettings

OPTIONS = {f.name: (spec, kind, f.default) for f, spec, kind in declared_options(LogicalOptions)}
# --progress acts only when stderr is a terminal (test_options proves it for the shared code)
REACHING = [name for name, (spec, _, _) in OPTIONS.items()
            if spec.setting is not None and name != "progress"]


@pytest.fixture(autouse=True)
def world(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("RECEIVEWAL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(options, "read_password", lambda: "probe-password")


def parsed(argv: list[str]) -> LogicalOptions:
    context = logical_command.make_context("logical", list(argv), **cli.context_settings)
    return LogicalOptions(**typed_values(LogicalOptions, context.params))


def value_of(name: str, tmp_path: Path) -> str | None:
    spec, kind, default = OPTIONS[name]
    if kind in (bool, int):
        return None
    if kind is Path:
        (tmp_path / "other").mkdir(exist_ok=True)
        return str(tmp_path / "other")
    if kind is float:
        assert isinstance(default, float)
        return str(int(default) + 1)
    if spec.choices:
        return next(choice for choice in spec.choices if choice != default)
    assert spec.example, name
    return spec.example


def reached(settings: LogicalSettings, spec_setting: str) -> Any:
    if spec_setting == CONNECTION:
        return settings.base.conninfo
    own = {f.name for f in fields(LogicalSettings)}
    return getattr(settings, spec_setting) if spec_setting in own \
        else getattr(settings.base, spec_setting)


@pytest.mark.parametrize("name", REACHING)
def test_each_option_reaches_its_settings_field(name: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """On the command line, and from its RECEIVEWAL_* variable when it has one."""
    spec = OPTIONS[name][0]
    assert spec.setting is not None
    # and what the option is refused without (--keep-local: --upload-to), as test_options
    base = ["-D", str(tmp_path), "-S", "base_slot", "-P", "pub", *spec.goes_with]
    plain = build_logical_settings(parsed(base))
    value = value_of(name, tmp_path)
    flag = spec.long.split("/")[0]
    argv = [flag] if value is None else [flag, value]
    given = build_logical_settings(parsed(base + argv))
    assert reached(given, spec.setting) != reached(plain, spec.setting)
    if spec.env_var is not None:  # the command line wins: the option left out of it
        monkeypatch.setenv(spec.env_var, "1" if value is None else value)
        pairs = [base[i:i + 2] for i in range(0, len(base), 2)]
        alone = [arg for pair in pairs if pair[0] not in spec.names for arg in pair]
        from_env = build_logical_settings(parsed(alone))
        assert reached(from_env, spec.setting) == reached(given, spec.setting)


def test_the_connection_is_a_database_one_with_the_session_settings(tmp_path: Path) -> None:
    settings = build_logical_settings(parsed(["-D", str(tmp_path), "-S", "s", "-P", "pub",
                                              "-d", "host=db1 dbname=app", "--compression",
                                              "zstd"]))
    conninfo = settings.base.conninfo
    assert "replication=database" in conninfo
    assert "dbname=app" in conninfo
    for setting in ("client_encoding=UTF8", "TimeZone=UTC", "DateStyle=ISO",
                    "pg_streampack.requested=zstd"):
        assert setting in conninfo
    assert settings.base.hot_standby_feedback is False
    assert settings.base.report_flush


@pytest.mark.parametrize(("argv", "words"), [
    (["-S", "s"], "name at least one publication"),
    (["-P", "pub"], "needs a slot"),
    (["-S", "s", "-P", "pub", "--proto-version", "1", "--streaming", "on"],
     "streaming needs pgoutput protocol version 2"),
    (["-S", "s", "-P", "pub", "--proto-version", "2", "--two-phase"], "two-phase needs"),
    (["-S", "s", "-P", "pub", "-Z", "lz4"], "zstd only"),
    (["-S", "s", "-P", "pub", "--file-size", "12 parsecs"], "invalid --file-size"),
])
def test_what_cannot_run_is_refused_before_connecting(tmp_path: Path, argv: list[str],
                                                     words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        build_logical_settings(parsed(["-D", str(tmp_path), *argv]))


def test_a_usage_error_is_one_line_and_exit_1(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["logical", "-D", str(tmp_path), "-S", "s"],
                                standalone_mode=False)
    assert result.exception is not None
    assert "name at least one publication" in str(result.exception)
