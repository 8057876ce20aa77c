"""The drop-in installed as ``pg_receivewal`` in a directory of its own, as
docs/pg_receivewal.md says."""

from __future__ import annotations

import sys
from pathlib import Path

from support.servers import pg_bin

DROPIN = Path(sys.executable).parent / "pg_receivewal-streampack"
PG_RECEIVEWAL = pg_bin("pg_receivewal")


def install_dropin(directory: Path) -> Path:
    """Symlink ``directory/pg_receivewal`` to the console script; return the link."""
    directory.mkdir(parents=True, exist_ok=True)
    link = directory / "pg_receivewal"
    link.symlink_to(DROPIN)
    return link
