"""The loop a DBA runs with one archive, more than once (issue 31): the primary streamed into
the archive and backed up; a point-in-time recovery to a time brings back a new primary on
timeline 2; the same archive goes on with it (the same ``stream -D``), its backup goes into the
same archive, it writes more; then ``recover latest`` brings every row of the new primary back,
and ``verify`` calls the two-timeline archive recoverable. Every step is the command line a
user types; an archive in a directory or in a bucket, plain or sealed with age."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from support.agekeys import KeyPair, age_keygen
from support.backups import give_to_postgres, start_recovered
from support.postgres_user import S3_PACKAGES, install_for_postgres, readable_by_postgres
from support.seaweed import SeaweedS3
from support.servers import PgServer, make_shared_dir
from support.streams import receivewal, start_streaming, stop, wait_for

_prefixes = itertools.count()
#: a few segments of WAL (1 MiB segments)
MORE = "INSERT INTO filler SELECT g, repeat('y', 100) FROM generate_series(1, 10000) g"


@dataclass
class Loop:
    """One run of the loop: where the archive lives and how it is kept."""

    base: Path
    local: Path  # the stream daemon's directory
    seaweed: SeaweedS3 | None  # the bucket the daemon uploads to, when there is one
    key: KeyPair | None  # the archive is sealed for this key, when there is one
    url: str = ""
    prefix: str = ""  # restore_command's prefix, runnable by the server user
    logs: list[Path] = field(default_factory=list)

    @property
    def archive(self) -> str:
        """What backup, recover and verify are pointed at."""
        return self.url or str(self.local)

    def env(self) -> dict[str, str]:
        return self.seaweed.env() if self.seaweed is not None else {}

    def run(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        done = receivewal(*args, env=self.env(), timeout=timeout)
        assert "Traceback" not in done.stderr, done.stderr
        return done

    def sealing(self) -> tuple[str, ...]:
        return ("--encrypt-to", self.key.recipient) if self.key is not None else ()

    def identity(self) -> tuple[str, ...]:
        return ("--identity", str(self.key.path)) if self.key is not None else ()

    def stream(self, pg: PgServer, name: str) -> subprocess.Popen[bytes]:
        """``receivewal stream`` of ``pg`` into the one archive directory (uploading to the
        bucket when there is one), started and streaming."""
        log = self.base / f"{name}.log"
        self.logs.append(log)
        upload = ("--upload-to", self.url) if self.url else ()
        return start_streaming("-D", str(self.local), "-d", pg.dsn, *upload, *self.sealing(),
                               log=log, env=self.env())

    def archived(self, segment: str) -> bool:
        """Whether the archive (the bucket, when there is one) holds ``segment``, complete."""
        if self.seaweed is not None:
            key = self.url.split("/", 3)[3]
            found = self.seaweed.client().list_objects_v2(Bucket=self.seaweed.bucket,
                                                          Prefix=f"{key}/{segment}")
            return any(not o["Key"].endswith(".partial") for o in found.get("Contents", []))
        return any(p.name.startswith(segment) and not p.name.endswith(".partial")
                   for p in self.local.iterdir())

    def switch_and_wait(self, pg: PgServer) -> None:
        """End the server's current segment and wait until the archive holds it."""
        last = pg.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
        pg.switch_wal()
        wait_for(lambda: self.archived(last), timeout=90, what=f"{last} in the archive")

    def backup(self, pg: PgServer, label: str) -> str:
        """``receivewal backup`` of ``pg`` into the archive; the backup's id."""
        done = self.run("backup", "-D", self.archive, "-d", pg.dsn, "--fast", "--label", label,
                        *self.sealing())
        assert done.returncode == 0, done.stderr
        first = done.stdout.splitlines()[0]
        assert first.startswith("backup "), done.stdout
        assert " complete: " in first, done.stdout
        return first.split()[1]

    def recover(self, name: str, *target: str) -> tuple[PgServer, str]:
        """``receivewal recover`` into a new data directory and the recovered server started
        (recovery ended, promoted); the server and what recover printed."""
        readable_by_postgres(self.local)
        pgdata = self.base / name
        env = " ".join(f"{k}={v}" for k, v in self.env().items())
        done = self.run("recover", *target, "--to", str(pgdata), "-D", self.archive,
                        *self.identity(), "--restore-command-prefix",
                        f"{env} RECEIVEWAL_PREFETCH_IDLE=2 {self.prefix}")
        assert done.returncode == 0, done.stderr
        give_to_postgres(pgdata)
        try:
            server = start_recovered(self.base, name)
        except (subprocess.CalledProcessError, AssertionError) as exc:
            log = self.base / f"{name}.log"
            raise AssertionError(log.read_text() if log.exists() else str(exc)) from exc
        return server, done.stdout


