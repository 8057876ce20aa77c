"""pg_receivewal-streampack installed as pg_receivewal: the same command line, messages, exit
codes and files as pg_receivewal 15, checked against the real program side by side."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from barman.command_wrappers import PgReceiveXlog
from support.dropin import PG_RECEIVEWAL, install_dropin
from support.servers import PgServer
from support.streams import wait_for

from receivewal.archive.syncer import HOLD_ENV
from receivewal.commands.options import StreamOptions, build_settings
from receivewal.commands.pg_receivewal import parse_args
from receivewal.wal.lsn import parse_lsn
from receivewal.wal.names import wal_file_name

SEG = 16 << 20


@pytest.fixture
def dropin(tmp_path: Path) -> Path:
    """The drop-in as ``pg_receivewal`` in a directory of its own."""
    return install_dropin(tmp_path / "bin")


def run(program: Path | str, *args: str, env: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(program), *args], capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, **(env or {})})


def normalised(done: subprocess.CompletedProcess[str], program: Path | str) -> tuple[int, str]:
    """Exit code and stderr with the program's path (glibc's prefix) made neutral."""
    return done.returncode, done.stderr.replace(str(program), "ARGV0")


def own_directory(args: list[str], tmp_path: Path) -> list[str]:
    """The command line with ``/tmp`` (as written in the cases) replaced by an empty directory
    of the test's own: what the drop-in leaves there (state, lock) never reaches another test."""
    directory = tmp_path / "archive"
    directory.mkdir()
    return [str(directory) if arg == "/tmp" else arg for arg in args]


# Command lines pg_receivewal refuses before it connects: the same words, the same exit code.
REFUSED = [
    [], ["-D", "/tmp", "extra"], ["--create-slot"], ["--drop-slot"],
    ["-S", "x", "--create-slot", "--drop-slot"], ["-D", "/tmp", "-s", "-1"],
    ["-D", "/tmp", "-s", "abc"], ["-D", "/tmp", "-s", "3000000"], ["-D", "/tmp", "-E", "foo"],
    ["-D", "/tmp", "--synchronous", "--no-sync"], ["--bogus"], ["-D", "/tmp", "-x"],
    ["-D", "/tmp", "-V"], ["-D"], ["--directory"], ["--d", "/tmp"], ["--no-loop=3"],
    ["--vers"], ["--ver"], ["--he"], ["--version=1"], ["--no"], ["--z"],
    ["-D", "/nonexistent-dir"], ["-D", "/nonexistent-dir", "-Z", "foo"],
    ["-D", "/tmp", "-Z", "gzip:10"], ["-D", "/tmp", "-Z", "lz4:level=x"],
    ["-D", "/tmp", "-Z", "none:1"], ["-D", "/tmp", "-nv", "-Zgzip:workers=2"],
    ["-D", "/tmp", "-p", "abc"], ["-D", "/tmp", "-d", "bogus=1"], ["-D", "/tmp", "--", "x"],
]


@pytest.mark.parametrize("args", REFUSED, ids=lambda a: " ".join(a) or "(none)")
def test_refuses_what_pg_receivewal_refuses_in_its_words(dropin: Path, args: list[str],
                                                          tmp_path: Path) -> None:
    """Usage errors: stderr and exit code equal pg_receivewal 15's."""
    args = own_directory(args, tmp_path)
    theirs = normalised(run(PG_RECEIVEWAL, *args), PG_RECEIVEWAL)
    ours = normalised(run(dropin, *args), dropin)
    assert theirs[0] == 1
    assert ours == theirs


@pytest.mark.parametrize("args", [["-D", "/tmp", "-d", "host=/nonexistent"],
                                  ["-S", "s", "--create-slot", "-d", "host=/nonexistent"],
                                  ["-D", "/tmp", "-s", " 7 ", "-E", "0/1x", "-Z", "5",
                                   "-d", "host=/nonexistent", "-n"]])
