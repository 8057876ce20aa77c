"""``receivewal analyze --remote sc://...`` against a Spark Connect server the test starts.

The server is pyspark's own ``SparkConnectServer`` (its jar ships in ``pyspark/jars``), run with
``spark-submit`` on a free 127.0.0.1 port; its Python workers run this interpreter, so they
import ``receivewal`` and scan the segment files themselves. The JVM starts while the two
archives are built. The CLI runs in a subprocess (a Connect client only, no JVM of its own);
its Parquet tables must agree with ``verify`` on the same directories.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pyspark
import pytest
from support.servers import free_port
from support.sparkarchives import TwoArchives, archive_key, assert_tables_agree_with_verify

from receivewal.check.sparksession import LOG4J2

pytestmark = [pytest.mark.spark, pytest.mark.server, pytest.mark.slow]

SPARK_HOME = Path(pyspark.__file__).parent
CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT = 180.0


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A Spark Connect server on ``local[2]`` (started, not yet waited for): its URL and log."""
    if not any(SPARK_HOME.glob("jars/spark-connect_*.jar")):
        pytest.fail(f"no spark-connect jar in {SPARK_HOME / 'jars'}")
    scratch = tmp_path_factory.mktemp("connect")
    (scratch / "log4j2.properties").write_text(LOG4J2)
    port = free_port()
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.local.dir": str(scratch),
        "spark.sql.warehouse.dir": str(scratch / "warehouse"),
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{scratch}/"
                                         f"log4j2.properties -Dderby.system.home={scratch}",
        "spark.sql.shuffle.partitions": "4",
        "spark.ui.enabled": "false",
    }
    argv = [str(SPARK_HOME / "bin" / "spark-submit"), "--class", CONNECT_SERVER,
            "--master", "local[2]", *(a for k, v in conf.items() for a in ("--conf", f"{k}={v}"))]
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}
    log = scratch / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, cwd=scratch, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield f"sc://127.0.0.1:{port}", log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the JVM and the Python workers it forked
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_listening(url: str, log: Path) -> None:
    """Return once the server accepts TCP connections; fail with its log if it does not."""
    host, port = url.removeprefix("sc://").split(":")
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
        except OSError:
            time.sleep(0.5)
        else:
            return
    pytest.fail(f"Spark Connect server not listening after {START_TIMEOUT} s:\n"
                + log.read_text(errors="replace")[-3000:])


@pytest.fixture(scope="module")
def archives(two_archives: TwoArchives) -> tuple[Path, Path, str]:
    """Two archives from two servers; the second lacks one segment (its name is returned)."""
    return two_archives.alpha, two_archives.beta, two_archives.removed


key = archive_key


@pytest.fixture(scope="module")
def run(connect_server: tuple[str, Path], archives: tuple[Path, Path, str],
        tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``receivewal analyze --remote`` over both archives, with a relative ``-o``."""
    url, log = connect_server
    wait_listening(url, log)
    alpha, beta, _ = archives
    cwd = tmp_path_factory.mktemp("client")
    proc = subprocess.run(
        [sys.executable, "-m", "receivewal", "analyze", "--remote", url, "-o", "out",
         str(alpha), key(beta)], cwd=cwd, capture_output=True, text=True, timeout=600,
        check=False)
    return proc, cwd / "out"


def rows(out: Path, table: str) -> list[dict[str, Any]]:
    """A Parquet table the server wrote, read without Spark."""
    return list(pq.read_table(out / table).to_pylist())


def test_remote_run_exits_1_and_names_each_archive(run: tuple[Any, Path],
                                                   archives: tuple[Path, Path, str]) -> None:
    """Exit code 1 (one archive is not recoverable); one verdict line per archive; the
    relative output directory is the client's, not the server's working directory."""
    proc, out = run
    assert proc.returncode == 1, proc.stderr
    alpha_files = len(list(archives[0].iterdir()))
    assert (f"{archives[0]}: {alpha_files} segments, {alpha_files}.0 MB of WAL, 0 error(s), "
            "recoverable") in proc.stdout
    assert f"{key(archives[1])}: " in proc.stdout
    assert "NOT recoverable" in proc.stdout
    assert f"tables: {out / 'segments'}" in proc.stdout
    assert "FutureWarning" not in proc.stderr


def test_remote_tables_agree_with_verify(run: tuple[Any, Path], two_archives: TwoArchives) -> None:
    """Segments, per-rmgr totals, problems and archive verdicts equal verify's on each archive."""
    _, out = run
    assert_tables_agree_with_verify(lambda table: rows(out, table), two_archives)


def test_remote_report_pages_and_charts(run: tuple[Any, Path]) -> None:
    """The report is drawn on the client from the server's aggregates: four PNGs, two pages
    that start with the summary."""
    _, out = run
    assert all((out / "report" / f"{n}.png").read_bytes()[:4] == b"\x89PNG" for n in (
        "wal_over_time", "wal_by_rmgr", "segments", "archives_compared"))
    md = (out / "report" / "report.md").read_text()
    assert md.split("\n## ")[1].startswith("Summary\n")
    assert "- **Recoverable:** NO: beta (1 of 2 yes)" in md
    assert "missing_segment" in md
    assert "<img src='segments.png'" in (out / "report" / "report.html").read_text()
