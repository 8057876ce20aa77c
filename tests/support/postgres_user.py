"""What a test or benchmark needs to let PostgreSQL (the postgres user) run
``receivewal restore`` as its restore_command and read an archive made by root."""

from __future__ import annotations

import compileall
import shutil
import subprocess
import sys
from pathlib import Path

#: What ``restore -D s3://...`` needs besides the package (the s3 extra, pure Python).
S3_PACKAGES = ("boto3", "botocore", "s3transfer", "jmespath", "urllib3", "dateutil", "six.py")


def install_for_postgres(base: Path, extra: tuple[str, ...] = (), *, package: Path | None = None,
                         lib_name: str = "pylib") -> str:
    """The restore helper runnable by the postgres user: the package (this checkout's, or
    ``package``) and its compiled dependencies copied to ``base/lib_name`` where that user can
    read them, run by the system python3 (as a system-wide installation would be). Returns
    the command prefix."""
    system = subprocess.run(["/usr/bin/python3", "-c", "import sys; print(sys.version_info[:2])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    if system != str(tuple(sys.version_info[:2])):
        raise AssertionError(f"/usr/bin/python3 is {system}, the test environment's Python is "
                             f"{sys.version_info[:2]}: the copied compiled modules need the "
                             "same version")
    lib = base / lib_name
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    package = package or Path(__file__).resolve().parent.parent.parent / "receivewal"
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
    return f"PYTHONPATH={lib} /usr/bin/python3 -m receivewal restore"


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
