"""A KafkaSource without Spark's Kafka connector on the classpath (as here) says what to add."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pyspark_abs import KafkaSource, Pipeline, SourceError
from pyspark_abs.examples.wordcount import word_count


def test_a_missing_connector_is_a_source_error(spark: SparkSession, tmp_path: Path) -> None:
    source = KafkaSource({"kafka.bootstrap.servers": "localhost:9092", "subscribe": "words"})
    with pytest.raises(
        SourceError,
        match=rf"Kafka connector is not on the classpath .*--packages "
        rf"org\.apache\.spark:spark-sql-kafka-0-10_2\.13:{spark.version}",
    ):
        Pipeline(
            "kafka", source, word_count, root=str(tmp_path / "root"), sinks=str(tmp_path / "s")
        )