def test_connection_failure_is_reported_as_pg_receivewal_does(dropin: Path, args: list[str],
                                                              tmp_path: Path) -> None:
    """Accepted options, then no server: one error line with libpq's message, exit 1."""
    args = own_directory(args, tmp_path)
    theirs = run(PG_RECEIVEWAL, *args)
    ours = run(dropin, *args)
    assert ours.returncode == theirs.returncode == 1
    assert ours.stderr.startswith("pg_receivewal: error: connection to server on socket "
                                  '"/nonexistent/.s.PGSQL.5432" failed: No such file')
    assert theirs.stderr.split("\n")[0] in ours.stderr


def test_a_forced_password_prompt_at_the_end_of_input_is_an_empty_password(
        dropin: Path, tmp_path: Path) -> None:
    """-W with standard input at its end and no terminal (a script, a unit): pg_receivewal's
    prompt reads an empty password and goes on to connect; so does the drop-in, and its one
    error line is pg_receivewal's (before: a getpass traceback, exit 1)."""
    args = own_directory(["-D", "/tmp", "-W", "-d", "host=/nonexistent"], tmp_path)
    done = [subprocess.run([str(p), *args], capture_output=True, text=True, timeout=120,
                           check=False, stdin=subprocess.DEVNULL, start_new_session=True)
            for p in (PG_RECEIVEWAL, dropin)]
    theirs, ours = done
    assert ours.returncode == theirs.returncode == 1
    assert "Traceback" not in ours.stderr
    error = next(line for line in theirs.stderr.splitlines() if "error:" in line)
    assert error.split("error: ", 1)[1] in ours.stderr


def test_help_and_version_only_as_first_argument(dropin: Path) -> None:
    """-?/--help and -V/--version act as pg_receivewal's do (first argument only)."""
    for flag in ("-?", "--help"):
        ours, theirs = run(dropin, flag), run(PG_RECEIVEWAL, flag)
        assert ours.returncode == theirs.returncode == 0
        their_options = [ln.split()[0] for ln in theirs.stdout.splitlines()
                         if ln.startswith("  -")]
        assert [ln.split()[0] for ln in ours.stdout.splitlines()
                if ln.startswith("  -")] == their_options
    for flag in ("-V", "--version"):
        done = run(dropin, flag, "ignored")
        assert done.returncode == 0
        assert done.stdout == "pg_receivewal (PostgreSQL) 15.18 (receivewal 0.1.0 with " \
            "pg_streampack)\n"


def test_version_satisfies_barmans_parser(dropin: Path) -> None:
    """Barman finds the drop-in in path_prefix and reads it as pg_receivewal 15.18."""
    info = PgReceiveXlog.get_version_info(str(dropin.parent))
    assert info["full_path"] == str(dropin)
    assert str(info["full_version"]) == "15.18"
    assert str(info["major_version"]) == "15"


def options(args: list[str]) -> StreamOptions:
    """The options the drop-in reads from ``args``."""
    return parse_args(args)[0]


def test_options_become_the_settings_receivewal_stream_builds(tmp_path: Path) -> None:
    """Long and short spellings, abbreviations and -Z map onto Settings; streampack is asked
    for by default and RECEIVEWAL_COMPRESSION=none turns it off."""
    short = build_settings(options(["-D", str(tmp_path), "-d", "host=h", "-p", "5433",
                                    "-U", "u", "-S", "slot1", "-s", "3", "-E", "1/2",
                                    "-n", "-v", "-v", "-w", "-Z", "lz4:5", "--synchronous"]))
    long = build_settings(options([f"--dir={tmp_path}", "--dbname=host=h", "--port=5433",
                                   "--user", "u", "--slot=slot1", "--status-int=3",
                                   "--endpos=0x1/0x2", "--no-loop", "--verb", "--verbose",
                                   "--no-password", "--compress=lz4:level=5",
                                   "--synchronous"]))
    assert short == long
    assert short.slot == "slot1"
    assert short.status_interval == 3.0
    assert short.endpos == (1 << 32) | 2
    assert short.no_loop
    assert short.synchronous
    assert options(["-D", str(tmp_path), "-v", "--verb"]).verbose == 2
    assert short.at_rest.method == "lz4"
    assert short.at_rest.level == 5
    assert short.compression == ("zstd", "lz4")
    assert "pg_streampack.requested=zstd,lz4" in short.conninfo
    assert short.reconnect_delay == short.reconnect_delay_max == 5.0
    os.environ["RECEIVEWAL_COMPRESSION"] = "none"
    try:
        plain = build_settings(options(["-D", str(tmp_path)]))
    finally:
        del os.environ["RECEIVEWAL_COMPRESSION"]
    assert plain.compression == ()
    assert "pg_streampack" not in plain.conninfo
    assert build_settings(options(["-D", str(tmp_path), "-E", "0/0"])).endpos is None


