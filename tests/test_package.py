"""The Debian package from scripts/build-deb: installed, used by a real recovery, removed.

Installing a package changes the machine, so this runs only as root (as CI does) and only where
dpkg and apt-get exist; it refuses to run over a receivewal package that is already installed.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.servers import IS_ROOT, PgServer, make_shared_dir
from support.streams import lsn_to_int, wait_for
from support.systemd import parse_unit

ROOT = Path(__file__).parent.parent
INSTALLED = ["/opt/receivewal", "/usr/bin/receivewal", "/usr/bin/pg_receivewal-streampack",
             "/lib/systemd/system/receivewal@.service",
             "/lib/systemd/system/receivewal-backup@.service",
             "/lib/systemd/system/receivewal-backup@.timer",
             "/lib/systemd/system/receivewal-apply@.service",
             "/usr/share/doc/receivewal/receivewal.env.example",
             "/usr/share/bash-completion/completions/receivewal",
             "/usr/share/zsh/vendor-completions/_receivewal",
             "/usr/share/fish/vendor_completions.d/receivewal.fish"]

pytestmark = [
    pytest.mark.server,
    pytest.mark.slow,
    pytest.mark.skipif(not IS_ROOT, reason="installing a package needs root"),
    pytest.mark.skipif(shutil.which("dpkg-deb") is None or shutil.which("apt-get") is None,
                       reason="needs dpkg-deb and apt-get (a Debian system)"),
]


def run(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run a command, failing with its output when it exits non-zero."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout,
                          env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stdout}{done.stderr}"
    return done


def package_status() -> str:
    """dpkg's status of the receivewal package ("" when dpkg never heard of it)."""
    return subprocess.run(["dpkg-query", "-W", "-f=${Status}", "receivewal"],
                          capture_output=True, text=True, check=False).stdout


@pytest.fixture(scope="module")
def installed(deb: Path) -> Iterator[Path]:
    """Build the package, dpkg -i it; afterwards apt-get remove it, checking that it went."""
    if package_status().startswith("install ok"):
        pytest.fail("a receivewal package is already installed on this machine; this test "
                    "installs and removes its own (dpkg --purge receivewal first)")
    run("dpkg", "-i", str(deb))
    try:
        yield deb
    finally:
        run("apt-get", "remove", "-y", "receivewal")
        assert not package_status().startswith("install ok")
        run("dpkg", "--purge", "receivewal")
    for path in INSTALLED:
        assert not os.path.lexists(path), f"{path} left behind after apt-get remove"


def as_postgres(*argv: str, env: dict[str, str] | None = None,
                ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", "postgres", "--", *argv], capture_output=True,
                          text=True, check=False, timeout=60, env={**os.environ, **(env or {})})


def test_package_ships_the_readme_and_every_docs_page(deb: Path) -> None:
    """/usr/share/doc/receivewal holds README.md and docs/ beside it, so that the README's
    relative links (docs/faults.md, ...) and the unit's Documentation= lines resolve there."""
    listing = run("dpkg-deb", "--contents", str(deb)).stdout
    shipped = {line.split()[-1].removeprefix(".") for line in listing.splitlines()}
    wanted = {"/usr/share/doc/receivewal/README.md"} | {
        f"/usr/share/doc/receivewal/docs/{page.name}" for page in (ROOT / "docs").glob("*.md")}
    assert len(wanted) > 5
    assert wanted - shipped == set()


