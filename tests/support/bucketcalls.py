"""``receivewal restore -D s3://...`` as the tests call it: fresh prefixes on the test's S3
server (with the archive's identity object, as the daemon leaves a prefix), objects put by
exact key, and calls run as PostgreSQL runs them."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

from receivewal.archive.bucket import Bucket
from receivewal.archive.identity import ArchiveIdentity, claim_identity
from receivewal.archive.objectstore import RetryPolicy
from receivewal.restore.filler import Spool
from support.seaweed import SeaweedS3
from support.walgen import SEGMENT, SYSID

_prefixes = itertools.count()


def new_prefix(store: SeaweedS3, sysid: int | str | None = SYSID,
               size: int = SEGMENT) -> str:
    """A fresh prefix, holding the identity object of an archive of database system
    ``sysid`` as the daemon leaves it (None: no identity object)."""
    prefix = f"s3://{store.bucket}/restore-{os.getpid()}-{next(_prefixes)}/wal"
    if sysid is not None:
        claim_identity(Bucket.connect(prefix), ArchiveIdentity(str(sysid), size, 1))
    return prefix


def put(url: str, name: str, body: bytes) -> None:
    """Upload ``body`` as ``PREFIX/name``."""
    Bucket.connect(url, RetryPolicy(attempts=2, base_delay=0.01)).put_new(name, body)


def restore(directory: str, name: str, target: Path, *args: str,
            env: dict[str, str] | None = None, timeout: float = 120,
            ) -> subprocess.CompletedProcess[str]:
    """One restore_command call (``args``: its options), in a child process."""
    return subprocess.run([sys.executable, "-m", "receivewal", "restore", "-D", directory, *args,
                           name, str(target)], capture_output=True, text=True, check=False,
                          timeout=timeout, env={**os.environ, **(env or {})})


def spooled(spool: Spool) -> list[str]:
    """The segments in a spool (without its records: .window, .wanted, .source...)."""
    return sorted(n for n in os.listdir(spool.dir) if not n.startswith("."))
