"""``receivewal cleanup``'s bad input (issue 28): one line naming what is wrong, exit 2 for a
usage error, as pg_archivecleanup; and the policy settings read from the environment."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from support.streams import receivewal_here

from receivewal.errors import ConfigurationError
from receivewal.retention.plan import KeepBackups, RecoveryWindow
from receivewal.retention.policy import parse_window, policy_from_environment


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "receivewal", "cleanup", *args],
                          capture_output=True, text=True, check=False, timeout=60)


def run_here(*args: str) -> subprocess.CompletedProcess[str]:
    """``receivewal cleanup ARGS`` in this process, for the cases refused before any work
    (support.streams.receivewal_here); test_bad_input_from_a_process_of_its_own is the
    subprocess smoke test of the same exit."""
    return receivewal_here("cleanup", *args)


@pytest.mark.parametrize(("args", "message"), [
    (("-D", "{missing}", "--keep-backups", "1"), 'archive location "{missing}" does not exist'),
    (("{missing}", "000000010000000000000003"), 'archive location "{missing}" does not exist'),
    (("-D", "{dir}"), "give a retention policy: --keep-backups N or --recovery-window D"),
    (("-D", "{dir}", "--keep-backups", "1", "--recovery-window", "3d"),
     "give either --keep-backups or --recovery-window, not both"),
    (("-D", "{dir}", "--recovery-window", "14x"), 'invalid recovery window "14x"'),
    (("-D", "{dir}", "--recovery-window", "-3d"), 'invalid recovery window "-3d"'),
    (("-D", "{dir}", "--keep-backups", "0"), 'invalid number of backups to keep "0"'),
    (("-D", "{dir}", "--keep-backups", "two"), 'invalid number of backups to keep "two"'),
    (("-D", "{dir}", "bogus"), 'invalid file name argument "bogus"'),
    (("-D", "{dir}", "--keep-backups", "1", "000000010000000000000003"),
     "give either a retention policy or OLDESTKEPTWALFILE, not both"),
    (("-D", "{dir}", "-d", "--keep-backups", "1"), "-d and -x go with OLDESTKEPTWALFILE"),
    (("--keep-backups", "1"), "give the archive: -D ARCHIVE"),
    (("-D", "{dir}", "--keep-backups", "1", "--slot", "x; DROP"),
     'replication slot name "x; DROP" is invalid'),
    (("-D", "{dir}", "--keep-backups", "1", "--dbname", "host='unclosed"),
     "invalid connection string"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...],
                                          message: str) -> None:
    (tmp_path / "000000010000000000000001").touch()
    names = {"dir": str(tmp_path), "missing": str(tmp_path / "missing")}
    done = run_here(*(arg.format(**names) for arg in args))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"receivewal: error: {message.format(**names)}")
    assert (tmp_path / "000000010000000000000001").exists()


def test_bad_input_from_a_process_of_its_own(tmp_path: Path) -> None:
    """One of the cases above as the operator meets it, ``python -m receivewal cleanup``: exit
    2, nothing on stdout, one line on stderr (no traceback), nothing removed."""
    (tmp_path / "000000010000000000000001").touch()
    done = run("-D", str(tmp_path), "--recovery-window", "14x")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith('receivewal: error: invalid recovery window "14x"')
    assert (tmp_path / "000000010000000000000001").exists()


def test_an_archive_without_a_backup_loses_nothing(tmp_path: Path) -> None:
    for name in ("000000010000000000000001", "000000010000000000000002"):
        (tmp_path / name).write_bytes(b"")
    done = run("-D", str(tmp_path), "--keep-backups", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "000000010000000000000001 .. 000000010000000000000002 (2 files): kept: no complete "
        "backup: nothing is removed",
        "removed 0 backups and 0 WAL files (0 bytes); kept 0 backups and 2 WAL files"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000000010000000000000001",
                                                          "000000010000000000000002"]


@pytest.mark.parametrize(("text", "length"), [
    ("14d", timedelta(days=14)), ("36h", timedelta(hours=36)), ("2w", timedelta(weeks=2)),
    ("90min", timedelta(minutes=90)), ("30s", timedelta(seconds=30)), ("7", timedelta(days=7)),
])
def test_recovery_windows(text: str, length: timedelta) -> None:
    assert parse_window(text) == length


def test_the_policy_from_the_environment() -> None:
    now = datetime(2026, 6, 1, tzinfo=UTC)
    assert policy_from_environment({}, now) is None
    assert policy_from_environment({"RECEIVEWAL_KEEP_BACKUPS": "3"}, now) == KeepBackups(3)
    assert policy_from_environment({"RECEIVEWAL_RECOVERY_WINDOW": "14d"}, now) == \
        RecoveryWindow(timedelta(days=14), now)
    with pytest.raises(ConfigurationError, match="either RECEIVEWAL_KEEP_BACKUPS or"):
        policy_from_environment({"RECEIVEWAL_KEEP_BACKUPS": "3",
                                 "RECEIVEWAL_RECOVERY_WINDOW": "1d"}, now)
    with pytest.raises(ConfigurationError, match='RECEIVEWAL_RECOVERY_WINDOW: invalid recovery '
                                                 'window "soon"'):
        policy_from_environment({"RECEIVEWAL_RECOVERY_WINDOW": "soon"}, now)


def test_the_backup_commands_retention_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``receivewal backup`` declares with retention_options: the two options, their
    variables, one policy or none, a bad value a usage error."""
    import click  # noqa: PLC0415
    from click.testing import CliRunner  # noqa: PLC0415

    from receivewal.commands.retention_options import (  # noqa: PLC0415
        policy_after_backup,
        retention_options,
    )

    @click.command()
    @retention_options
    def backup(keep_backups: str | None, recovery_window: str | None) -> None:
        click.echo(repr(policy_after_backup(keep_backups, recovery_window)))

    runner = CliRunner()
    assert runner.invoke(backup, []).output == "None\n"
    assert runner.invoke(backup, ["--keep-backups", "2"]).output == "KeepBackups(count=2)\n"
    window = runner.invoke(backup, [], env={"RECEIVEWAL_RECOVERY_WINDOW": "2d"}).output
    assert window.startswith("RecoveryWindow(length=datetime.timedelta(days=2)")
    both = runner.invoke(backup, ["--keep-backups", "2"], env={"RECEIVEWAL_RECOVERY_WINDOW": "2d"})
    assert both.exit_code == 2
    assert "give either --keep-backups or --recovery-window, not both" in both.output


