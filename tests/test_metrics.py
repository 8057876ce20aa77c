"""Metrics: the address parser, and every metric scraped over HTTP from a running Monitor."""

from __future__ import annotations

import http.client
import math
import re
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from receivewal.daemon.endpoint import MAX_CONNECTIONS as ENDPOINT_SLOTS
from receivewal.daemon.metrics import Address, format_address, parse_address
from receivewal.daemon.monitor import Monitor
from receivewal.errors import ConfigurationError
from receivewal.wal.lsn import parse_lsn


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9187", Address("127.0.0.1", 9187)),
        ("localhost:0", Address("localhost", 0)),
        ("[::1]:9187", Address("::1", 9187)),
        ("[::]:65535", Address("::", 65535)),
        (":9187", Address("0.0.0.0", 9187)),  # noqa: S104 - what ":PORT" means
        (" 10.0.0.1:80 ", Address("10.0.0.1", 80)),
    ],
)
def test_parse_address_accepts_host_port_and_bracketed_ipv6(text: str, expected: Address) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("9187", "expected HOST:PORT"),
        ("localhost", "expected HOST:PORT"),
        ("::1:9187", "put an IPv6 address in brackets"),
        ("[::1]", "expected [IPv6]:PORT"),
        ("[::1]9187", "expected [IPv6]:PORT"),
        ("[]:9187", "expected [IPv6]:PORT"),
        ("host:", "port must be a number from 0 to 65535"),
        ("host:http", "port must be a number from 0 to 65535"),
        ("host:65536", "port must be a number from 0 to 65535"),
        ("host:-1", "port must be a number from 0 to 65535"),
    ],
)
def test_parse_address_rejects_bad_input_with_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)) as info:
        parse_address(text)
    assert repr(text) in str(info.value)


def test_format_address_brackets_ipv6() -> None:
    assert format_address(Address("::1", 9187)) == "[::1]:9187"
    assert format_address(Address("127.0.0.1", 9187)) == "127.0.0.1:9187"


