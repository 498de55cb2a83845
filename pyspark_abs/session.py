"""A local SparkSession set up the way pyspark-abs pipelines and their tests need it."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from pyspark_abs.errors import ConfigError

SOCKET_TIMEOUT_S = 120
"""Seconds the driver and the JVM wait for each other on a local socket (a collect's
hand-over, a Python worker's start), where Spark waits 15: a busy machine can stall longer."""


def local_session(
    app_name: str = "pyspark-abs",
    *,
    cores: int = 2,
    max_failures: int | None = None,
    shuffle_partitions: int | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Get or create a local SparkSession for pipelines, notebooks and tests.

    Python workers run this interpreter (``PYSPARK_PYTHON`` is set to ``sys.executable``),
    the UI is off, local sockets wait :data:`SOCKET_TIMEOUT_S`, a new session's time zone
    is UTC and its shuffle partition count 4 (a running session keeps its own of both, unless
    ``shuffle_partitions`` is given), and the log is quiet: a failed query's stack
    traces are not printed twice over (see :data:`QUIET_LOGGERS`), its error is raised once.

    Args:
        app_name: Spark application name.
        cores: Local worker threads.
        max_failures: Attempts per task, e.g. 3 to let Spark retry failed tasks
            (``local[N,F]``); None for Spark's local default of one attempt.
        shuffle_partitions: ``spark.sql.shuffle.partitions`` for new checkpoints (default: 4
            for a new session, the running session's own otherwise).
        conf: More Spark configuration.

    Raises:
        ConfigError: ``cores``, ``max_failures`` or ``shuffle_partitions`` is not a positive
            integer.
    """
    counts = {
        "cores": cores,
        "max_failures": max_failures,
        "shuffle_partitions": shuffle_partitions,
    }
    for name, count in counts.items():
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or count < 1
        ):
            raise ConfigError(f"local_session: {name} must be a positive integer, got {count!r}")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_AUTH_SOCKET_TIMEOUT", str(SOCKET_TIMEOUT_S))
    master = f"local[{cores}]" if max_failures is None else f"local[{cores},{max_failures}]"
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.stopTimeout", "60s")
        .config("spark.python.authenticate.socketTimeout", f"{SOCKET_TIMEOUT_S}s")
    )
    if SparkSession.getActiveSession() is None:
        # a running session keeps the time zone and partition count its user chose
        builder = builder.config("spark.sql.session.timeZone", "UTC")
        shuffle_partitions = 4 if shuffle_partitions is None else shuffle_partitions
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    _quiet_failures(spark)
    return spark


QUIET_LOGGERS = (
    "org.apache.spark.executor.Executor",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.sql.execution.streaming.MicroBatchExecution",
    "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
)
"""Spark loggers that print the stack traces of a failed task and of the query it ended,
which the error raised in Python already carries (conf/log4j2.properties quiets them too)."""


def _quiet_failures(spark: SparkSession) -> None:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    fatal = jvm.org.apache.logging.log4j.Level.FATAL
    for name in QUIET_LOGGERS:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, fatal)