def test_package_ships_shell_completion_that_completes_a_command(deb: Path,
                                                                  tmp_path: Path) -> None:
    """The bash completion script the package ships is click's for `receivewal`: sourced, it
    completes `receivewal rec` to `recover` (and zsh's and fish's are there beside it)."""
    run("dpkg-deb", "-x", str(deb), str(tmp_path))
    script = tmp_path / "usr/share/bash-completion/completions/receivewal"
    assert "_RECEIVEWAL_COMPLETE=bash_complete" in script.read_text()
    assert "compdef" in (tmp_path / "usr/share/zsh/vendor-completions/_receivewal").read_text()
    assert (tmp_path / "usr/share/fish/vendor_completions.d/receivewal.fish").stat().st_size
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "receivewal").write_text(f"#!/bin/sh\nexec {sys.executable} -m receivewal \"$@\"\n")
    (shim / "receivewal").chmod(0o755)
    done = subprocess.run(
        ["bash", "-c", f"source {script}; COMP_WORDS=(receivewal rec); COMP_CWORD=1; "
         "_receivewal_completion receivewal; echo \"${COMPREPLY[*]}\""],
        capture_output=True, text=True, check=False, timeout=60,
        env={**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"})
    assert done.stdout.split() == ["recover"], done.stdout + done.stderr


def test_package_installs_the_commands_unit_and_user(installed: Path) -> None:
    """dpkg -i gives /usr/bin/receivewal (runnable by the postgres user, from the venv in
    /opt/receivewal), the drop-in, the template unit, the example env file and the
    `receivewal` system user."""
    assert package_status() == "install ok installed"
    for path in INSTALLED:
        assert os.path.lexists(path), path
    assert os.path.realpath("/usr/bin/receivewal") == "/opt/receivewal/bin/receivewal"
    shebang = Path("/opt/receivewal/bin/receivewal").read_text().splitlines()[0]
    assert shebang == "#!/opt/receivewal/bin/python3"
    help_text = as_postgres("receivewal", "--help")
    assert help_text.returncode == 0, help_text.stderr
    assert "restore" in help_text.stdout
    dropin = as_postgres("pg_receivewal-streampack", "--version")
    assert dropin.returncode == 0, dropin.stderr
    # the unit's env file may set RECEIVEWAL_ENCRYPT_TO: the package carries pyrage (and boto3)
    extras = as_postgres("/opt/receivewal/bin/python3", "-c", "import pyrage, boto3")
    assert extras.returncode == 0, extras.stderr
    user = pwd.getpwnam("receivewal")
    assert user.pw_uid < 1000  # a system user
    assert user.pw_shell.endswith("nologin")
    for name in ("receivewal@.service", "receivewal-backup@.service",
                 "receivewal-backup@.timer", "receivewal-apply@.service"):
        unit = Path("/lib/systemd/system", name).read_text()
        assert unit == (ROOT / "systemd" / name).read_text(), name
    assert "backup" in help_text.stdout
    assert "recover" in help_text.stdout


def stream_while_writing(pg: PgServer, archive: Path, log: Path, **as_user: Any,
                         ) -> tuple[PgServer, str]:
    """Run the installed `receivewal stream` into ``archive`` (Popen's user/group/umask
    arguments in ``as_user``) while the primary is backed up and then writes rows; stop it
    once it flushed them. Return the base backup and the primary's (count, sum) of the rows."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    with log.open("wb") as err:
        proc = subprocess.Popen(
            ["/usr/bin/receivewal", "stream", "-D", str(archive), "-d", pg.dsn, "-S", "arch",
             "-s", "0.2"], stdout=subprocess.DEVNULL, stderr=err, cwd="/", **as_user)
    try:
        wait_for(lambda: pg.sql("SELECT count(*) FROM pg_stat_replication WHERE state = "
                                "'streaming'") == "1", what="streaming to start")
        backup = pg.base_backup("restored")
        pg.sql("CREATE TABLE accounts (id int PRIMARY KEY, balance numeric)")
        pg.sql("INSERT INTO accounts SELECT g, g * 1.5 FROM generate_series(1, 30000) g")
        switch = pg.switch_wal()
        end = lsn_to_int(switch)
        # the segment of the switch record, whole: a flush past the record alone can come
        # before the rest of the segment, and a recovery reads only complete segments
        segment = pg.sql(f"SELECT pg_walfile_name('{switch}')")

        def flushed() -> int:
            text = pg.sql("SELECT flush_lsn FROM pg_stat_replication")
            return lsn_to_int(text) if text else 0
        wait_for(lambda: flushed() >= end and (archive / segment).exists(),
                 what=f"receivewal to flush the switch and complete {segment}")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0, log.read_text()
    return backup, pg.sql("SELECT count(*), sum(balance) FROM accounts")


def recover_through_restore(backup: PgServer, archive: Path, expected: str,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Archive recovery of ``backup`` with restore_command = 'receivewal restore %f %p' (run
    by the server as the postgres user, the directory from its environment, as the README
    writes it); the recovered server has exactly the primary's rows."""
    monkeypatch.setenv("RECEIVEWAL_DIRECTORY", str(archive))
    try:
        backup.recover_from_archive("receivewal restore %f %p")
        assert backup.sql("SELECT count(*), sum(balance) FROM accounts") == expected
        assert "restored log file" in backup.logfile.read_text()
    finally:
        backup.stop("immediate")


def test_recovery_through_the_installed_restore_command(
        installed: Path, pg: PgServer, archive_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An archive written by the installed `receivewal stream` (run as postgres) serves a real
    archive recovery with restore_command = 'receivewal restore %f %p' run by the server as the
    postgres user: the restored base backup has exactly the primary's rows."""
    shutil.chown(archive_dir, "postgres", "postgres")
    backup, expected = stream_while_writing(pg, archive_dir, tmp_path / "stream.log",
                                            user="postgres", group="postgres", extra_groups=[])
    pg.stop("immediate")
    recover_through_restore(backup, archive_dir, expected, monkeypatch)


def test_postgres_in_the_receivewal_group_restores_what_the_service_wrote(
        installed: Path, pg: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed `receivewal stream` runs as the unit runs it (user and group receivewal,
    the unit's UMask) into a directory made as its StateDirectory= makes it (owned by
    receivewal, the unit's StateDirectoryMode). Its files are readable by the package's
    receivewal group and nobody else; once a DBA adds postgres to that group (usermod -aG),
    a real archive recovery through 'receivewal restore %f %p', run by the server as
    postgres, restores exactly the primary's rows."""
    service = parse_unit(Path("/lib/systemd/system/receivewal@.service").read_text())["Service"]
    base = make_shared_dir("receivewal-state-")
    archive = base / "db1"
    archive.mkdir(mode=int(service["StateDirectoryMode"][-1], 8))
    shutil.chown(archive, "receivewal", "receivewal")
    try:
        backup, expected = stream_while_writing(
            pg, archive, tmp_path / "stream.log", user="receivewal", group="receivewal",
            extra_groups=[], umask=int(service["UMask"][-1], 8))
        pg.stop("immediate")
        segments = [p for p in archive.iterdir() if not p.name.startswith(".")]
        assert segments
        for path in [*segments, archive / ".receivewal-archive.json"]:
            info = path.stat()
            assert (grp.getgrgid(info.st_gid).gr_name, stat.S_IMODE(info.st_mode)) == \
                ("receivewal", 0o640), path
        run("usermod", "-aG", "receivewal", "postgres")
        try:
            recover_through_restore(backup, archive, expected, monkeypatch)
        finally:
            run("gpasswd", "-d", "postgres", "receivewal")
    finally:
        shutil.rmtree(base, ignore_errors=True)
