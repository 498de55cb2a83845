"""A KafkaSource without Spark's Kafka connector on the classpath says what to add (run in the
legs of scripts/test_spark_versions, whose sessions have no connector)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pyspark_abs import KafkaSource, Pipeline
from pyspark_abs.errors import SourceError
from pyspark_abs.examples.wordcount import word_count
from tests.support.kafka import KAFKA_JARS


@pytest.mark.compat
def test_a_missing_connector_is_a_source_error(spark: SparkSession, tmp_path: Path) -> None:
    if os.environ.get(KAFKA_JARS):
        pytest.skip("this session has Spark's Kafka connector")
    source = KafkaSource({"kafka.bootstrap.servers": "localhost:9092", "subscribe": "words"})
    with pytest.raises(
        SourceError,
        match=rf"Kafka connector is not on the classpath .*--packages "
        rf"org\.apache\.spark:spark-sql-kafka-0-10_2\.13:{spark.version}",
    ):
        Pipeline(
            "kafka", source, word_count, root=str(tmp_path / "root"), sinks=str(tmp_path / "s")
        )