def rows(server: PgServer) -> str:
    return server.sql("SELECT string_agg(what, ',' ORDER BY what) FROM marker")


def run_the_loop(base: Path, seaweed: SeaweedS3 | None, sealed: bool) -> None:
    """The whole loop; fails at the first step that does not hold."""
    local = base / "archive"
    local.mkdir()
    key = None
    if sealed:
        key = age_keygen(base / "key.txt")
        key.path.chmod(0o644)  # the server user runs restore_command (a test's key only)
    loop = Loop(base, local, seaweed, key)
    extra = ("pyrage",) if sealed else ()
    loop.prefix = install_for_postgres(base, (*extra, *S3_PACKAGES) if seaweed else extra)
    if seaweed is not None:
        loop.url = f"s3://{seaweed.bucket}/loop-{next(_prefixes)}-{int(time.time())}"
    servers: list[PgServer] = []
    streamer = None
    try:
        # the first primary, archived and backed up
        primary = PgServer(base, "primary")
        servers.append(primary)
        primary.init(initdb_args=("--wal-segsize=1",))
        primary.start()
        primary.sql("CREATE TABLE marker (what text)")
        primary.sql("CREATE TABLE filler AS SELECT g AS id, repeat('x', 100) AS pad "
                    "FROM generate_series(1, 20000) g")
        streamer = loop.stream(primary, "stream-1")
        loop.backup(primary, "first")
        primary.sql("INSERT INTO marker VALUES ('a: before the target')")
        time.sleep(1.1)
        target = primary.sql("SELECT clock_timestamp()")
        time.sleep(1.1)
        primary.sql("INSERT INTO marker VALUES ('b: after the target, abandoned')")
        primary.sql(MORE)
        loop.switch_and_wait(primary)
        assert stop(streamer) == 0
        streamer = None
        primary.stop()

        # a point-in-time recovery: the new primary forks timeline 2 inside the archive
        second, printed = loop.recover("second", "--target-time", target)
        servers.append(second)
        assert rows(second) == "a: before the target", printed
        assert second.timeline() == 2

        # the same archive goes on with the new primary, its backup goes there too
        streamer = loop.stream(second, "stream-2")
        second.sql("INSERT INTO marker VALUES ('c: on timeline 2, before its backup')")
        newest = loop.backup(second, "after-the-recovery")
        second.sql("INSERT INTO marker VALUES ('d: on timeline 2, after its backup')")
        second.sql(MORE)
        second.sql("INSERT INTO marker VALUES ('e: the last one')")
        loop.switch_and_wait(second)
        assert stop(streamer) == 0
        streamer = None
        second.stop()

        # one day: recover latest. Every row of the new primary is there
        third, printed = loop.recover("third")
        servers.append(third)
        assert printed.startswith(f"backup {newest} "), printed
        assert rows(third) == ("a: before the target,c: on timeline 2, before its backup,"
                               "d: on timeline 2, after its backup,e: the last one"), printed
        assert third.sql("SELECT count(*) FROM filler WHERE pad IS NOT NULL") != "0"
        assert "recovery stopping" not in third.logfile.read_text()
        third.stop()

        verified = loop.run("verify", *loop.identity(), loop.archive)
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert "NOT recoverable" not in verified.stdout, verified.stdout
    except BaseException:
        for log in loop.logs:
            if log.exists():
                print(f"--- {log.name}\n{log.read_text()[-4000:]}")
        raise
    finally:
        if streamer is not None:
            stop(streamer)
        for server in servers:
            server.stop("immediate")


def loop_base(name: str) -> Path:
    return make_shared_dir(f"receivewal-loop-{name}-")


def remove(base: Path) -> None:
    shutil.rmtree(base, ignore_errors=True)
