"""``receivewal relay`` on a network: TLS toward clients, who may connect, how many, and
authentication passing through (issue 12).

One PostgreSQL 15 server with ``ssl=on`` (a certificate from a CA made here) and pg_hba rules
that ask for scram-sha-256 and md5 from 127.0.0.1, as a primary behind a relay would have them.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from psycopg import pq
from support.certs import CertPair, TestCA, enable_server_tls
from support.servers import PgServer, make_shared_dir
from support.streams import (
    assert_identical_to_server,
    complete_segments,
    start_receivewal,
    stop,
    wait_for,
)
from support.wire import CapturingUpstream, raw_startup
from test_relay import command, running_relay

from receivewal.relay.protocol import SSL_REQUEST, build_startup_packet

SEG = 16 * 1024 * 1024
SCRAM_PASSWORD = "scram secret"  # noqa: S105 - a test role's password
MD5_PASSWORD = "md5 secret"  # noqa: S105 - a test role's password
HBA = """\
local all all trust
host all postgres 127.0.0.1/32 trust
host replication postgres 127.0.0.1/32 trust
host replication rep_scram 127.0.0.1/32 scram-sha-256
host all rep_scram 127.0.0.1/32 scram-sha-256
host replication rep_md5 127.0.0.1/32 md5
host all rep_md5 127.0.0.1/32 md5
"""


@dataclass
class SecureSetup:
    server: PgServer
    ca: CertPair
    relay_cert: CertPair
    client_cert: CertPair

    def tls_options(self, cert: CertPair) -> tuple[str, ...]:
        return ("--tls-cert", str(cert.cert), "--tls-key", str(cert.key))


@pytest.fixture(scope="module")
def secure() -> Iterator[SecureSetup]:
    """A primary with ssl=on, scram-sha-256 and md5 roles, and the certificates to use."""
    base = make_shared_dir("receivewal-tls-")
    server = PgServer(base, "primary")
    try:
        server.init()
        ca = TestCA.create(base)
        enable_server_tls(server, ca.issue("server", "127.0.0.1", ip="127.0.0.1"), ca.ca)
        (server.datadir / "pg_hba.conf").write_text(HBA)
        server.start()
        server.sql(f"CREATE ROLE rep_scram LOGIN REPLICATION PASSWORD '{SCRAM_PASSWORD}'")
        server.sql("SET password_encryption = 'md5'; "
                   f"CREATE ROLE rep_md5 LOGIN REPLICATION PASSWORD '{MD5_PASSWORD}'")
        yield SecureSetup(server, ca.ca, ca.issue("relay", "127.0.0.1", ip="127.0.0.1"),
                          ca.issue("client", "rep_scram"))
    finally:
        server.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def try_connect(conninfo: str) -> tuple[pq.abc.PGconn | None, str]:
    """A libpq connection, or None and libpq's error message."""
    conn = pq.PGconn.connect(conninfo.encode())
    if conn.status == pq.ConnStatus.OK:
        return conn, ""
    message = conn.get_error_message()
    conn.finish()
    return None, message


def login(port: int, user: str, password: str, extra: str = "",
          host: str = "127.0.0.1") -> tuple[pq.abc.PGconn | None, str]:
    return try_connect(f"host={host} port={port} user={user} password='{password}' "
                       f"dbname=postgres replication=true {extra}")


def identify(conn: pq.abc.PGconn) -> str:
    try:
        (system, _, _, _), = command(conn, "IDENTIFY_SYSTEM")
        return system
    finally:
        conn.finish()


# -- authentication through the relay ---------------------------------------------------------


@pytest.mark.server
def test_scram_through_a_plaintext_client_leg_and_a_tls_upstream(secure: SecureSetup) -> None:
    """The issue's failure: on loopback with a plain client leg and the default upstream
    sslmode (prefer: TLS), the server offers SCRAM-SHA-256-PLUS; the relay strips it, so libpq
    logs in with scram-sha-256 instead of failing."""
    system = secure.server.sql("SELECT system_identifier FROM pg_control_system()")
    with running_relay(secure.server.port) as relay:
        conn, error = login(relay.port, "rep_scram", SCRAM_PASSWORD, "sslmode=disable")
        assert conn is not None, error
        assert identify(conn) == system


@dataclass
class Case:
    """One documented set-up: how the relay reaches the upstream, what the client sets."""

    name: str
    upstream: tuple[str, ...]
    client: str = ""
    expected_tls_upstream: bool = False
    events: list[dict[str, object]] = field(default_factory=list)


def case_options(secure: SecureSetup, case: str) -> tuple[str, ...]:
    """Relay options for case (a) plain upstream leg or (b) TLS on both legs."""
    tls = ("--client-tls", "require", *secure.tls_options(secure.relay_cert))
    if case == "a":
        return (*tls, "--upstream-sslmode", "disable")
    return (*tls, "--upstream-sslmode", "verify-full", "--upstream-sslrootcert",
            str(secure.ca.cert))


