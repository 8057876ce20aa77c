"""What a test or benchmark needs to let PostgreSQL (the postgres user) run
``receivewal restore`` as its restore_command and read an archive made by root."""

from __future__ import annotations

import compileall
import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from support.clusters import templates_dir

#: What ``restore -D s3://...`` needs besides the package (the s3 extra, pure Python).
S3_PACKAGES = ("boto3", "botocore", "s3transfer", "jmespath", "urllib3", "dateutil", "six.py")


def install_for_postgres(base: Path, extra: tuple[str, ...] = (), *, package: Path | None = None,
                         lib_name: str = "pylib") -> str:
    """The restore helper runnable by the postgres user: the package (this checkout's, or
    ``package``) and its compiled dependencies at ``base/lib_name`` where that user can read
    them, run by the system python3 (as a system-wide installation would be). Returns the
    command prefix. This checkout's package is copied once per run for each set of ``extra``
    (:func:`shared_lib`) and ``base/lib_name`` links to that copy; ``package`` is copied there."""
    system = subprocess.run(["/usr/bin/python3", "-c", "import sys; print(sys.version_info[:2])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    if system != str(tuple(sys.version_info[:2])):
        raise AssertionError(f"/usr/bin/python3 is {system}, the test environment's Python is "
                             f"{sys.version_info[:2]}: the copied compiled modules need the "
                             "same version")
    lib = base / lib_name
    if package is None:
        lib.parent.mkdir(parents=True, exist_ok=True)  # as copytree made it
        lib.symlink_to(shared_lib(extra), target_is_directory=True)
    else:
        copy_lib(lib, package, extra)
    return f"PYTHONPATH={lib} /usr/bin/python3 -m receivewal restore"


def shared_lib(extra: tuple[str, ...]) -> Path:
    """This checkout's package and dependencies (with ``extra``) copied once per run, for every
    process of it, into the run's shared directory (support.clusters.templates_dir, which
    pytest-xdist's workers and the benchmarks the tests run inherit): built under an exclusive
    ``flock``, a process that comes later takes what the first one built. Nothing writes
    into it afterwards (the postgres user cannot). Copying boto3's packages and compiling them
    took 15 s a call under load, the package alone 3.5 s; ~20 tests call it."""
    key = hashlib.sha256("\0".join(sorted(extra)).encode()).hexdigest()[:12]
    lib = templates_dir() / f"pylib-{key}"
    with (templates_dir() / f"pylib-{key}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # closing the file releases it
        done = templates_dir() / f"pylib-{key}.done"
        if not done.exists():
            shutil.rmtree(lib, ignore_errors=True)  # a builder that died half-way
            copy_lib(lib, Path(__file__).resolve().parent.parent.parent / "receivewal", extra)
            done.touch()
    return lib


def copy_lib(lib: Path, package: Path, extra: tuple[str, ...]) -> None:
    """Copy ``package`` and its compiled dependencies (with ``extra``) into ``lib``,
    byte-compiled and readable by everyone."""
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    shutil.copytree(package, lib / "receivewal", ignore=shutil.ignore_patterns("__pycache__"))
    metadata = [p.name for p in site.glob("crc32c-*.dist-info")]  # crc32c reads its version
    for dep in ("lz4", "zstandard", "click", "backports", "crc32c", *metadata, *extra):
        if (site / dep).is_file():
            shutil.copy(site / dep, lib / dep)
            continue
        shutil.copytree(site / dep, lib / dep, ignore=shutil.ignore_patterns("__pycache__"))
    # byte-compiled as an installation is (pip, the .deb): the postgres user cannot write
    # __pycache__ here, and would otherwise compile every module on every call
    compileall.compile_dir(lib, quiet=1)
    for path in [lib, *lib.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def readable_by_postgres(archive: Path) -> None:
    """Let the server user read the archive (its directory and files) as they are now: a
    stream daemon writing into it creates what it completes later with mode 0600, so call this
    again right before each recovery. A file renamed away meanwhile (a ``.partial`` completed,
    a temporary name) is passed over."""
    archive.chmod(0o755)
    for path in archive.iterdir():
        try:
            path.chmod(0o644)
        except FileNotFoundError:
            continue