def progress_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines()
            if re.match(r"pg_receivewal: (starting log streaming|finished segment) at ", ln)]


@pytest.mark.shared_server
@pytest.mark.server
def test_same_files_and_progress_lines_as_pg_receivewal(dropin: Path, pg: PgServer,
                                                        tmp_path: Path) -> None:
    """Side by side from two slots made at the same moment: -v prints the same progress lines,
    both exit 0 at --endpos, and the directories hold the same segment files, byte for byte."""
    pg.sql("SELECT pg_create_physical_replication_slot('theirs', true)")
    pg.sql("SELECT pg_create_physical_replication_slot('ours', true)")
    pg.generate_wal(2)
    pg.sql("CREATE TABLE t (x int)")
    pg.sql("INSERT INTO t SELECT generate_series(1, 5000)")
    endpos = pg.endpos_inside_the_wal()
    their_dir, our_dir = tmp_path / "theirs", tmp_path / "ours"
    their_dir.mkdir()
    our_dir.mkdir()
    theirs = run(PG_RECEIVEWAL, "-D", str(their_dir), "-d", pg.dsn, "-S", "theirs",
                 "-E", endpos, "-n", "-v")
    ours = run(dropin, "-D", str(our_dir), "-d", pg.dsn, "-S", "ours", "-E", endpos, "-n",
               "-v")
    assert theirs.returncode == 0, theirs.stderr
    assert ours.returncode == 0, ours.stderr
    assert progress_lines(ours.stderr) == progress_lines(theirs.stderr)
    assert len(progress_lines(ours.stderr)) >= 3
    assert "stopped log streaming at" in ours.stderr
    their_files = sorted(os.listdir(their_dir))
    our_files = sorted(n for n in os.listdir(our_dir) if not n.startswith("."))
    assert our_files == their_files
    for name in their_files:
        if not name.endswith(".partial"):
            assert (our_dir / name).read_bytes() == (their_dir / name).read_bytes(), name
    # quiet without -v, as pg_receivewal is apart from its "not renaming" notice
    quiet = run(dropin, "-D", str(our_dir), "-d", pg.dsn, "-S", "ours", "-E", endpos, "-n")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""


@pytest.mark.shared_server
@pytest.mark.server
def test_slot_actions_and_signals_as_pg_receivewal(dropin: Path, pg: PgServer,
                                                   tmp_path: Path) -> None:
    """--create-slot (--if-not-exists) and --drop-slot act and exit; SIGTERM exits 0; the
    connection shows up as application pg_receivewal, as the real one does."""
    done = run(dropin, "-d", pg.dsn, "-S", "made", "--create-slot", "-v")
    assert done.returncode == 0, done.stderr
    assert done.stderr == 'pg_receivewal: creating replication slot "made"\n'
    assert pg.sql("SELECT slot_type, restart_lsn IS NULL FROM pg_replication_slots "
                  "WHERE slot_name = 'made'") == "physical|t"  # no RESERVE_WAL, as pg's
    again = run(dropin, "-d", pg.dsn, "-S", "made", "--create-slot")
    assert again.returncode == 1
    assert again.stderr.startswith("pg_receivewal: error: ")
    assert 'replication slot "made" already exists' in again.stderr
    assert run(dropin, "-d", pg.dsn, "-S", "made", "--create-slot",
               "--if-not-exists").returncode == 0

    proc = subprocess.Popen([str(dropin), "-D", str(tmp_path), "-d", pg.dsn, "-S", "made",
                             "-v"], stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: pg.sql("SELECT application_name FROM pg_stat_replication")
                 == "pg_receivewal", what="the drop-in to stream")
        # its first status update came back: it is in the receive loop
        wait_for(lambda: pg.sql("SELECT flush_lsn IS NOT NULL FROM pg_stat_replication") == "t",
                 what="the drop-in's first status update")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "pg_receivewal: starting log streaming at " in stderr
    assert stderr.rstrip().endswith("pg_receivewal: received interrupt signal, exiting")

    dropped = run(dropin, "-d", pg.dsn, "-S", "made", "--drop-slot", "-v")
    assert dropped.returncode == 0, dropped.stderr
    assert dropped.stderr == 'pg_receivewal: dropping replication slot "made"\n'
    assert pg.sql("SELECT count(*) FROM pg_replication_slots") == "0"


