"""The Debian package of this checkout, built by scripts/build-deb (once per test session: the
``deb`` fixture of tests/conftest.py)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


@contextlib.contextmanager
def built_deb() -> Iterator[Path]:
    """scripts/build-deb's package, built as a user builds it, in a temporary directory that
    is removed afterwards."""
    out = Path(tempfile.mkdtemp(prefix="receivewal-deb-"))
    try:
        out.chmod(0o755)  # the systemd test's namespace reads it as another root
        done = subprocess.run([str(ROOT / "scripts" / "build-deb"), str(out)],
                              capture_output=True, text=True, check=False, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"scripts/build-deb failed: {done.stderr[-3000:]}")
        yield Path(done.stdout.strip())
    finally:
        shutil.rmtree(out, ignore_errors=True)