def test_an_unreadable_state_file_stops_the_cleanup(tmp_path: Path) -> None:
    """What the daemon's slot holds cannot be known: nothing is removed, one line says why."""
    (tmp_path / "000000010000000000000001").write_bytes(b"")
    (tmp_path / ".receivewal-state.json").write_text("{not json")
    done = run("-D", str(tmp_path), "--keep-backups", "1")
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"receivewal: error: {tmp_path / '.receivewal-state.json'}: "
                                  "invalid state file")
    assert (tmp_path / "000000010000000000000001").exists()


IDENTITY = ('{"system_identifier": "7000000000000000001", "wal_segment_size": 16777216, '
            '"timeline": 1}\n')
CHANGE_LOG = ("00000000016B3A28.jsonl", "00000000016C0000.jsonl.partial", ".sealed-through")


@pytest.mark.parametrize("form", [("--keep-backups", "1"), ("000000010000000000000003",)])
@pytest.mark.parametrize(("files", "what"), [
    ((), "holds neither the archive's identity file (.receivewal-archive.json) nor WAL files"),
    (("notes.txt",),
     "holds neither the archive's identity file (.receivewal-archive.json) nor WAL files"),
    (CHANGE_LOG, "is a logical change log directory; a change log's retention is the "
                 "daemon's: receivewal logical --upload-to s3://BUCKET/PREFIX --keep-local "
                 "AGE|SIZE"),
])
def test_a_directory_that_is_no_wal_archive_is_refused(tmp_path: Path, form: tuple[str, ...],
                                                       files: tuple[str, ...],
                                                       what: str) -> None:
    """Issue 35 item 5: cleanup of a directory that holds no WAL archive (a change log's, an
    empty one, anything else) says so in one line and exits 2 instead of doing nothing."""
    for name in files:
        (tmp_path / name).write_text("x\n")
    done = run_here("-D", str(tmp_path), *form)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (f'receivewal: error: "{tmp_path}" is not a WAL archive: it {what}\n')
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)


@pytest.mark.parametrize("form", [("--keep-backups", "1"), ("000000010000000000000003",)])
def test_a_new_archive_with_only_its_identity_is_cleaned_as_before(
        tmp_path: Path, form: tuple[str, ...]) -> None:
    """An archive stream has just created (its identity file, no segment yet) is one: cleanup
    removes nothing and exits 0, in both forms."""
    (tmp_path / ".receivewal-archive.json").write_text(IDENTITY)
    done = run("-D", str(tmp_path), *form)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in tmp_path.iterdir()] == [".receivewal-archive.json"]


def test_pg_archivecleanups_form_on_segments_without_an_identity_file(tmp_path: Path) -> None:
    """A directory of WAL segments that no receivewal wrote (archive_command's) is still
    cleaned as pg_archivecleanup cleans it."""
    for name in ("000000010000000000000001", "000000010000000000000002.gz",
                 "000000010000000000000003", "00000002.history"):
        (tmp_path / name).write_bytes(b"")
    done = run("-D", str(tmp_path), "000000010000000000000003")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000000010000000000000003",
                                                          "00000002.history"]
