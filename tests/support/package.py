"""The Debian package of this checkout, built once per test session by scripts/build-deb."""

from __future__ import annotations

import functools
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


@functools.cache
def built_deb() -> Path:
    """scripts/build-deb's package, in a temporary directory (built on first use)."""
    out = Path(tempfile.mkdtemp(prefix="receivewal-deb-"))
    out.chmod(0o755)
    done = subprocess.run([str(ROOT / "scripts" / "build-deb"), str(out)], capture_output=True,
                          text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/build-deb failed: {done.stderr[-3000:]}")
    return Path(done.stdout.strip())
