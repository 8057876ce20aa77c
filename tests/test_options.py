"""Each declared option of ``receivewal stream`` (and of the pg_receivewal drop-in, where
pg_receivewal has it) is accepted in every spelling, reaches the Settings field the table names,
and works from its RECEIVEWAL_* variable. Walks the declaration table, so an option added to it
is covered here without a new test. No server: the command lines are parsed, not run."""

from __future__ import annotations

import os
import pty
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

import pytest

from receivewal.commands import options
from receivewal.commands.cli import cli
from receivewal.commands.options import (
    OptionSpec,
    StreamOptions,
    build_settings,
    declared_options,
    options_from,
)
from receivewal.commands.pg_receivewal import HELP, parse_args
from receivewal.commands.stream import stream_command
from receivewal.daemon.settings import Settings

OPTIONS = {f.name: (spec, kind, f.default) for f, spec, kind in declared_options()}
DROPIN = [name for name, (spec, _, _) in OPTIONS.items() if spec.pg_receivewal]
WITH_ENV = [name for name, (spec, _, _) in OPTIONS.items() if spec.env_var]
PROMPT_ANSWER = "probe-password-71"


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No RECEIVEWAL_* variable set, and -W's prompt answered."""
    for name in [name for name in os.environ if name.startswith("RECEIVEWAL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(options, "read_password", lambda: PROMPT_ANSWER)
    return monkeypatch


@contextmanager
def terminal_stderr() -> Iterator[None]:
    """stderr a real terminal, for the test's body (--progress acts only on one)."""
    main, tty = pty.openpty()
    try:
        with os.fdopen(tty, "w") as terminal, pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "stderr", terminal)
            yield
    finally:
        os.close(main)


def value_of(name: str, tmp_path: Path) -> str | None:
    """A value for the option that differs from its default (None: the option takes none)."""
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
    assert spec.example, f"{name}: a text option needs an example value in its declaration"
    return spec.example


def spellings(name: str, tmp_path: Path, *, dropin: bool = False) -> list[list[str]]:
    """The option in each of its spellings, with a value unlike its default (an on/off pair
    in the spelling that changes the default)."""
    spec, _, default = OPTIONS[name]
    value = value_of(name, tmp_path)
    if "/" in spec.long:
        on, off = spec.long.split("/")
        return [[off if default else on]]
    if value is None:
        return [[n] for n in spec.names]
    argvs = [[n, value] for n in spec.names]
    if dropin:
        argvs.append([f"{spec.long}={value}"])
    return argvs


def base_argv(tmp_path: Path, spec: OptionSpec, *, alone: bool = False) -> list[str]:
    """A command line that stands alone (a directory, a slot), plus what the option is refused
    without; ``alone``: without the option itself."""
    base = [("-D", str(tmp_path)), ("-S", "base_slot")]
    return [arg for pair in base if not (alone and pair[0] in spec.names)
            for arg in pair] + list(spec.goes_with)


def stream_options(argv: list[str]) -> StreamOptions:
    """What ``receivewal stream ARGV`` parses (click, with the environment) before it runs
    (with the group's settings: click keeps the first help option it makes)."""
    context = stream_command.make_context("stream", list(argv), **cli.context_settings)
    return options_from(context.params)


def check_reached(name: str, plain: StreamOptions, given: StreamOptions) -> None:
    """The option changed its Settings field (or, for an option of the command itself, its
    parsed field)."""
    spec = OPTIONS[name][0]
    if spec.setting is None:
        assert getattr(given, name) != getattr(plain, name)
        return
    assert spec.setting in {f.name for f in fields(Settings)}, \
        f"{spec.long} names Settings.{spec.setting}, which does not exist"
    before = getattr(build_settings(plain), spec.setting)
    after = getattr(build_settings(given), spec.setting)
    assert after != before, f"{spec.long} did not reach Settings.{spec.setting}"


@pytest.mark.parametrize("name", list(OPTIONS))
def test_stream_takes_each_option_to_its_settings_field(
        name: str, tmp_path: Path, world: pytest.MonkeyPatch) -> None:
    """``receivewal stream`` accepts the option in each spelling and it changes the Settings
    field its declaration names."""
    spec = OPTIONS[name][0]
    plain = stream_options(base_argv(tmp_path, spec))
    with terminal_stderr():
        for argv in spellings(name, tmp_path):
            check_reached(name, plain, stream_options(base_argv(tmp_path, spec) + argv))


@pytest.mark.parametrize("name", DROPIN)
def test_dropin_takes_each_pg_receivewal_option_to_its_settings_field(
        name: str, tmp_path: Path, world: pytest.MonkeyPatch) -> None:
    """The drop-in accepts pg_receivewal's options (short, long, --long=value) and each reaches
    the same Settings field as in ``receivewal stream``."""
    spec = OPTIONS[name][0]
    plain, _ = parse_args(base_argv(tmp_path, spec))
    with terminal_stderr():
        for argv in spellings(name, tmp_path, dropin=True):
            check_reached(name, plain, parse_args(base_argv(tmp_path, spec) + argv)[0])


@pytest.mark.parametrize("name", WITH_ENV)
def test_each_environment_variable_works_as_its_option(
        name: str, tmp_path: Path, world: pytest.MonkeyPatch) -> None:
    """RECEIVEWAL_<LONG_OPTION> gives ``receivewal stream`` what the option gives."""
    spec, _, default = OPTIONS[name]
    assert spec.env_var is not None
    argv = spellings(name, tmp_path)[0]
    value = value_of(name, tmp_path)
    base = base_argv(tmp_path, spec, alone=True)
    given = stream_options(base + argv)
    world.setenv(spec.env_var, ("0" if default else "1") if value is None else value)
    assert stream_options(base) == given
    world.delenv(spec.env_var)
    assert stream_options(base) != given


def test_dropin_help_lists_the_declared_pg_receivewal_options() -> None:
    """The drop-in's --help (pg_receivewal's own text) names exactly the options declared as
    pg_receivewal's, besides --help and --version."""
    listed = set(re.findall(r"^ {2}(?:(-\S), )?\s*(--[a-z-]+)", HELP, re.MULTILINE))
    declared = {(OPTIONS[name][0].short or "", OPTIONS[name][0].long) for name in DROPIN}
    assert {(short, long) for short, long in listed} == declared | {("-V", "--version"),
                                                                      ("-?", "--help")}


def test_every_settings_field_is_made_from_the_declarations() -> None:
    """build_settings maps no field by hand: each field of Settings is the one some declared
    option names (the connection string the one several make together)."""
    assert {spec.setting for spec, _, _ in OPTIONS.values()} - {None} == \
        {f.name for f in fields(Settings)}