def scrape(address: Address) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET /metrics; every sample as {(name, sorted labels): value}."""
    url = f"http://{format_address(address)}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_scraped_metrics_show_every_value_fed_to_the_monitor() -> None:
    now = [1_700_000_000.0]
    monitor = Monitor(None, metrics_address="127.0.0.1:0", clock=lambda: now[0], environ={})
    try:
        assert monitor.metrics_address is not None
        assert monitor.metrics_address.host == "127.0.0.1"
        assert monitor.metrics_address.port != 0

        monitor.connected("host=db1", "7300000000000000001", 1, "slot1")
        monitor.streaming_started(1, parse_lsn("0/5000000"))
        monitor.compression("zstd")
        monitor.received(parse_lsn("0/5002000"), wire_bytes=1000, wal_bytes=8192)
        monitor.received(parse_lsn("0/5004000"), wire_bytes=3000, wal_bytes=8192)
        monitor.written(parse_lsn("0/5004000"))
        monitor.flushed(parse_lsn("0/5003000"))
        monitor.keepalive(parse_lsn("0/5010000"))
        monitor.segment_completed("000000010000000000000004")
        monitor.segment_completed("000000010000000000000005")
        monitor.slot_state("slot1", parse_lsn("0/4000000"))
        monitor.timeline_switched(2)
        monitor.error("ConnectionLost", "server closed the connection")
        monitor.error("ConnectionLost", "server closed the connection")
        monitor.error("disk_full", "No space left on device")
        now[0] += 7.5

        m = scrape(monitor.metrics_address)
        assert m[("receivewal_received_lsn", ())] == parse_lsn("0/5004000")
        assert m[("receivewal_written_lsn", ())] == parse_lsn("0/5004000")
        assert m[("receivewal_flushed_lsn", ())] == parse_lsn("0/5003000")
        assert m[("receivewal_server_wal_end_lsn", ())] == parse_lsn("0/5010000")
        assert m[("receivewal_lag_bytes", ())] == parse_lsn("0/5010000") - parse_lsn("0/5003000")
        assert m[("receivewal_last_message_age_seconds", ())] == 7.5
        assert m[("receivewal_wire_bytes_total", ())] == 4000
        assert m[("receivewal_wal_bytes_total", ())] == 16384
        assert m[("receivewal_compression_ratio", ())] == 16384 / 4000
        assert m[("receivewal_compression_info", (("algorithm", "zstd"),))] == 1
        assert m[("receivewal_segments_completed_total", ())] == 2
        assert m[("receivewal_timeline", ())] == 2
        assert m[("receivewal_streaming", ())] == 1
        assert m[("receivewal_errors_total", (("kind", "ConnectionLost"),))] == 2
        assert m[("receivewal_errors_total", (("kind", "disk_full"),))] == 1
        assert m[("receivewal_slot_restart_lsn", (("slot", "slot1"),))] == parse_lsn("0/4000000")
        assert m[("receivewal_slot_active", (("slot", "slot1"),))] == 1
        assert m[("receivewal_reconnects_total", ())] == 0

        monitor.disconnected("server closed the connection")
        monitor.reconnecting(1.0)
        monitor.reconnecting(2.0)
        m = scrape(monitor.metrics_address)
        assert m[("receivewal_reconnects_total", ())] == 2
        assert m[("receivewal_streaming", ())] == 0
        assert m[("receivewal_slot_active", (("slot", "slot1"),))] == 0
    finally:
        monitor.close()


def test_before_any_message_age_counts_from_start_and_ratio_is_nan() -> None:
    now = [1000.0]
    monitor = Monitor(None, metrics_address="127.0.0.1:0", clock=lambda: now[0], environ={})
    try:
        now[0] += 3
        assert monitor.metrics_address is not None
        m = scrape(monitor.metrics_address)
        assert m[("receivewal_last_message_age_seconds", ())] == 3
        assert math.isnan(m[("receivewal_compression_ratio", ())])
        assert m[("receivewal_compression_info", (("algorithm", "none"),))] == 1
        assert m[("receivewal_lag_bytes", ())] == 0
    finally:
        monitor.close()


def test_metrics_on_ipv6_loopback() -> None:
    if not socket.has_ipv6:
        pytest.fail("this host has no IPv6 support")
    monitor = Monitor(None, metrics_address="[::1]:0", environ={})
    try:
        assert monitor.metrics_address is not None
        assert monitor.metrics_address.host == "::1"
        assert ("receivewal_streaming", ()) in scrape(monitor.metrics_address)
    finally:
        monitor.close()


def test_a_metrics_address_in_use_is_a_configuration_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigurationError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            Monitor(None, metrics_address=f"127.0.0.1:{port}", environ={})


def test_close_stops_the_endpoint() -> None:
    monitor = Monitor(None, metrics_address="127.0.0.1:0", environ={})
    address = monitor.metrics_address
    assert address is not None
    monitor.close()
    with pytest.raises(OSError, match="refused"):
        scrape(address)


def test_without_an_address_prometheus_client_is_never_imported() -> None:
    """The daemon's start-up does not pay for prometheus-client and its HTTP server modules
    unless --metrics-address asks for them (a fresh interpreter shows what gets imported)."""
    code = (
        "import sys\n"
        "from receivewal.commands.stream import stream_command\n"
        "from receivewal.daemon.monitor import Monitor\n"
        "m = Monitor(None, environ={})\n"
        "m.connected('host=db1', '1', 1, 'slot1')\n"
        "m.streaming_started(1, 0x5000000)\n"
        "m.received(0x5002000, wire_bytes=10, wal_bytes=20)\n"
        "m.segment_completed('000000010000000000000005')\n"
        "m.error('ConnectionLost', 'gone')\n"
        "m.reconnecting(1.0)\n"
        "m.close()\n"
        "print(sorted(n for n in sys.modules if n.startswith(('prometheus_client', 'wsgiref'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True)
    assert out.stdout.strip() == "[]"


def test_clients_dripping_a_request_byte_by_byte_do_not_hold_the_endpoint() -> None:
    """As many clients as the endpoint serves at once (8), each sending its request one byte
    every 2 s (never silent for the 5 s a read may take, never done): /metrics is refused
    while they hold every slot, each of them is closed once it has had its 5 s in all, and
    /metrics answers again while they would still be dripping."""
    monitor = Monitor(None, metrics_address="127.0.0.1:0", environ={})
    address = monitor.metrics_address
    assert address is not None
    stop = threading.Event()
    connected = threading.Semaphore(0)
    held_for: list[float] = []

    def drip() -> None:
        """Send a byte every 2 s until the server closes the connection (or the test ends)."""
        with socket.create_connection((address.host, address.port), timeout=30) as sock:
            opened = time.monotonic()
            connected.release()
            for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"x" * 100:
                try:
                    sock.sendall(bytes([byte]))
                    readable, _, _ = select.select([sock], [], [], 2)
                    if readable and not sock.recv(4096):
                        break  # the server closed it
                except OSError:
                    break
                if stop.is_set():
                    return
            held_for.append(time.monotonic() - opened)

    drippers = [threading.Thread(target=drip) for _ in range(ENDPOINT_SLOTS)]
    try:
        for thread in drippers:
            thread.start()
        for _ in drippers:
            assert connected.acquire(timeout=30)
        time.sleep(0.2)  # the server has taken every one of them
        # every slot is held: a scrape is closed at once (reset, or closed before the answer)
        with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
            scrape(address)
        began, answered = time.monotonic(), None
        while time.monotonic() - began < 15:
            try:
                scrape(address)
            except OSError:
                time.sleep(0.2)
                continue
            answered = time.monotonic() - began
            break
        assert answered is not None, "/metrics did not answer in 15 s while 8 clients dripped"
        for thread in drippers:
            thread.join(timeout=15)
    finally:
        stop.set()
        for thread in drippers:
            thread.join()
        monitor.close()
    assert answered < 6, answered
    assert len(held_for) == ENDPOINT_SLOTS, held_for
    assert all(4.5 < seconds < 7 for seconds in held_for), held_for
