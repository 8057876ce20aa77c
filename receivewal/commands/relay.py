"""``receivewal relay``: click parses the options; the relay lives in :mod:`receivewal.relay`."""

from __future__ import annotations

import signal

import click

from receivewal.addresses import Address, format_address, parse_address
from receivewal.commands import catalog
from receivewal.commands.clickoptions import click_option
from receivewal.errors import ConfigurationError
from receivewal.logs import configure_logging
from receivewal.relay.client import relay_log
from receivewal.relay.config import (
    CLIENT_TLS_MODES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_STARTUP_TIMEOUT,
    UPSTREAM_SSLMODES,
    ClientAccess,
    build_relay_settings,
)
from receivewal.relay.server import Relay

PEM = click.Path(exists=True, dir_okay=False)


@click.command("relay")
@click.option("--listen", required=True, metavar="HOST:PORT",
              help="Address to accept receivers on; off loopback, clients must use TLS.")
@click.option("--upstream", required=True, metavar="HOST:PORT", help="The primary to relay.")
@click.option("--tls-cert", type=PEM, metavar="PEM",
              help="Certificate for TLS toward clients (the relay itself sees the stream).")
@click.option("--tls-key", type=PEM, metavar="PEM", help="The private key of --tls-cert.")
@click.option("--tls-ca", type=PEM, metavar="PEM",
              help="Require client certificates signed by these CAs (mutual TLS).")
@click.option("--client-tls", type=click.Choice(CLIENT_TLS_MODES),
              help="TLS toward clients [default: require unless --listen is loopback].")
@click.option("--allow", multiple=True, metavar="CIDR",
              help="Client networks let in, others refused (repeatable) [default: loopback only].")
@click.option("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
              show_default=True, help="Clients served at once; more get 'too many connections'.")
@click.option("--startup-timeout", type=float, default=DEFAULT_STARTUP_TIMEOUT,
              show_default=True, metavar="SECONDS",
              help="Time a client has to send its startup packet (TLS handshake included).")
@click.option("--upstream-sslmode", type=click.Choice(UPSTREAM_SSLMODES), default="prefer",
              show_default=True,
              help="TLS toward the upstream (libpq's sslmode); with TLS, clients need "
                   "channel_binding=disable.")
@click.option("--upstream-sslrootcert", type=click.Path(dir_okay=False),
              help="CA certificates for --upstream-sslmode verify-ca/verify-full.")
@click_option(catalog.COMPRESSION.but(
    help="pg_streampack algorithms offered to clients, or none."),
    default="zstd,lz4", show_default=True)
@click.option("--min-size", type=int, default=32, show_default=True,
              help="WAL payloads smaller than this many bytes are sent plain.")
@click.option("--zstd-level", type=int, default=1, show_default=True,
              help="zstd compression level (the module uses 1).")
@click_option(catalog.METRICS_ADDRESS.but(
    help="Serve Prometheus metrics at /metrics on this address: clients served and "
    "negotiating, refusals by reason, start-up timeouts."))
@click_option(catalog.VERBOSE, count=True)
def relay_command(*, listen: str, upstream: str, tls_cert: str | None, tls_key: str | None,
                  tls_ca: str | None, client_tls: str | None, allow: tuple[str, ...],
                  max_connections: int, startup_timeout: float, upstream_sslmode: str,
                  upstream_sslrootcert: str | None, compression: str, min_size: int,
                  zstd_level: int, metrics_address: str | None, verbose: int) -> int:
    """Relay a primary to receivers, compressing its WAL stream with pg_streampack.

    The primary sees the relay's address: write pg_hba rules for it, never trust.
    """
    configure_logging(verbose)
    access = ClientAccess(client_tls=client_tls, tls_cert=tls_cert, tls_key=tls_key,
                          tls_ca=tls_ca, allow=allow, max_connections=max_connections,
                          startup_timeout=startup_timeout)
    try:
        settings = build_relay_settings(
            listen, upstream, compression=compression, min_size=min_size,
            zstd_level=zstd_level, upstream_sslmode=upstream_sslmode,
            upstream_sslrootcert=upstream_sslrootcert, access=access)
        address = parse_address(metrics_address, "metrics address") if metrics_address \
            else None
        relay = Relay(settings)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {listen}: {exc}") from exc
    endpoint = None
    if address is not None:
        from receivewal.daemon.endpoint import serve_collector  # noqa: PLC0415 - only then

        try:
            endpoint = serve_collector(address, relay.stats)
        except ConfigurationError as exc:
            raise click.ClickException(str(exc)) from exc
        host, port = endpoint.server_address[:2]
        relay_log().info("metrics_serving", address=format_address(Address(str(host), port)))
    try:
        relay.serve_forever(stop_signals=(signal.SIGTERM, signal.SIGINT))
    finally:
        if endpoint is not None:
            endpoint.shutdown()
            endpoint.server_close()
    return 0
