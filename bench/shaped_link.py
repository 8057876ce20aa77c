"""The shaped link of bench/slow_link.py: two network namespaces of this process's own joined
by a veth pair, a token bucket on both ends, and a watch on the bytes that cross it."""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNET = 0x40000000
SERVER_ADDR = "10.200.0.1"
CLIENT_ADDR = "10.200.0.2"


@dataclass(frozen=True)
class Link:
    """The two namespaces and the veth ends between them."""

    server_ns: str
    client_ns: str
    server_if: str
    client_if: str



def setns(path: str) -> None:
    """Move the calling process (thread) into the network namespace at ``path``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


def run(*argv: str) -> None:
    """Run a set-up command; on failure, raise with its own error message."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")


def ip(*args: str) -> None:
    run("ip", *args)


@contextlib.contextmanager
def private_link() -> Iterator[Link]:
    """Two fresh namespaces joined by a veth pair; this process runs in the server's one."""
    tag = f"{os.getpid() % 100000}"
    link = Link(f"rwslow-srv-{tag}", f"rwslow-cli-{tag}", f"rws{tag}s", f"rws{tag}c")
    root = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        for ns in (link.server_ns, link.client_ns):
            ip("netns", "add", ns)
        ip("-n", link.server_ns, "link", "add", link.server_if, "type", "veth",
           "peer", "name", link.client_if, "netns", link.client_ns)
        for ns, dev, addr in ((link.server_ns, link.server_if, SERVER_ADDR),
                              (link.client_ns, link.client_if, CLIENT_ADDR)):
            ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        setns(f"/run/netns/{link.server_ns}")
        yield link
    finally:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.setns(root, CLONE_NEWNET)
        os.close(root)
        for ns in (link.server_ns, link.client_ns):  # deleting a namespace deletes its veth
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def shape(link: Link, mbit: int) -> None:
    """Token bucket at ``mbit`` Mbit/s on both veth ends (bucket: 10 ms of traffic, >= 16 kB)."""
    burst = max(mbit * 1_000_000 // 8 // 100, 16_384)
    for ns, dev in ((link.server_ns, link.server_if), (link.client_ns, link.client_if)):
        run("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
            "rate", f"{mbit}mbit", "burst", str(burst), "latency", "50ms")


class LinkWatch:
    """Samples a device's byte count every 2 ms in a thread, to say when the link was busy."""

    def __init__(self, dev: str) -> None:
        self.dev = dev
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)  # same namespace as this thread

    def __enter__(self) -> LinkWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.samples.append((time.monotonic(), link_bytes(self.dev)))

    def busy(self) -> tuple[float, float]:
        """The samples that passed 1 % and 99 % of the bytes moved: the transfer itself,
        without the hand-shakes before and the tail after."""
        first, last = self.samples[0][1], self.samples[-1][1]
        moved = max(last - first, 1)
        begin = next(t for t, n in self.samples if n - first >= moved / 100)
        end = next(t for t, n in self.samples if n - first >= moved * 99 / 100)
        return begin, end


def link_bytes(dev: str) -> int:
    """rx + tx bytes of a device of this process's namespace (its /proc/net/dev)."""
    for line in Path("/proc/self/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == dev:
            fields = counters.split()
            return int(fields[0]) + int(fields[8])
    raise LookupError(f"no device {dev}")


def free_port(host: str) -> int:
    """A TCP port nothing listens on at ``host`` (an address of this namespace)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
