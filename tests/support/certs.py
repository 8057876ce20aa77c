"""A throw-away certificate authority for TLS tests, made with the ``openssl`` command.

The openssl CLI is already what the relay tests use for self-signed certificates, so no Python
dependency is added for it. Keys are EC P-256 (fast to generate).
"""

from __future__ import annotations

import os
import pwd
import subprocess
from dataclasses import dataclass
from pathlib import Path

from support.servers import IS_ROOT, PgServer

EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@dataclass(frozen=True)
class CertPair:
    """A PEM certificate and its unencrypted key."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class TestCA:
    """A CA certificate and the pairs it signed."""

    __test__ = False  # not a pytest test class

    ca: CertPair

    @classmethod
    def create(cls, directory: Path) -> TestCA:
        ca = CertPair(directory / "ca.crt", directory / "ca.key")
        _openssl("req", "-x509", *EC_KEY, "-days", "2", "-subj", "/CN=receivewal test CA",
                 "-keyout", str(ca.key), "-out", str(ca.cert))
        return cls(ca)

    def issue(self, name: str, common_name: str, ip: str | None = None) -> CertPair:
        """A certificate signed by this CA (for ``ip`` as subjectAltName when given)."""
        directory = self.ca.cert.parent
        pair = CertPair(directory / f"{name}.crt", directory / f"{name}.key")
        csr = directory / f"{name}.csr"
        _openssl("req", *EC_KEY, "-subj", f"/CN={common_name}", "-keyout", str(pair.key),
                 "-out", str(csr))
        extensions = directory / f"{name}.ext"
        extensions.write_text(f"subjectAltName=IP:{ip}\n" if ip else "basicConstraints=CA:FALSE\n")
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca.cert), "-CAkey",
                 str(self.ca.key), "-CAcreateserial", "-days", "2", "-out", str(pair.cert),
                 "-extfile", str(extensions))
        pair.key.chmod(0o600)
        return pair


def enable_server_tls(server: PgServer, pair: CertPair, ca: CertPair) -> None:
    """Copy ``pair`` into the server's data directory and turn ``ssl`` on (needs a restart)."""
    cert, key = server.datadir / "server.crt", server.datadir / "server.key"
    cert.write_bytes(pair.cert.read_bytes())
    key.write_bytes(pair.key.read_bytes())
    key.chmod(0o600)
    (server.datadir / "root.crt").write_bytes(ca.cert.read_bytes())
    if IS_ROOT:
        owner = pwd.getpwnam("postgres")
        for path in (cert, key, server.datadir / "root.crt"):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    server.configure({"ssl": "on", "ssl_cert_file": "'server.crt'",
                      "ssl_key_file": "'server.key'"})
