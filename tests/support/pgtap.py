"""PostgreSQL's own TAP test of pg_receivewal (``src/bin/pg_basebackup/t/020_pg_receivewal.pl``),
run against the drop-in.

The script is PostgreSQL's and stays out of this repository: it is taken at test time from the
Debian source package of the installed binaries (``apt-get source --download-only
postgresql-15=VERSION``, which needs a ``deb-src`` entry: scripts/setup.sh adds one as root),
and cached (:func:`cache_dir`) so that the 23 MB download happens once per machine. The harness
is the installed one: the Perl modules PostgreSQL::Test::Cluster and ::Utils (in
postgresql-client-15's pgxs), pg_regress from the same place, IPC::Run (libipc-run-perl),
``prove``, and ``pg_config.h`` (libpq-dev) for its ``check_pg_config``. :func:`run_tap` runs the
script as ``make installcheck`` would (TESTDIR, PATH, PG_REGRESS, the GZIP_PROGRAM and LZ4
that pg_basebackup's Makefile exports), with the drop-in first on PATH under the name
``pg_receivewal``, as the server user (initdb refuses root).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

from support.postgres_user import install_for_postgres
from support.servers import IS_ROOT, PG_BIN, as_server_user, pg_bin, server_user_ids

CACHE_ENV = "RECEIVEWAL_TEST_CACHE"
#: What the drop-in needs besides what install_for_postgres copies for restore.
DROPIN_PACKAGES = ("psycopg", "psycopg_binary", "psycopg_binary.libs", "structlog",
                   "typing_extensions.py", "prometheus_client")


def cache_dir() -> Path:
    """Where downloaded source packages are kept: ``$RECEIVEWAL_TEST_CACHE``, else
    /var/cache/receivewal-tests as root (shared by every checkout), else the virtual
    environment's ``cache``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path("/var/cache/receivewal-tests") if IS_ROOT else Path(sys.prefix) / "cache"


def installed_source() -> tuple[str, str]:
    """The Debian source package (name, version) that built the installed pg_receivewal."""
    owner = subprocess.run(["dpkg-query", "-S", pg_bin("pg_receivewal")], capture_output=True,
                           text=True, check=True).stdout.split(":", 1)[0]
    name, version = subprocess.run(
        ["dpkg-query", "-W", "-f", "${source:Package} ${source:Version}", owner],
        capture_output=True, text=True, check=True).stdout.split()
    return name, version


def pgxs() -> Path:
    """The installed pgxs tree (the Perl test modules and pg_regress are in it)."""
    libdir = subprocess.run([pg_bin("pg_config"), "--pkglibdir"], capture_output=True,
                            text=True, check=True).stdout.strip()
    return Path(libdir) / "pgxs"


def missing_tools() -> list[str]:
    """What the harness needs and this machine lacks (scripts/setup.sh installs it as root)."""
    missing = [name for name in ("prove", "perl", "apt-get", "dpkg-query", "gzip", "lz4")
               if shutil.which(name) is None]
    if shutil.which("perl") and subprocess.run(["perl", "-MIPC::Run", "-e", "1"],
                                               capture_output=True, check=False).returncode:
        missing.append("IPC::Run (libipc-run-perl)")
    if PG_BIN is None:
        return [*missing, "the PostgreSQL binaries"]
    if not (pgxs() / "src/test/perl/PostgreSQL/Test/Cluster.pm").exists():
        missing.append("PostgreSQL::Test::Cluster (postgresql-client)")
    includedir = subprocess.run([pg_bin("pg_config"), "--includedir"], capture_output=True,
                                text=True, check=True).stdout.strip()
    if not (Path(includedir) / "pg_config.h").exists():
        missing.append(f"{includedir}/pg_config.h (libpq-dev)")
    return missing


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``directory/.lock`` (suites of several checkouts share the
    cache)."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def tap_script(relative: str) -> Path:
    """``relative`` (e.g. ``src/bin/pg_basebackup/t/020_pg_receivewal.pl``) from the source of
    the installed binaries: downloaded with apt-get (which checks it against the signed
    archive's hashes) and unpacked once, then read from the cache."""
    name, version = installed_source()
    upstream = version.split(":")[-1].rsplit("-", 1)[0]
    where = cache_dir() / f"{name}_{version}"
    script = where / Path(relative).name
    with _locked(cache_dir()):
        if script.exists():
            return script
        orig = where / f"{name}_{upstream}.orig.tar.bz2"
        if not orig.exists():
            where.mkdir(parents=True, exist_ok=True)
            done = subprocess.run(["apt-get", "source", "--download-only", f"{name}={version}"],
                                  cwd=where, capture_output=True, text=True, check=False)
            if done.returncode or not orig.exists():
                raise AssertionError(
                    f"apt-get source --download-only {name}={version} failed (exit "
                    f"{done.returncode}): {done.stderr.strip()}; as root, scripts/setup.sh adds "
                    "the deb-src entry it needs")
        member = f"postgresql-{upstream}/{relative}"
        with tarfile.open(orig, "r:bz2") as tar:
            source = tar.extractfile(member)
            if source is None:
                raise AssertionError(f"{orig} has no file {member}")
            partial = script.with_name(script.name + ".part")
            partial.write_bytes(source.read())
            partial.replace(script)
    return script


def install_dropin_for_server_user(base: Path) -> Path:
    """``base/bin/pg_receivewal``: the drop-in as the server user can run it (the checkout's
    package and dependencies copied where that user reads them, run by the system python3,
    as a system-wide installation would be); returns the directory."""
    install_for_postgres(base, DROPIN_PACKAGES)
    bin_dir = base / "bin"
    bin_dir.mkdir()
    script = bin_dir / "pg_receivewal"
    script.write_text("#!/usr/bin/python3\nimport sys\n"
                      f"sys.path.insert(0, {str(base / 'pylib')!r})\n"
                      "from receivewal.commands.pg_receivewal import run\n"
                      "sys.exit(run())\n")
    script.chmod(0o755)
    return bin_dir


def run_tap(script: Path, work: Path, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run the TAP ``script`` with ``prove -v`` in ``work`` (its TESTDIR), as ``make
    installcheck`` would, with ``bin_dir`` first on PATH; clusters are kept
    (PG_TEST_NOCLEAN) for the caller to look at."""
    (work / "t").mkdir(parents=True)
    shutil.copy(script, work / "t" / script.name)
    ids = server_user_ids()
    if ids is not None:
        for path in [work, *work.rglob("*")]:
            os.chown(path, *ids)
    tree = pgxs()
    env = {"PATH": f"{bin_dir}:{PG_BIN}:/usr/bin:/bin", "TESTDIR": str(work),
           "PG_REGRESS": str(tree / "src/test/regress/pg_regress"),
           "GZIP_PROGRAM": "gzip", "LZ4": "lz4", "PG_TEST_NOCLEAN": "1", "LANG": "C.UTF-8"}
    argv = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "prove", "-v",
            "-I", str(tree / "src/test/perl"), f"t/{script.name}"]
    return subprocess.run(as_server_user(argv), cwd=work, capture_output=True, text=True,
                          timeout=600, check=False)
