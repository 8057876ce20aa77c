"""``receivewal relay`` and the protocol version a client asks for (issue 18, item 5).

libpq 18 can ask for protocol 3.2 (``max_protocol_version=3.2``, as psycopg's binary wheel
bundles it); a future client may ask for 3.x or send ``_pq_`` options. Whatever it asks, the
relay takes the same path: TLS toward the upstream as ``--upstream-sslmode`` says, streampack
compression as negotiated, and protocol 3.0 on both legs (the client is told so with
NegotiateProtocolVersion, as a 3.0 server would tell it).
"""

from __future__ import annotations

import struct

import pytest
from psycopg import pq
from support.servers import PgServer
from support.streams import wait_for
from support.wire import CapturingUpstream, raw_startup
from test_relay import connect, running_relay, stream_one_segment
from test_relay_security import SecureSetup, secure

from receivewal.relay.protocol import CANCEL_REQUEST, build_startup_packet

__all__ = ["secure"]  # the module's fixture, used here too

PROTOCOL_3_2 = "max_protocol_version=3.2"


def verify_full_upstream(setup: SecureSetup) -> tuple[str, ...]:
    return ("--upstream-sslmode", "verify-full", "--upstream-sslrootcert", str(setup.ca.cert))


def backend_ssl(server: PgServer, application_name: str) -> str:
    """What pg_stat_ssl says about the server's backend for ``application_name``."""
    return server.sql("SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
                      f"WHERE a.application_name = '{application_name}'")


@pytest.mark.server
def test_a_protocol_3_2_client_gets_a_tls_upstream_and_compression(
    secure: SecureSetup,
) -> None:
    """A real libpq 18 client asking for 3.2 through a relay with --upstream-sslmode
    verify-full: the server sees TLS (pg_stat_ssl), the WAL comes compressed with zstd and
    byte-identical, the client ends on protocol 3.0, and the relay logs the downgrade."""
    with running_relay(secure.server.port, extra=verify_full_upstream(secure)) as relay:
        conn = connect(relay.port, "zstd",
                       extra=f"sslmode=disable {PROTOCOL_3_2} application_name=proto32")
        try:
            assert conn.full_protocol_version == 30000
            assert backend_ssl(secure.server, "proto32") == "t"
        finally:
            conn.finish()
        receiver = stream_one_segment(secure.server, relay.port, "zstd", extra=PROTOCOL_3_2)
    assert receiver.decoder.algorithm == "zstd"
    assert receiver.compressed_on_wire > 0
    connected = [e for e in relay.named("relay_client_connected") if e["replication"]]
    assert len(connected) == 2
    assert all(e["upstream_tls"] is True and e["compression"] == "zstd" for e in connected)
    downgraded = relay.named("relay_protocol_downgraded")
    assert [e["requested"] for e in downgraded] == ["3.2", "3.2"]


@pytest.mark.server
def test_a_client_that_requires_3_2_is_refused_with_a_clear_error(secure: SecureSetup) -> None:
    """min_protocol_version=3.2: libpq itself refuses the relay's 3.0, naming the versions;
    nothing goes around the relay's TLS path."""
    with running_relay(secure.server.port, extra=verify_full_upstream(secure)) as relay, \
            pytest.raises(ConnectionError, match=r"3\.0"):
        connect(relay.port, None, extra=f"sslmode=disable {PROTOCOL_3_2} "
                "min_protocol_version=3.2")


def startup_with_version(major: int, minor: int, parameters: list[tuple[bytes, bytes]]) -> bytes:
    body = b"".join(name + b"\x00" + value + b"\x00" for name, value in parameters) + b"\x00"
    return struct.pack(">IHH", 8 + len(body), major, minor) + body


def test_unknown_minor_versions_and_pq_options_are_negotiated_down_to_3_0() -> None:
    """Protocol 3.99 with ``_pq_`` options: the upstream gets a 3.0 startup packet without
    them (over the relay's usual path), the client a NegotiateProtocolVersion naming 3.0 and
    the options nobody recognised, then the upstream's answer."""
    upstream = CapturingUpstream()
    try:
        parameters = [(b"user", b"u"), (b"_pq_.future", b"1"), (b"database", b"d"),
                      (b"_pq_.other", b"x")]
        with running_relay(upstream.port) as relay:
            reply = raw_startup(relay.port, startup_with_version(3, 99, parameters))
        assert upstream.received == [build_startup_packet({"user": "u", "database": "d"})]
        options = b"_pq_.future\x00_pq_.other\x00"
        negotiate = b"v" + struct.pack(">III", 12 + len(options), 196608, 2) + options
        assert reply.startswith(negotiate)
        assert b"Mupstream" in reply[len(negotiate):]
        (downgraded,) = relay.named("relay_protocol_downgraded")
        assert downgraded["requested"] == "3.99"
        assert downgraded["options"] == "_pq_.future,_pq_.other"
    finally:
        upstream.close()


@pytest.mark.parametrize(("major", "minor"), [(2, 0), (4, 0), (1234, 5690)])
def test_an_unsupported_major_version_is_refused_before_the_upstream(
    major: int, minor: int,
) -> None:
    """Anything but protocol 3 gets the server's own FATAL and never reaches the upstream
    (no plaintext pass-through around the relay's TLS path)."""
    upstream = CapturingUpstream()
    try:
        with running_relay(upstream.port) as relay:
            reply = raw_startup(relay.port, startup_with_version(major, minor, [
                (b"user", b"u")]))
        assert reply[:1] == b"E"
        assert f"unsupported frontend protocol {major}.{minor}".encode() in reply
        assert upstream.received == []
        assert relay.named("relay_startup_refused")
    finally:
        upstream.close()


@pytest.mark.parametrize("sslmode", ["prefer", "require"])
def test_a_cancel_request_goes_upstream_as_the_sslmode_says(sslmode: str) -> None:
    """A CancelRequest is forwarded after an SSLRequest like every other connection, never
    straight in plaintext: with ``prefer`` it goes on after the stand-in's N, with
    ``require`` it is not sent at all."""
    upstream = CapturingUpstream()
    try:
        cancel = struct.pack(">IIII", 16, CANCEL_REQUEST, 1234, 5678)
        with running_relay(upstream.port, extra=("--upstream-sslmode", sslmode)) as relay:
            raw_startup(relay.port, cancel)
        if sslmode == "prefer":
            assert upstream.received == [cancel]
            assert upstream.ssl_requests == [1]
        else:
            assert upstream.received == []
            (unreachable,) = relay.named("relay_upstream_unreachable")
            assert "does not support SSL" in unreachable["error"]
    finally:
        upstream.close()


@pytest.mark.server
def test_a_query_is_cancelled_through_a_verify_full_relay(secure: SecureSetup) -> None:
    """The cancel reaches the real server over the relay's TLS upstream leg and works."""
    with running_relay(secure.server.port, extra=verify_full_upstream(secure)) as relay:
        conn = connect(relay.port, None, replication=None,
                       extra=f"sslmode=disable {PROTOCOL_3_2}")
        try:
            conn.send_query(b"SELECT pg_sleep(60)")
            wait_for(lambda: "pg_sleep" in secure.server.sql(
                "SELECT string_agg(query, ' ') FROM pg_stat_activity WHERE state = 'active'"),
                what="the query to run")
            conn.get_cancel().cancel()
            res = conn.get_result()
            assert res is not None
            assert res.status == pq.ExecStatus.FATAL_ERROR
            assert "canceling statement due to user request" in conn.get_error_message()
        finally:
            conn.finish()
