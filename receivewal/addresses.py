"""``HOST:PORT`` addresses as the command line gives them (pure).

One parser for every address option: the metrics endpoint, the relay's listen and upstream
addresses.
"""

from __future__ import annotations

from typing import NamedTuple

from receivewal.errors import ConfigurationError


class Address(NamedTuple):
    """A host name or IP address (without brackets) and a TCP port."""

    host: str
    port: int


def parse_address(text: str, what: str = "address") -> Address:
    """Parse ``HOST:PORT``, ``[IPv6]:PORT`` or ``:PORT`` (all IPv4 interfaces).

    Port 0 asks the kernel for a free port. Raise ConfigurationError, naming ``what`` (e.g.
    ``"metrics address"``), for anything else.
    """
    value = text.strip()
    if value.startswith("["):
        host, sep, port_text = value[1:].partition("]:")
        if not sep or not host or "]" in host:
            raise ConfigurationError(
                f"invalid {what} {text!r}: expected [IPv6]:PORT, e.g. [::1]:5432")
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep:
            raise ConfigurationError(
                f"invalid {what} {text!r}: expected HOST:PORT, e.g. 127.0.0.1:5432")
        if ":" in host:
            raise ConfigurationError(
                f"invalid {what} {text!r}: put an IPv6 address in brackets, e.g. [::1]:5432")
        host = host or "0.0.0.0"  # noqa: S104 - ":PORT" asks for every interface on purpose
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigurationError(
            f"invalid {what} {text!r}: port must be a number from 0 to 65535")
    return Address(host, int(port_text))


def format_address(address: Address) -> str:
    """``HOST:PORT``, with brackets around an IPv6 address."""
    host = f"[{address.host}]" if ":" in address.host else address.host
    return f"{host}:{address.port}"