FINISHED = re.compile(r"pg_receivewal: finished segment at (\S+) \(timeline (\d+)\)")


class FinishedLines:
    """Reads the drop-in's stderr as a script does, and on each "finished segment at X" line
    looks at once for the segment that ends at X, as a script that moves it would."""

    def __init__(self, proc: subprocess.Popen[str], directory: Path) -> None:
        self.directory = directory
        self.seen: list[tuple[str, bool]] = []  # (segment, its file was there)
        self.lines: list[str] = []
        assert proc.stderr is not None
        self._stderr = proc.stderr
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._stderr:
            found = FINISHED.match(line)
            if found is not None:
                end, timeline = parse_lsn(found.group(1)), int(found.group(2))
                name = wal_file_name(timeline, end // SEG - 1, SEG)
                self.seen.append((name, (self.directory / name).is_file()))
            self.lines.append(line)

    def join(self) -> None:
        self._thread.join(timeout=30)


@pytest.mark.server  # a server of its own: a boundary crossed before the hold breaks it
def test_finished_segment_is_printed_once_the_segment_is_there(dropin: Path, pg: PgServer,
                                                               tmp_path: Path) -> None:
    """pg_receivewal prints "finished segment at X" after the segment's close: fsynced and
    renamed, so a script that moves the file on that line finds it. With the disk holding
    every fsync from some point on (the syncer held), a segment whose last byte arrived is
    not finished yet and no line says it is; once the disk lets go, each line comes with its
    file in place."""
    archive = tmp_path / "archive"
    archive.mkdir()
    hold = tmp_path / "hold"
    pg.sql("SELECT pg_create_physical_replication_slot('held', true)")
    proc = subprocess.Popen([str(dropin), "-D", str(archive), "-d", pg.dsn, "-S", "held", "-v",
                             "-s", "1"], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, HOLD_ENV: str(hold)})
    lines = FinishedLines(proc, archive)

    def written() -> int:
        return parse_lsn(pg.sql("SELECT coalesce(write_lsn, '0/0') FROM pg_stat_replication")
                         or "0/0")

    try:
        wait_for(lambda: written() > 0, what="the drop-in's first status update")
        hold.touch()  # from now on the disk holds every fsync
        pg.generate_wal(1)
        switched = parse_lsn(pg.switch_wal())
        # the drop-in reports having written past a segment's end: that segment's last byte
        # arrived, and its completion waits for the held disk
        wait_for(lambda: written() >= switched, what="WAL written past a segment boundary")
        time.sleep(1.0)
        assert lines.seen == [], "finished segment printed before the segment is durable"
        hold.unlink()
        wait_for(lambda: len(lines.seen) >= 2, what="the finished segment lines")
    finally:
        hold.unlink(missing_ok=True)  # a held fsync would keep it from stopping
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        lines.join()
    assert proc.returncode == 0, "".join(lines.lines)
    assert [there for _, there in lines.seen] == [True] * len(lines.seen), lines.seen
