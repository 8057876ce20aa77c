"""Every benchmark in bench/ still runs: one tiny round of each, through its own set-up path.

The benchmarks start their own servers, relays and namespaces; a change to the product that
breaks one of them (an option renamed, a relay that refuses the bench's listener) fails here
instead of rotting until someone runs it by hand. The figures they print are not checked: only
that the run finishes, verifies its archives where it does, and prints its table.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IS_ROOT = os.geteuid() == 0

pytestmark = [pytest.mark.server, pytest.mark.slow]


def run_bench(script: str, *args: str) -> str:
    """Run ``bench/<script>`` as the README quotes it; its output (the run must exit 0)."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT,
                          capture_output=True, text=True, check=False, timeout=240)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_stream_throughput_bench_runs() -> None:
    out = run_bench("stream_throughput.py", "--gb", "0.04", "--runs", "1")
    assert "pg_receivewal" in out
    assert "receivewal" in out.replace("pg_receivewal", "")


def test_relay_throughput_bench_runs() -> None:
    out = run_bench("relay_throughput.py", "--scale", "1", "--seconds", "1", "--rounds", "1")
    assert "zstd" in out
    assert "lz4" in out


def test_relay_throughput_bench_runs_bulk_wal_against_a_baseline_tree() -> None:
    """The 2 GB mode's set-up (bulk-INSERT WAL held by a slot) and a relay imported from
    another source tree (here this one), alternated with this tree's."""
    out = run_bench("relay_throughput.py", "--gb", "0.03", "--modes", "relay zstd",
                    "--rounds", "1", "--baseline", str(ROOT))
    assert "bulk INSERTs" in out
    assert "relay zstd (baseline)" in out.splitlines()[-1]


def test_verify_throughput_bench_runs() -> None:
    out = run_bench("verify_throughput.py", "--segments", "1", "--pgbench-seconds", "1",
                    "--repeats", "1", "--segment-mb", "1", "--scale", "1")
    assert "pg_waldump" in out


@pytest.mark.skipif(not IS_ROOT, reason="network namespaces and tc need root")
@pytest.mark.skipif(shutil.which("tc") is None, reason="needs tc (iproute2)")
def test_slow_link_bench_runs_through_the_relay() -> None:
    """The relay on the shaped link starts (a non-loopback listener needs its TLS and allow
    options set by the bench) and both receivers' archives equal the server's pg_wal."""
    out = run_bench("slow_link.py", "--rates", "100", "--scale", "1", "--transactions", "50",
                    "--modes", "pg_receivewal,receivewal zstd", "--trace", "--rounds", "2")
    assert out.count("archive identical") == 4
    assert "receivewal zstd" in out.splitlines()[-1]  # the spread of its two runs
    assert "spread of the runs" in out
    assert out.count("-- link: 99 % of the bytes moved") == 4  # --trace: the receivers' lines
    assert '"streaming_started"' in out


@pytest.mark.skipif(not IS_ROOT, reason="network namespaces and tc need root")
@pytest.mark.skipif(shutil.which("tc") is None, reason="needs tc (iproute2)")
def test_slow_link_bench_grows_the_wal_to_the_volume_asked() -> None:
    """--mb scales pgbench's initialisation and transactions together; the table says the
    share of the byte ratio by wall time and by stream time."""
    out = run_bench("slow_link.py", "--rates", "100", "--mb", "8", "--modes",
                    "pg_receivewal,receivewal lz4")
    assert "(-i -s 1, 2 x 286 transactions)" in out.splitlines()[0]
    assert out.count("archive identical") == 2
    assert "stream x" in out.splitlines()[-3]


def test_recovery_bench_runs() -> None:
    """cp and receivewal restore (a plain archive, a zstd archive with prefetch, and the zstd
    archive's files in a local S3 server) each recover the base backup to the primary's data.
    The other modes run the same code paths with other options (the restore tests cover them)."""
    out = run_bench("recovery.py", "--segments", "1", "--rounds", "1", "--scale", "1",
                    "--modes", "cp,plain,zstd-prefetch,bucket")
    assert out.count("data equal") == 4
    assert "vs cp" in out


def test_upload_throughput_bench_runs() -> None:
    """Both uploaders put the files into the local SeaweedFS, and the daemon catches up with
    and without --upload-to."""
    out = run_bench("upload_throughput.py", "--gb", "0.05", "--wal-gb", "0.03", "--rounds", "1")
    assert "receivewal / transfer manager" in out
    assert "with / without" in out


def test_encryption_throughput_bench_runs() -> None:
    """receivewal's three ways and the age command line each give the input back."""
    out = run_bench("encryption_throughput.py", "--mb", "4", "--rounds", "1")
    assert "every decryption gave the input back" in out
    assert "receivewal / age, encrypt" in out


def test_logical_throughput_bench_runs() -> None:
    """Both tools catch up on the same slot output; the streamed mode reports receivewal's
    peak RSS."""
    out = run_bench("logical_throughput.py", "--rows", "20000", "--runs", "1")
    assert "receivewal / pg_recvlogical, changes/s after start-up" in out
    out = run_bench("logical_throughput.py", "--streamed-mb", "5")
    assert "receivewal peak RSS" in out


def test_apply_throughput_bench_runs() -> None:
    """The subscription and receivewal apply each bring the same rows to a fresh table (the
    bench checks the rows itself) and the ratio is printed."""
    out = run_bench("apply_throughput.py", "--rows", "2000", "--runs", "1")
    assert "receivewal apply / subscription, changes/s" in out


def test_apply_throughput_bench_runs_into_delta() -> None:
    """With --delta-only the same log goes into Delta tables: the table read back holds the
    source's rows, and the bench prints changes per second, peak RSS and the Delta commits per
    100,000 changes."""
    pytest.importorskip("deltalake")
    out = run_bench("apply_throughput.py", "--rows", "2000", "--runs", "1", "--delta-only")
    assert "Delta commits per 100,000 changes" in out
    assert "peak RSS" in out
    assert "subscription" not in out
