"""age keys for the encryption tests and benchmark: identity files as ``age-keygen`` writes
them, and the ``age`` command line (Debian's package, which scripts/setup.sh installs)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pyrage import x25519


@dataclass(frozen=True)
class KeyPair:
    """An identity file and the recipient (public key) of its one identity."""

    path: Path
    recipient: str


def new_identity_file(path: Path) -> KeyPair:
    """Write a new X25519 identity to ``path`` in age-keygen's format (two comment lines, then
    the key), mode 0600."""
    identity = x25519.Identity.generate()
    recipient = str(identity.to_public())
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    path.write_text(f"# created: {created}\n# public key: {recipient}\n{identity}\n")
    path.chmod(0o600)
    return KeyPair(path, recipient)


def age_command() -> str:
    """The age command line's path; the test fails (never skips) where it is missing."""
    found = shutil.which("age")
    assert found is not None, "the age command line is missing: scripts/setup.sh installs " \
                              "Debian's age package as root (apt-get install age)"
    return found


def age_keygen(path: Path) -> KeyPair:
    """A new identity file written by ``age-keygen`` itself."""
    keygen = shutil.which("age-keygen")
    assert keygen is not None, "age-keygen is missing: apt-get install age"
    subprocess.run([keygen, "-o", str(path)], check=True, capture_output=True, timeout=30)
    public = subprocess.run([keygen, "-y", str(path)], check=True, capture_output=True,
                            text=True, timeout=30).stdout.strip()
    return KeyPair(path, public)
