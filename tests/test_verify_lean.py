"""The plain ``receivewal verify`` command line is lean: it runs without click (nor structlog,
psycopg, boto3, or the crc32c package beside the C scanner), and prints the same bytes and exits
with the same status as the click command; ``--help`` and usage errors still come from click.

Archives are made from the committed 1 MiB segment pair in ``tests/data/wal``: intact, damaged,
with a gap, empty, compressed (zstd, gzip, lz4), missing.
"""

from __future__ import annotations

import ast
import gzip
import os
import subprocess
import sys
from pathlib import Path

import lz4.frame
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from test_verify_truth import NAMES, fixture_bytes, write_pair

from receivewal.commands import verify_call
from receivewal.commands.verify import verify_command
from receivewal.wal import nativescan

CLICK_PATH = ("import sys\n"
              "from receivewal.commands.group import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
PROBE = (  # what the command loads beyond the interpreter's start (site, .pth hooks)
    "import sys\n"
    "before = set(sys.modules)\n"
    "from receivewal.commands.cli import main\n"
    "status = main(sys.argv[1:])\n"
    "sys.stdout.write(repr([status, sorted(set(sys.modules) - before)]) + '\\n')\n"
)
HEAVY = ("click", "structlog", "psycopg", "boto3", "botocore")


def make_archives(root: Path) -> dict[str, Path]:
    """The archives both paths are run on, by name."""
    good = write_pair(root / "good")
    damaged = write_pair(root / "damaged")
    data = bytearray((damaged / NAMES[1]).read_bytes())
    data[300_000] ^= 0x40  # inside a record: a CRC mismatch
    (damaged / NAMES[1]).write_bytes(bytes(data))
    gap = write_pair(root / "gap")
    later = f"{NAMES[1][:16]}{int(NAMES[1][16:], 16) + 2:08X}"
    (gap / NAMES[1]).rename(gap / later)
    empty = root / "empty"
    empty.mkdir()
    compressed = root / "compressed"
    compressed.mkdir()
    first, second = (fixture_bytes(name) for name in NAMES)
    (compressed / f"{NAMES[0]}.gz").write_bytes(gzip.compress(first))
    (compressed / f"{NAMES[1]}.lz4").write_bytes(lz4.frame.compress(second))
    zstd = root / "zstd"
    zstd.mkdir()
    for name in NAMES:
        (zstd / f"{name}.zst").write_bytes(
            (Path(__file__).parent / "data" / "wal" / f"{name}.zst").read_bytes())
    return {"good": good, "damaged": damaged, "gap": gap, "empty": empty,
            "compressed": compressed, "zstd": zstd, "missing": root / "missing"}


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_archives(tmp_path_factory.mktemp("lean"))


CASES = [  # (archive, options, exit status)
    ("good", [], 0), ("good", ["-j", "1"], 0), ("good", ["--json"], 0),
    ("good", ["-j2", "--json"], 0), ("good", ["--jobs=2", "--compressibility"], 0),
    ("good", ["--start", "0/600100"], 0), ("good", ["--start=0/9000000"], 1),
    ("damaged", ["-j", "1"], 1),
    ("damaged", ["--json"], 1), ("gap", [], 1), ("gap", ["--json"], 1), ("empty", [], 1),
    ("empty", ["--json"], 1), ("compressed", ["-j", "1"], 0), ("zstd", ["--json"], 0),
    ("missing", [], 1),
]


def run(prefix: list[str], args: list[str], env: dict[str, str] | None = None,
        ) -> tuple[int, str, str]:
    done = subprocess.run([sys.executable, *prefix, "verify", *args], capture_output=True,
                          text=True, check=False, timeout=120, env=env)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize(("archive", "options", "status"), CASES,
                         ids=[f"{a}{''.join(o)}" for a, o, _ in CASES])
def test_the_lean_path_prints_and_exits_as_the_click_command(
        archives: dict[str, Path], archive: str, options: list[str], status: int) -> None:
    """``receivewal verify`` (taken by the lean path) and the click command, run on the same
    archive with the same options: the same stdout, stderr and exit status."""
    args = [*options, str(archives[archive])]
    assert verify_call.parse(args) is not None
    lean = run(["-m", "receivewal"], args)
    assert lean == run(["-c", CLICK_PATH], args)
    assert lean[0] == status, lean


def test_both_paths_agree_on_the_pure_python_scanner(archives: dict[str, Path]) -> None:
    """With RECEIVEWAL_PURE_PYTHON set, both paths still print the same report."""
    env = {**os.environ, "RECEIVEWAL_PURE_PYTHON": "1"}
    args = [str(archives["damaged"])]
    lean = run(["-m", "receivewal"], args, env)
    assert "scanner: python" in lean[1]
    assert lean == run(["-c", CLICK_PATH], args, env)


@pytest.mark.parametrize("encoding", ["", "ascii"])
def test_escapes_and_non_ascii_names_print_as_click_prints_them(
        tmp_path: Path, encoding: str) -> None:
    """An archive named with an ANSI escape and a non-ASCII letter: click strips the escape
    off a terminal and re-encodes an ASCII stream as UTF-8; the lean path prints the same."""
    directory = write_pair(tmp_path / "wal-\x1b[31m-\u00e9")
    env = {**os.environ, "PYTHONIOENCODING": encoding}
    lean = run(["-m", "receivewal"], [str(directory)], env)
    assert lean == run(["-c", CLICK_PATH], [str(directory)], env)
    assert lean[0] == 0
    assert "\x1b" not in lean[1]
    assert "wal--\u00e9" in lean[1]


def test_a_closed_output_pipe_keeps_the_verdict_on_both_paths(archives: dict[str, Path]) -> None:
    """Output to a pipe nobody reads: the verdict's exit status (0: recoverable) and nothing on
    stderr (tests/test_verify_exits.py has the rest of what a closed or full output does)."""
    outcomes = []
    for prefix in (["-m", "receivewal"], ["-c", CLICK_PATH]):
        proc = subprocess.Popen([sys.executable, *prefix, "verify", "--json",
                                 str(archives["good"])], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()
        outcomes.append((proc.wait(timeout=120), proc.stderr.read()))
        proc.stderr.close()
    assert outcomes[0] == outcomes[1] == (0, b"")


def loaded_by(*args: str) -> tuple[int, list[str]]:
    """(exit status, modules loaded) of ``receivewal ARGS`` through the console script's entry
    point, in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          check=False, timeout=120)
    status, modules = ast.literal_eval(done.stdout.splitlines()[-1])
    return status, modules


@pytest.mark.parametrize("archive", ["good", "damaged", "compressed"])
def test_verify_imports_no_click_structlog_psycopg_boto3(archives: dict[str, Path],
                                                         archive: str) -> None:
    """The lean path loads none of click, structlog, psycopg, boto3, botocore; with the C
    scanner, not the crc32c package either (the extension computes every CRC)."""
    status, modules = loaded_by("verify", "-j", "1", str(archives[archive]))
    assert status == (0 if archive != "damaged" else 1)
    heavy = {*HEAVY, "crc32c"} if nativescan.load_native() is not None else set(HEAVY)
    assert sorted(m for m in modules if m.split(".")[0] in heavy) == []


def test_a_plain_archive_loads_no_codec_json_or_random(archives: dict[str, Path]) -> None:
    """A plain archive's verify loads no codec (lz4, zstandard, the bounded zstd decoder), no
    json (without --json) and no random (only a retried store error needs it)."""
    status, modules = loaded_by("verify", str(archives["good"]))
    assert status == 0
    unused = {"lz4", "zstandard", "backports", "compression", "json", "random"}
    assert sorted(m for m in modules if m.split(".")[0] in unused) == []


def test_help_and_usage_errors_still_go_through_click(tmp_path: Path) -> None:
    """--help is click's (exit 0), and a command line the lean path does not take is click's
    usage error (exit 2, click's message)."""
    status, modules = loaded_by("verify", "--help")
    assert (status, "click" in modules) == (0, True)
    for args in (["-j", "0", str(tmp_path)], ["--no-such-option", str(tmp_path)], [],
                 [str(tmp_path), str(tmp_path)], ["-j"], ["--start", "not-an-lsn", "x"]):
        assert verify_call.parse(args) is None
        status, modules = loaded_by("verify", *args)
        assert (status, "click" in modules) == (2, True), args


TOKENS = ["--json", "--compressibility", "-j", "--jobs", "-j2", "-j0", "-jx", "--jobs=3",
          "--jobs=", "--jobs=-1", "--start", "--start=0/1", "--start=", "0/1", "--", "-", "",
          "2", "0", "+3", " 4", "dir", "s3://b/p", "--help", "-?", "-x", "--js", "-5",
          "--json=1", "x y"]


@given(st.lists(st.sampled_from(TOKENS), max_size=6))
@example(["-j", "1", "dir"])
@example(["dir", "--start", "0/1", "--json", "--jobs", "2", "--compressibility"])
def test_a_command_line_the_lean_path_takes_means_what_it_means_to_click(
        args: list[str]) -> None:
    """Whenever :func:`verify_call.parse` takes a command line, click parses it without error
    to the same archive and options (and the last of a repeated option wins, as in click)."""
    call = verify_call.parse(args)
    if call is None:
        return
    # as the group makes it: click caches a command's help option from its first context,
    # and a context without the group's help names would lose "-?" for later tests
    ctx = verify_command.make_context("verify", list(args), help_option_names=["-?", "--help"])
    with ctx:
        assert call == verify_call.Call(**ctx.params)


def test_the_usual_command_lines_are_taken_by_the_lean_path() -> None:
    """The forms a user or a script types are read without click."""
    assert verify_call.parse(["/srv/wal"]) == verify_call.Call("/srv/wal")
    assert verify_call.parse(["-j", "4", "--json", "/srv/wal"]) == verify_call.Call(
        "/srv/wal", jobs=4, as_json=True)
    assert verify_call.parse(["/srv/wal", "--start", "0/3000000", "-j1"]) == verify_call.Call(
        "/srv/wal", jobs=1, start="0/3000000")
    assert verify_call.parse(["--compressibility", "--jobs=2", "s3://b/p"]) == \
        verify_call.Call("s3://b/p", jobs=2, compressibility=True)