def client_tls(secure: SecureSetup) -> str:
    return f"sslmode=verify-full sslrootcert={secure.ca.cert}"


@pytest.mark.server
@pytest.mark.parametrize(("case", "user", "password"), [
    ("a", "rep_scram", SCRAM_PASSWORD), ("a", "rep_md5", MD5_PASSWORD),
    ("b", "rep_scram", SCRAM_PASSWORD), ("b", "rep_md5", MD5_PASSWORD),
])
def test_scram_and_md5_log_in_through_tls(secure: SecureSetup, case: str, user: str,
                                          password: str) -> None:
    """(a) TLS toward the client, plain upstream; (b) TLS on both legs (the client sets
    channel_binding=disable there). The client's leg is TLS in both."""
    extra = client_tls(secure) + (" channel_binding=disable" if case == "b" else "")
    with running_relay(secure.server.port, extra=case_options(secure, case)) as relay:
        conn, error = login(relay.port, user, password, extra)
        assert conn is not None, error
        assert conn.ssl_in_use
        identify(conn)
    (connected,) = relay.named("relay_client_connected")
    assert connected["client_tls"] is True
    assert connected["upstream_tls"] is (case == "b")


@pytest.mark.server
def test_channel_binding_cannot_span_two_tls_sessions(secure: SecureSetup) -> None:
    """Case (b) with libpq's default channel_binding=prefer: the client, on TLS, says it could
    bind; the server, on its own TLS session, offered SCRAM-SHA-256-PLUS and refuses. This is
    the message docs/relay.md quotes; with channel_binding=require libpq refuses itself."""
    with running_relay(secure.server.port, extra=case_options(secure, "b")) as relay:
        conn, error = login(relay.port, "rep_scram", SCRAM_PASSWORD, client_tls(secure))
        assert conn is None
        assert "SCRAM channel binding negotiation error" in error
        conn, error = login(relay.port, "rep_scram", SCRAM_PASSWORD,
                            client_tls(secure) + " channel_binding=require")
        assert conn is None
        assert "channel binding is required, but server did not offer" in error


@pytest.mark.server
@pytest.mark.parametrize("case", ["a", "b"])
def test_tls_clients_stream_through_the_relay_with_scram(
    secure: SecureSetup, archive_dir: Path, case: str
) -> None:
    """``receivewal stream`` over TLS to the relay, scram-sha-256, zstd: the archive equals
    the server's pg_wal."""
    log_path = archive_dir.parent / "receivewal.log"
    binding = " channel_binding=disable" if case == "b" else ""
    with running_relay(secure.server.port, extra=case_options(secure, case)) as relay:
        proc = start_receivewal(
            "stream", "-D", str(archive_dir), "-d",
            f"host=127.0.0.1 port={relay.port} user=rep_scram {client_tls(secure)}{binding}",
            "--compression", "zstd", "--no-sync", stderr_path=log_path,
            env={"PGPASSWORD": SCRAM_PASSWORD})
        try:
            wait_for(lambda: "streaming_started" in log_path.read_text(), what="streaming")
            secure.server.generate_wal(1)
            wait_for(lambda: len(complete_segments(archive_dir)) >= 1, what="a segment")
        finally:
            assert stop(proc) == 0
    assert assert_identical_to_server(archive_dir, secure.server)
    events = [json.loads(line) for line in log_path.read_text().splitlines()
              if line.startswith("{")]
    assert {e["algorithm"] for e in events if e["event"] == "stream_compression"} == {"zstd"}
    (connected,) = [e for e in relay.named("relay_client_connected") if e["replication"]]
    assert connected["client_tls"] is True
    assert connected["compression"] == "zstd"


@pytest.mark.server
def test_mutual_tls_refuses_a_client_without_a_certificate(secure: SecureSetup) -> None:
    options = (*case_options(secure, "a"), "--tls-ca", str(secure.ca.cert))
    with running_relay(secure.server.port, extra=options) as relay:
        conn, error = login(relay.port, "rep_scram", SCRAM_PASSWORD, client_tls(secure))
        assert conn is None
        assert "requires a client certificate signed by its --tls-ca" in error
        conn, error = login(relay.port, "rep_scram", SCRAM_PASSWORD,
                            f"{client_tls(secure)} sslcert={secure.client_cert.cert} "
                            f"sslkey={secure.client_cert.key}")
        assert conn is not None, error
        identify(conn)


# -- who may connect, and how ----------------------------------------------------------------


@pytest.mark.server
def test_plaintext_to_a_non_loopback_listener_is_refused(secure: SecureSetup) -> None:
    """Listening on every interface (0.0.0.0) makes TLS required by default, even for a client
    that happens to come over 127.0.0.1: the listener decides, not the peer."""
    with running_relay(secure.server.port, listen_host="0.0.0.0",  # noqa: S104 - the point
                       extra=secure.tls_options(secure.relay_cert)) as relay:
        conn, error = login(relay.port, "rep_scram", SCRAM_PASSWORD, "sslmode=disable")
        assert conn is None
        assert "receivewal relay requires TLS" in error
        conn, error = login(relay.port, "rep_scram", SCRAM_PASSWORD,
                            client_tls(secure) + " channel_binding=disable")
        assert conn is not None, error
        identify(conn)


