"""``analyze`` under ``spark-submit`` on a real Spark standalone cluster: a master and two
one-core workers started from pip's pyspark (``bin/spark-class``), all on 127.0.0.1.

The job file is the one docs/verify.md shows. The executors must really run on both workers
(each worker lists a finished executor of the application, and that executor's log shows
finished tasks), and the Parquet tables must equal ``verify`` on the same directories.
The archives use 1 MiB segments to keep the run near a minute; everything is torn down.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pyspark
import pytest
from support.servers import free_port
from support.sparkarchives import (
    SEGMENT_SIZE,
    TwoArchives,
    archive_key,
    assert_tables_agree_with_verify,
)

from receivewal.check.sparksession import LOG4J2

pytestmark = [pytest.mark.spark, pytest.mark.server, pytest.mark.slow]

SPARK_HOME = Path(pyspark.__file__).parent
VERIFY_DOC = Path(__file__).parent.parent / "docs" / "verify.md"
START_TIMEOUT = 180.0
key = archive_key


@dataclass
class Cluster:
    """A running standalone cluster: its master URL, web UIs and the workers' work dirs."""

    master: str
    master_ui: str
    worker_uis: list[str]
    work_dirs: list[Path]
    logs: list[Path]


def get_json(url: str) -> Any:
    """A web UI's JSON (the master's /json, a worker's /json)."""
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - 127.0.0.1 only
        return json.load(response)


def spawn(stack: ExitStack, argv: list[str], env: dict[str, str], log: Path) -> None:
    """Start a daemon in its own process group; stop the group when ``stack`` closes."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def stop() -> None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    stack.callback(stop)


def wait_for_workers(cluster: Cluster, count: int) -> None:
    """Return once the master lists ``count`` ALIVE workers; fail with the logs otherwise."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        try:
            state = get_json(cluster.master_ui + "/json")
        except OSError:
            state = {}
        if sum(w.get("state") == "ALIVE" for w in state.get("workers", [])) == count:
            return
        time.sleep(1)
    pytest.fail("standalone cluster not up:\n" + "\n".join(
        log.read_text(errors="replace")[-1500:] for log in cluster.logs))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A master and two workers (1 core, 1 GiB each) on 127.0.0.1, started, not waited for."""
    scratch = tmp_path_factory.mktemp("cluster")
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(scratch)}
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, ui = free_port(), free_port()
    cluster = Cluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui}", [], [], [])
    with ExitStack() as stack:
        cluster.logs.append(scratch / "master.log")
        spawn(stack, [spark_class, "org.apache.spark.deploy.master.Master", "--host",
                      "127.0.0.1", "--port", str(port), "--webui-port", str(ui)],
              env, cluster.logs[-1])
        for n in range(2):
            work, worker_ui = scratch / f"work{n}", free_port()
            work.mkdir()
            cluster.work_dirs.append(work)
            cluster.worker_uis.append(f"http://127.0.0.1:{worker_ui}")
            cluster.logs.append(scratch / f"worker{n}.log")
            spawn(stack, [spark_class, "org.apache.spark.deploy.worker.Worker", "--host",
                          "127.0.0.1", "--port", str(free_port()), "--webui-port",
                          str(worker_ui), "--cores", "1", "--memory", "1g", "--work-dir",
                          str(work), cluster.master], env, cluster.logs[-1])
        yield cluster


@pytest.fixture(scope="module")
def archives(two_archives: TwoArchives) -> tuple[Path, Path, str]:
    """Two archives from two servers; the second lacks one segment (its name is returned)."""
    return two_archives.alpha, two_archives.beta, two_archives.removed


def documented_job_file() -> str:
    """The analyze job file as docs/verify.md shows it (the commented line after 'job file')."""
    lines = VERIFY_DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "the job file is" in line)
    return lines[start + 1].strip().removeprefix("#").strip() + "\n"


@pytest.fixture(scope="module")
def submitted(cluster: Cluster, archives: tuple[Path, Path, str],
              tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[subprocess.CompletedProcess[str], Path, str]:
    """``spark-submit --master spark://...`` of the documented job over both archives:
    the finished process, the output directory and the application id."""
    wait_for_workers(cluster, 2)
    cwd = tmp_path_factory.mktemp("submit")
    (cwd / "analyze_job.py").write_text(documented_job_file())
    (cwd / "log4j2.properties").write_text(LOG4J2)
    conf = {
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{cwd}/"
                                         "log4j2.properties",
        "spark.executor.cores": "1", "spark.executor.memory": "512m", "spark.cores.max": "2",
        "spark.executor.extraJavaOptions": os.environ.get("SPARK_SUBMIT_OPTS", ""),  # conftest
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",  # wait for both executors
        "spark.ui.enabled": "false", "spark.local.dir": str(cwd),
        "spark.sql.shuffle.partitions": "4",
    }
    alpha, beta, _ = archives
    argv = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", cluster.master,
            *(a for k, v in conf.items() for a in ("--conf", f"{k}={v}")),
            "analyze_job.py", "-o", str(cwd / "out"), str(alpha), key(beta)]
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    apps = get_json(cluster.master_ui + "/json").get("completedapps", [])
    assert len(apps) == 1, (apps, proc.stderr[-3000:])
    return proc, cwd / "out", apps[0]["id"]


def test_job_ran_on_both_workers(cluster: Cluster,
                                 submitted: tuple[Any, Path, str]) -> None:
    """Each worker ran an executor of the application, and each executor finished tasks."""
    proc, _, app_id = submitted
    assert proc.returncode == 1, proc.stderr[-3000:]  # beta is not recoverable
    for ui, work in zip(cluster.worker_uis, cluster.work_dirs, strict=True):
        finished = get_json(ui + "/json")["finishedexecutors"]
        assert [e["appid"] for e in finished] == [app_id]
        logs = list((work / app_id).glob("*/stderr"))
        assert len(logs) == 1
        assert "Finished task" in logs[0].read_text(errors="replace")


def test_cluster_tables_agree_with_verify(submitted: tuple[Any, Path, str],
                                          two_archives: TwoArchives) -> None:
    """Segments, per-rmgr totals, problems and verdicts equal verify's on each archive."""
    proc, out, _ = submitted
    assert_tables_agree_with_verify(lambda table: pq.read_table(out / table).to_pylist(),
                                    two_archives)
    problems = pq.read_table(out / "problems").to_pylist()
    removed, beta = two_archives.removed, two_archives.beta
    assert [(p["archive"], p["file"], p["lsn"]) for p in problems
            if p["kind"] == "missing_segment"] == [
        (key(beta), removed, int(removed[16:], 16) * SEGMENT_SIZE)]
    first = min(path.name for path in beta.iterdir())  # the run before the hole: an island
    assert [(p["archive"], p["file"], p["severity"]) for p in problems
            if p["kind"] != "missing_segment"] == [(key(beta), first, "warning")]
    alpha = two_archives.alpha
    assert f"{alpha}: {len(list(alpha.iterdir()))} segments" in proc.stdout
