"""``receivewal logical --compression zstd`` and ``--compression lz4`` through a real
``receivewal relay`` in front of a PostgreSQL 15 without pg_streampack (wal_level=logical): the
relay compresses the logical stream, the receiver decodes it with the streampack decoder, and
its change log, replayed into a copy of the starting database, gives the primary's tables.
The receiver's log, metrics and status show that the stream really was compressed (the
negotiated algorithm, compressed frames, fewer bytes on the wire than the plugin sent), and
status speaks of a change log, not of WAL segments. One workload
(support.logical.run_workload), two receivers, one slot each."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.changelog import read_log
from support.logical import (
    LOGICAL_CONF,
    TABLES,
    current_lsn,
    prepare_database,
    run_workload,
)
from support.replay import compare_tables, replay
from support.servers import PgServer, free_port, running_server
from support.streams import log_events, receivewal, start_receivewal, stop
from test_relay import RelayProcess, running_relay

from receivewal.daemon.state import read_state

pytestmark = [pytest.mark.server, pytest.mark.slow]
ALGORITHMS = ["zstd", "lz4"]


@dataclass
class Primary:
    pg: PgServer
    relay: RelayProcess
    end: int  # the WAL position after the workload

    def dsn(self, dbname: str, port: int | None = None) -> str:
        return f"host=127.0.0.1 port={port or self.pg.port} user=postgres dbname={dbname}"


@pytest.fixture(scope="module")
def primary() -> Iterator[Primary]:
    """Database app with a publication and one slot per algorithm (made by the command,
    through the relay) before the workload; start, app's state before it; the relay
    (zstd and lz4 offered) in front of the server for the whole module."""
    with running_server(LOGICAL_CONF) as pg, running_relay(pg.port) as relay:
        primary = Primary(pg, relay, 0)
        prepare_database(pg, "app")
        pg.sql("CREATE DATABASE start TEMPLATE app")
        pg.sql("CREATE PUBLICATION pub FOR ALL TABLES", "app")
        for algorithm in ALGORITHMS:
            made = receivewal("logical", "-d", primary.dsn("app", relay.port), "-S", algorithm,
                              "--create-slot", "--two-phase", "--log-format", "json")
            assert made.returncode == 0, made.stderr[-3000:]
        run_workload(pg, "app")
        primary.end = current_lsn(pg, "app")
        yield primary


def scrape(port: int) -> dict[str, str]:
    """The metrics endpoint's samples (name with labels: value) and HELP texts (HELP name:
    text)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
        text = page.read().decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP "):].partition(" ")
            samples[f"HELP {name}"] = help_text
        elif line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = value
    return samples


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_change_log_received_through_the_compressing_relay_replays_into_the_primarys_tables(
        primary: Primary, tmp_path: Path, algorithm: str) -> None:
    """The receiver runs until the slot is confirmed past the workload (its metrics scraped
    meanwhile), then SIGTERM: exit 0. Its log says the stream was ``algorithm`` and most
    frames were compressed, the wire bytes under 70% of the plain stream's; the metrics and
    ``receivewal status`` carry the algorithm and a compression ratio above 1.4, status in a
    change log's words; the change log replays into the primary's tables (text for zstd, binary
    for lz4)."""
    out = tmp_path / "log"
    out.mkdir()
    port = free_port()
    stderr = tmp_path / "stderr"
    proc = start_receivewal(
        "logical", "-D", str(out), "-S", algorithm, "-P", "pub", "--two-phase", "--messages",
        *(["--binary"] if algorithm == "lz4" else []), "--compression", algorithm,
        "-d", primary.dsn("app", primary.relay.port), "-s", "0.2", "--log-format", "json",
        "--metrics-address", f"127.0.0.1:{port}", stderr_path=stderr)
    try:
        deadline = time.monotonic() + 60
        while (state := read_state(out)) is None or state.flushed_lsn is None \
                or state.flushed_lsn < primary.end:
            assert proc.poll() is None, stderr.read_text()[-3000:]
            assert time.monotonic() < deadline, stderr.read_text()[-3000:]
            time.sleep(0.1)
        metrics = scrape(port)
        status = receivewal("status", "-D", str(out))
    finally:
        assert stop(proc) == 0, stderr.read_text()[-3000:]
    events = log_events(stderr.read_text())
    negotiated = [e for e in events if e["event"] == "stream_compression"]
    assert [(e["algorithm"], e["requested"]) for e in negotiated] == [(algorithm, algorithm)]
    summary, = [e for e in events if e["event"] == "compression_summary"]
    assert summary["algorithm"] == algorithm
    frames, compressed = int(str(summary["frames"])), int(str(summary["compressed_frames"]))
    wire, plain = int(str(summary["wire_bytes"])), int(str(summary["plain_bytes"]))
    assert compressed > frames // 4 > 1000, summary  # Begins and Commits are too short
    assert wire < plain * 0.7, summary
    assert metrics[f'receivewal_compression_info{{algorithm="{algorithm}"}}'] == "1.0"
    assert 0 < float(metrics["receivewal_wire_bytes_total"]) <= wire
    assert 0 < float(metrics["receivewal_wal_bytes_total"]) <= plain
    assert float(metrics["receivewal_compression_ratio"]) > 1.4, metrics
    assert "change log files" in metrics["HELP receivewal_segments_completed_total"]
    assert status.returncode == 0, status.stdout
    lines = status.stdout.splitlines()
    compression = next(line for line in lines if line.startswith("compression:"))
    assert compression.startswith(f"compression:       {algorithm}: "), lines
    assert " plain in " in compression
    assert float(compression.rsplit("(", 1)[1].split("x)")[0]) > 1.4, compression
    assert any(line.startswith("files completed:   ") for line in lines), lines
    assert any(line.startswith("change log:        ") for line in lines), lines
    assert not [line for line in lines if "segment" in line or "backup" in line]

    records = read_log(out)
    assert {r["op"] for r in records} >= {"begin_prepare", "commit_prepared", "truncate",
                                          "message", "update", "delete"}
    target = f"replay_{algorithm}"
    primary.pg.sql(f"CREATE DATABASE {target} TEMPLATE start")
    replay(records, primary.dsn(target))
    assert compare_tables(primary.dsn("app"), primary.dsn(target), TABLES) == {}