def test_a_non_loopback_listener_without_a_certificate_does_not_start() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "receivewal", "relay", "--listen", "0.0.0.0:0",
         "--upstream", "127.0.0.1:5432"], capture_output=True, text=True, check=False,
        timeout=60)
    assert out.returncode == 1
    assert "not a loopback address" in out.stderr
    assert "--client-tls disable" in out.stderr


def test_startup_parameters_reach_the_upstream_byte_for_byte() -> None:
    """A latin-1 user name and non-UTF-8 options go upstream unchanged, only the streampack
    request is taken out of ``options``."""
    upstream = CapturingUpstream()
    try:
        def packet(options: bytes) -> bytes:
            body = (b"user\x00r\xe9lay\x00database\x00caf\xe9\x00replication\x00true\x00"
                    b"options\x00" + options + b"\x00application_name\x00\xff\xfe\x00\x00")
            return struct.pack(">II", 8 + len(body), 196608) + body
        with running_relay(upstream.port) as relay:
            reply = raw_startup(relay.port, packet(
                b"-c x=\xe9 -c pg_streampack.requested=zstd -c y=1"))
        assert b"Mupstream" in reply
        assert upstream.received == [packet(b"-c x=\xe9 -c y=1")]
    finally:
        upstream.close()


@pytest.mark.server
def test_a_non_utf8_user_name_arrives_unchanged(secure: SecureSetup) -> None:
    """The server's own answer names the user it received: the same bytes directly and
    through the relay (the rest of the message differs: the relay's upstream leg is TLS)."""
    conninfo = b"host=127.0.0.1 user=r\xe9lay dbname=postgres sslmode=disable port="

    def error(port: int) -> bytes:
        conn = pq.PGconn.connect(conninfo + str(port).encode())
        assert conn.status != pq.ConnStatus.OK
        message = conn.error_message
        conn.finish()
        named = re.search(rb'user "[^"]*"', message)
        assert named is not None, message
        return named.group()

    direct = error(secure.server.port)
    assert direct == b'user "r\xe9lay"'
    with running_relay(secure.server.port) as relay:
        assert error(relay.port) == direct


def test_a_client_outside_the_allow_list_is_refused_before_the_upstream() -> None:
    upstream = CapturingUpstream()
    try:
        startup = build_startup_packet({"user": "u", "database": "d"})
        with running_relay(upstream.port, extra=("--allow", "127.0.0.2/32")) as relay:
            refused = raw_startup(relay.port, startup)
            assert upstream.received == []
            allowed = raw_startup(relay.port, startup, source="127.0.0.2")
        assert refused[:1] == b"E"
        assert b"127.0.0.1 is not in the relay's --allow list" in refused
        assert b"Mupstream" in allowed
        assert upstream.received == [startup]
    finally:
        upstream.close()


@pytest.mark.server
def test_the_connection_cap_refuses_the_next_and_serves_again(secure: SecureSetup) -> None:
    with running_relay(secure.server.port, extra=("--max-connections", "2")) as relay:
        first, error = login(relay.port, "rep_scram", SCRAM_PASSWORD, "sslmode=disable")
        assert first is not None, error
        second, error = login(relay.port, "rep_scram", SCRAM_PASSWORD, "sslmode=disable")
        assert second is not None, error
        third, error = login(relay.port, "rep_scram", SCRAM_PASSWORD, "sslmode=disable")
        assert third is None
        assert "too many connections" in error
        identify(first)
        served: list[pq.abc.PGconn] = []

        def serves_again() -> bool:
            conn, _ = login(relay.port, "rep_scram", SCRAM_PASSWORD, "sslmode=disable")
            served.extend([conn] if conn is not None else [])
            return conn is not None

        wait_for(serves_again, timeout=30, what="the relay to serve again")
        identify(served[0])
        identify(second)
    assert relay.named("relay_client_refused")




@pytest.mark.server
def test_plaintext_sent_after_an_ssl_request_is_not_taken_as_tls(secure: SecureSetup) -> None:
    """A startup packet pipelined behind the SSLRequest (CVE-2021-23214's injection) is read
    by the TLS layer, fails the handshake, and never reaches the upstream."""
    upstream = CapturingUpstream()
    try:
        with running_relay(upstream.port, extra=secure.tls_options(secure.relay_cert)) as relay:
            reply = raw_startup(relay.port, struct.pack(">II", 8, SSL_REQUEST)
                                + build_startup_packet({"user": "u", "database": "d"}))
        assert reply[:1] == b"S"
        assert b"E" not in reply[1:2]
        assert upstream.received == []
    finally:
        upstream.close()
