"""What :func:`pyspark_abs.local_session` sets up beyond Spark's own defaults."""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

from pyspark_abs.session import SOCKET_TIMEOUT_S, local_session


def test_the_driver_and_the_jvm_wait_longer_than_sparks_15_seconds_for_a_local_socket(
    spark: SparkSession,
) -> None:
    # a busy 2-core machine stalled a collect's socket hand-over past Spark's 15 s default
    assert SOCKET_TIMEOUT_S >= 60
    assert spark.conf.get("spark.python.authenticate.socketTimeout") == f"{SOCKET_TIMEOUT_S}s"
    assert os.environ["SPARK_AUTH_SOCKET_TIMEOUT"] == str(SOCKET_TIMEOUT_S)
    assert spark.range(3).collect() == [(0,), (1,), (2,)]


def test_a_running_session_keeps_its_shuffle_partitions_unless_they_are_given(
    spark: SparkSession,
) -> None:
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    try:
        # the write-state command and the documentation's examples call it in the user's process
        assert local_session() is spark
        assert spark.conf.get("spark.sql.shuffle.partitions") == "3"
        assert local_session(shuffle_partitions=5) is spark
        assert spark.conf.get("spark.sql.shuffle.partitions") == "5"
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before or "2")
