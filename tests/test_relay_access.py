"""The relay's access rules and authentication filter, without a server (issue 12)."""

from __future__ import annotations

import struct

import pytest

from receivewal.errors import ConfigurationError
from receivewal.relay.backend import BackendStream
from receivewal.relay.config import client_tls_mode, is_allowed, is_loopback_host, parse_allow
from receivewal.relay.protocol import strip_channel_binding

# -- the pure parts --------------------------------------------------------------------------


def sasl_message(*mechanisms: bytes) -> bytes:
    body = struct.pack(">I", 10) + b"".join(m + b"\x00" for m in mechanisms) + b"\x00"
    return b"R" + struct.pack(">I", 4 + len(body)) + body


def test_channel_binding_is_taken_out_of_the_sasl_mechanisms() -> None:
    assert strip_channel_binding(sasl_message(b"SCRAM-SHA-256-PLUS", b"SCRAM-SHA-256")) \
        == sasl_message(b"SCRAM-SHA-256")
    other = b"R" + struct.pack(">II", 12, 5) + b"salt"  # AuthenticationMD5Password
    assert strip_channel_binding(other) == other


def test_backend_stream_strips_plus_only_until_authentication_ends() -> None:
    """Split at every byte: the SASL offer loses its -PLUS, AuthenticationOk ends the
    inspection and everything after passes unchanged."""
    ok = b"R" + struct.pack(">II", 8, 0)
    after = sasl_message(b"SCRAM-SHA-256-PLUS") + b"Z\x00\x00\x00\x05I"
    upstream = sasl_message(b"SCRAM-SHA-256-PLUS", b"SCRAM-SHA-256") + ok + after
    stream = BackendStream(None)
    out = b"".join(stream.feed(upstream[i : i + 1]) for i in range(len(upstream)))
    assert out == sasl_message(b"SCRAM-SHA-256") + ok + after
    assert not stream.authenticating


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.1.2.3", False),  # noqa: S104 - judged, not bound
])
def test_loopback_is_judged_by_the_listen_address(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_client_tls_mode_defaults() -> None:
    assert client_tls_mode(None, "127.0.0.1", has_certificate=False) == "disable"
    assert client_tls_mode(None, "127.0.0.1", has_certificate=True) == "prefer"
    assert client_tls_mode(None, "0.0.0.0", has_certificate=True) == "require"  # noqa: S104
    assert client_tls_mode("disable", "0.0.0.0", has_certificate=False) == "disable"  # noqa: S104
    with pytest.raises(ConfigurationError, match="not a loopback address"):
        client_tls_mode(None, "0.0.0.0", has_certificate=False)  # noqa: S104
    with pytest.raises(ConfigurationError, match="--client-tls require needs a certificate"):
        client_tls_mode("require", "127.0.0.1", has_certificate=False)


def test_allow_list() -> None:
    default = parse_allow(())
    assert is_allowed("127.0.0.1", default)
    assert is_allowed("::1", default)
    assert is_allowed("::ffff:127.0.0.1", default)
    assert not is_allowed("192.0.2.1", default)
    networks = parse_allow(("192.0.2.0/24", "2001:db8::1"))
    assert is_allowed("192.0.2.77", networks)
    assert is_allowed("2001:db8::1", networks)
    assert not is_allowed("127.0.0.1", networks)
    with pytest.raises(ConfigurationError, match="invalid --allow network"):
        parse_allow(("192.0.2.0/33",))
