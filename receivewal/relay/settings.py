"""What ``receivewal relay`` is asked to do, validated, and the TLS contexts it implies."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from receivewal.addresses import parse_address
from receivewal.errors import ConfigurationError
from receivewal.replication.streampack import StreampackEncoder, parse_compression_list


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


def build_relay_settings(listen: str, upstream: str, *, compression: str = "zstd,lz4",
                         min_size: int = 32, zstd_level: int = 1,
                         upstream_sslmode: str = "prefer",
                         upstream_sslrootcert: str | None = None) -> RelaySettings:
    """Validated settings for ``receivewal relay`` (raises ConfigurationError)."""
    listen_host, listen_port = parse_address(listen, "listen address")
    upstream_host, upstream_port = parse_address(upstream, "upstream address")
    offered = parse_compression_list(compression)
    if offered:
        StreampackEncoder(offered[0], min_size, zstd_level)  # validates min size and level
    upstream_ssl_context(upstream_sslmode, upstream_sslrootcert)  # validates the TLS settings
    return RelaySettings(listen_host, listen_port, upstream_host, upstream_port, offered,
                         min_size, zstd_level, upstream_sslmode, upstream_sslrootcert)
