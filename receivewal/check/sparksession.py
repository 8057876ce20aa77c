"""The Spark session ``analyze`` runs in: embedded, under spark-submit, or over Spark Connect.

pyspark is imported inside the function: this module imports without the ``spark`` extra.
"""

# ruff: noqa: PLC0415 - pyspark is the optional spark extra: lazy
from __future__ import annotations

import atexit
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from receivewal.archive.durable import scratch_directory

#: Error-level logs to stderr. The two named loggers are the ones Spark reads to set the
#: console level of an interactive driver (the Scala shell's, and PySpark's gateway): when
#: they differ from the root level Spark prints 'Setting default log level to "WARN"'.
LOG4J2 = "\n".join([
    "rootLogger.level = error", "rootLogger.appenderRef.stderr.ref = console",
    "appender.console.type = Console", "appender.console.name = console",
    "appender.console.target = SYSTEM_ERR", "appender.console.layout.type = PatternLayout",
    "logger.repl.name = org.apache.spark.repl.Main", "logger.repl.level = error",
    "logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer",
    "logger.gateway.level = error", ""])

#: boto3's standard chain as environment variables: an embedded session hands the driver's to
#: its executors' Python workers (spark.executorEnv), so that ``s3://`` archives are read with
#: the credentials ``analyze`` was started with, even in a JVM that started before they were set.
#: Spark's default redaction (secret, token) keeps the secrets out of its UI and logs.
STORE_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID",
             "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION",
             "AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
             "AWS_EC2_METADATA_DISABLED")


def make_session(remote: str | None = None, scratch: Path | None = None,
                 master: str = "local[*]") -> Any:
    """The Spark session: Spark Connect with ``remote``; the cluster's under spark-submit;
    else an embedded local session with settings fit for one machine."""
    from pyspark.sql import SparkSession

    if remote:
        return SparkSession.builder.remote(remote).getOrCreate()
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # launched by spark-submit: its conf applies
        return SparkSession.builder.getOrCreate()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need this environment
    if scratch is None:
        scratch = scratch_directory("receivewal-spark-")
        atexit.register(shutil.rmtree, scratch, True)
    scratch.mkdir(parents=True, exist_ok=True)
    log_conf = scratch / "log4j2.properties"
    log_conf.write_text(LOG4J2)
    java_opts = f"-Dlog4j2.configurationFile=file:{log_conf} -Dderby.system.home={scratch}"
    builder = (
        SparkSession.builder.master(master).appName("receivewal-analyze")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.local.dir", str(scratch))
        .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", str(os.cpu_count() or 2))
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.ui.enabled", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.execution.pythonUDF.arrow.enabled", "false")
    )
    for name in STORE_ENV:  # the executors' Python workers reach the store as the driver does
        if name in os.environ:
            builder = builder.config(f"spark.executorEnv.{name}", os.environ[name])
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
