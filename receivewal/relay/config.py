"""What ``receivewal relay`` is asked to do, validated, and the TLS contexts it implies.

Who may connect is decided here too (pure): :func:`client_tls_mode` judges the *listen*
address, not each client's: a relay listening on every interface is reachable from the
network even when one client happens to come over 127.0.0.1 (or through a local tunnel).
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from dataclasses import dataclass

from receivewal.addresses import parse_address
from receivewal.errors import ConfigurationError
from receivewal.replication.negotiation import parse_compression_list
from receivewal.replication.streampack import StreampackEncoder

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
CLIENT_TLS_MODES = ("disable", "prefer", "require")
LOOPBACK_NETWORKS: tuple[IPNetwork, ...] = (
    ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
DEFAULT_MAX_CONNECTIONS = 100
DEFAULT_STARTUP_TIMEOUT = 10.0
MAX_STARTUP_TIMEOUT = 600.0  # as authentication_timeout's own limit


@dataclass(frozen=True, slots=True)
class RelaySettings:
    """What ``receivewal relay`` was asked to do."""

    listen_host: str
    listen_port: int
    upstream_host: str
    upstream_port: int
    offered: tuple[str, ...] = ("zstd", "lz4")
    min_size: int = 32
    zstd_level: int = 1
    upstream_sslmode: str = "prefer"
    upstream_sslrootcert: str | None = None
    client_tls: str = "disable"
    """disable: SSLRequest answered N; prefer: TLS for who asks; require: TLS or refused."""
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    """CA certificates that client certificates must chain to (mutual TLS), or None."""
    allow: tuple[IPNetwork, ...] = LOOPBACK_NETWORKS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    """Seconds a client has from connecting to its startup packet (TLS handshake included)."""


def is_loopback_host(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address (127.0.0.0/8, ::1).

    ``0.0.0.0`` and ``::`` (every interface) are not; a name is resolved.
    """
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        raise ConfigurationError(f"cannot resolve listen address {host!r}: {exc}") from exc
    return all(ipaddress.ip_address(str(info[4][0]).partition("%")[0]).is_loopback
               for info in infos)


def client_tls_mode(requested: str | None, listen_host: str, has_certificate: bool) -> str:
    """The client TLS mode: ``requested``, else ``require`` off loopback, else ``prefer``
    with a certificate and ``disable`` without. Raises ConfigurationError when TLS is needed
    and there is no certificate."""
    loopback = is_loopback_host(listen_host)
    mode = requested or ("require" if not loopback else "prefer" if has_certificate
                         else "disable")
    if mode not in CLIENT_TLS_MODES:
        raise ConfigurationError(f"invalid client TLS mode {mode!r} "
                                 f"(one of {', '.join(CLIENT_TLS_MODES)})")
    if mode != "disable" and not has_certificate:
        why = ("is not a loopback address, so clients must use TLS" if requested is None
               else f"--client-tls {mode} needs a certificate")
        raise ConfigurationError(
            f"--listen {listen_host} {why}: give --tls-cert and --tls-key "
            "(or --client-tls disable to accept plaintext on purpose)")
    return mode


def parse_allow(entries: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    """The ``--allow`` networks (CIDR or single addresses); loopback only when none."""
    if not entries:
        return LOOPBACK_NETWORKS
    try:
        return tuple(ipaddress.ip_network(entry.strip(), strict=False) for entry in entries)
    except ValueError as exc:
        raise ConfigurationError(f"invalid --allow network: {exc}") from exc


def is_allowed(peer_host: str, allow: tuple[IPNetwork, ...]) -> bool:
    """Whether a client address lies in one of the ``allow`` networks (an IPv4 client seen
    on an IPv6 socket as ``::ffff:a.b.c.d`` counts as its IPv4 address)."""
    address = ipaddress.ip_address(peer_host.partition("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in allow)


def client_ssl_context(settings: RelaySettings) -> ssl.SSLContext | None:
    """The server-side TLS context toward clients (None when client TLS is disabled)."""
    if settings.client_tls == "disable" or not settings.tls_cert:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
        if settings.tls_ca:
            context.load_verify_locations(settings.tls_ca)
            # A certificate that is sent must verify; a missing one is refused after the
            # handshake with an ErrorResponse the client can show (server.Relay).
            context.verify_mode = ssl.CERT_OPTIONAL
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(
            f"cannot load the relay's TLS files ({settings.tls_cert}, "
            f"{settings.tls_key or 'key in the same file'}, {settings.tls_ca or 'no CA'}): "
            f"{exc}") from exc
    return context


UPSTREAM_SSLMODES = ("disable", "prefer", "require", "verify-ca", "verify-full")


def upstream_ssl_context(sslmode: str, rootcert: str | None) -> ssl.SSLContext | None:
    """The TLS context for the upstream connection, following libpq's ``sslmode`` meanings.

    ``prefer`` and ``require`` encrypt without checking the certificate, ``verify-ca`` checks
    it against ``rootcert`` (the system's CAs without one), ``verify-full`` also the host name.
    """
    if sslmode not in UPSTREAM_SSLMODES:
        raise ConfigurationError(f"invalid upstream sslmode {sslmode!r} "
                                 f"(one of {', '.join(UPSTREAM_SSLMODES)})")
    if sslmode == "disable":
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if sslmode in ("prefer", "require"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    context.check_hostname = sslmode == "verify-full"
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        if rootcert:
            context.load_verify_locations(rootcert)
        else:
            context.load_default_certs()
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"cannot load upstream root certificate {rootcert}: {exc}") \
            from exc
    return context


@dataclass(frozen=True, slots=True)
class ClientAccess:
    """The options about clients, as given on the command line."""

    client_tls: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    allow: tuple[str, ...] = ()
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT


def build_relay_settings(listen: str, upstream: str, *, compression: str = "zstd,lz4",
                         min_size: int = 32, zstd_level: int = 1,
                         upstream_sslmode: str = "prefer",
                         upstream_sslrootcert: str | None = None,
                         access: ClientAccess | None = None) -> RelaySettings:
    """Validated settings for ``receivewal relay`` (raises ConfigurationError)."""
    access = access or ClientAccess()
    listen_host, listen_port = parse_address(listen, "listen address")
    upstream_host, upstream_port = parse_address(upstream, "upstream address")
    offered = parse_compression_list(compression)
    if offered:
        StreampackEncoder(offered[0], min_size, zstd_level)  # validates min size and level
    upstream_ssl_context(upstream_sslmode, upstream_sslrootcert)  # validates the TLS settings
    if access.max_connections < 1:
        raise ConfigurationError("--max-connections must be at least 1")
    if not 0 < access.startup_timeout <= MAX_STARTUP_TIMEOUT:
        raise ConfigurationError(f"--startup-timeout must be more than 0 and at most "
                                 f"{MAX_STARTUP_TIMEOUT:g} seconds")
    if access.tls_ca and not access.tls_cert:
        raise ConfigurationError("--tls-ca needs --tls-cert and --tls-key")
    settings = RelaySettings(
        listen_host, listen_port, upstream_host, upstream_port, offered, min_size, zstd_level,
        upstream_sslmode, upstream_sslrootcert,
        client_tls=client_tls_mode(access.client_tls, listen_host, bool(access.tls_cert)),
        tls_cert=access.tls_cert, tls_key=access.tls_key, tls_ca=access.tls_ca,
        allow=parse_allow(access.allow), max_connections=access.max_connections,
        startup_timeout=access.startup_timeout)
    client_ssl_context(settings)  # validates the certificate files
    return settings
