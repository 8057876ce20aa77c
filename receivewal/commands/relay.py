"""``receivewal relay``: click parses the options; the relay lives in :mod:`receivewal.relay`."""

from __future__ import annotations

import signal

import click

from receivewal.errors import ConfigurationError
from receivewal.logs import configure_logging
from receivewal.relay.server import Relay
from receivewal.relay.settings import UPSTREAM_SSLMODES, build_relay_settings


@click.command("relay")
@click.option("--listen", required=True, metavar="HOST:PORT",
              help="Address to accept receivers on (no TLS toward clients).")
@click.option("--upstream", required=True, metavar="HOST:PORT", help="The primary to relay.")
@click.option("--upstream-sslmode", type=click.Choice(UPSTREAM_SSLMODES), default="prefer",
              show_default=True, help="TLS toward the upstream, as libpq's sslmode.")
@click.option("--upstream-sslrootcert", type=click.Path(dir_okay=False),
              help="CA certificates for --upstream-sslmode verify-ca/verify-full.")
@click.option("--compression", default="zstd,lz4", show_default=True,
              help="pg_streampack algorithms offered to clients, or none.")
@click.option("--min-size", type=int, default=32, show_default=True,
              help="WAL payloads smaller than this many bytes are sent plain.")
@click.option("--zstd-level", type=int, default=1, show_default=True,
              help="zstd compression level (the module uses 1).")
@click.option("-v", "--verbose", count=True, help="More log output (debug events).")
def relay_command(*, listen: str, upstream: str, upstream_sslmode: str,
                  upstream_sslrootcert: str | None, compression: str, min_size: int,
                  zstd_level: int, verbose: int) -> int:
    """Relay a primary to receivers, compressing its WAL stream with pg_streampack.

    No TLS toward clients: run it where the link to the receivers is trusted.
    """
    configure_logging(verbose)
    try:
        settings = build_relay_settings(
            listen, upstream, compression=compression, min_size=min_size,
            zstd_level=zstd_level, upstream_sslmode=upstream_sslmode,
            upstream_sslrootcert=upstream_sslrootcert)
        relay = Relay(settings)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {listen}: {exc}") from exc
    relay.serve_forever(stop_signals=(signal.SIGTERM, signal.SIGINT))
    return 0
