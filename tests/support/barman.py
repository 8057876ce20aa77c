"""Barman (from PyPI) configured in a temporary directory, with the drop-in as pg_receivewal."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

from support.dropin import install_dropin
from support.servers import PgServer, pg_bin

BARMAN = str(Path(sys.executable).parent / "barman")
SERVER = "pg"


class Barman:
    """One barman.conf with one server section, and a way to run barman commands on it."""

    def __init__(self, base: Path, server: PgServer, slot: str = "barman") -> None:
        self.base = base
        self.home = base / "home"
        self.bin = base / "bin"
        self.config = base / "barman.conf"
        self.log = base / "barman.log"
        self.home.mkdir(parents=True)
        install_dropin(self.bin)
        # pg_basebackup for backup_method = postgres; pg_receivewal is ours and comes first
        (self.bin / "pg_basebackup").symlink_to(pg_bin("pg_basebackup"))
        user = pwd.getpwuid(os.geteuid()).pw_name
        self.config.write_text(f"""\
[barman]
barman_home = {self.home}
barman_user = {user}
log_file = {self.log}
log_level = DEBUG
barman_lock_directory = {self.home}

[{SERVER}]
description = receivewal drop-in under Barman
conninfo = host=127.0.0.1 port={server.port} user=postgres dbname=postgres
streaming_conninfo = host=127.0.0.1 port={server.port} user=postgres
backup_method = postgres
streaming_archiver = on
archiver = off
slot_name = {slot}
path_prefix = {self.bin}
""")

    def argv(self, *args: str) -> list[str]:
        """The barman command line for ``args`` with this configuration."""
        return [BARMAN, "-c", str(self.config), *args]

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run a barman command to completion."""
        env = {**os.environ, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        return subprocess.run(self.argv(*args), capture_output=True, text=True, env=env,
                              timeout=timeout, check=False)

    def run_while_writing(self, server: PgServer, *args: str,
                          timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run a barman command that waits for a WAL file to be archived (switch-wal
        --archive), writing a row to ``server`` every half second meanwhile. Barman archives a
        streamed segment only once the next one's ``.partial`` exists, and an idle server
        writes the WAL that opens it only with its next running-xacts snapshot, up to 15 s on."""
        server.sql("CREATE TABLE IF NOT EXISTS barman_nudge (at timestamptz)")
        env = {**os.environ, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        with subprocess.Popen(self.argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) as proc:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    out, err = proc.communicate(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() > deadline:
                        proc.kill()
                        raise
                    server.sql("INSERT INTO barman_nudge VALUES (now())")
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def start(self, *args: str, output: Path) -> subprocess.Popen[bytes]:
        """Start a long-running barman command (receive-wal) in the background."""
        with output.open("ab") as out:
            return subprocess.Popen(self.argv(*args), stdout=out, stderr=subprocess.STDOUT)

    @property
    def streaming_dir(self) -> Path:
        """Where pg_receivewal (ours) writes for Barman."""
        return self.home / SERVER / "streaming"

    @property
    def wals_dir(self) -> Path:
        """Barman's WAL archive."""
        return self.home / SERVER / "wals"
