"""Reading a Delta table version as a Spark DataFrame, with or without Delta's JVM jars."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deltalake import DeltaTable

from pyspark_abs.storage.schemas import arrow_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


_DELTA_ON_CLASSPATH: dict[int, bool] = {}


def spark_reads_delta(spark: SparkSession) -> bool:
    """Whether Spark can read ``format("delta")`` (Delta's JVM jars are on its classpath)."""
    key = id(spark)
    if key not in _DELTA_ON_CLASSPATH:
        try:
            jvm: Any = getattr(spark, "_jvm", None)
            session: Any = getattr(spark, "_jsparkSession", None)
            jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
                "delta", session.sessionState().conf()
            )
            _DELTA_ON_CLASSPATH[key] = True
        except Exception:
            _DELTA_ON_CLASSPATH[key] = False
    return _DELTA_ON_CLASSPATH[key]


def load_dataframe(spark: SparkSession, uri: str, version: int) -> DataFrame:
    """A Delta table at ``version`` as a Spark DataFrame, with or without Delta's jars."""
    if spark_reads_delta(spark):
        return spark.read.format("delta").option("versionAsOf", version).load(uri)
    return load_with_delta_rs(spark, uri, version)


def load_with_delta_rs(spark: SparkSession, uri: str, version: int) -> DataFrame:
    """A Delta table at ``version``: the files delta-rs lists, read as Parquet by Spark."""
    from pyspark_abs.operators.arrow_types import to_spark

    table = DeltaTable(uri, version=version)
    schema = to_spark(arrow_schema(table))
    files = table.file_uris()
    if not files:
        return spark.createDataFrame([], schema)
    reader = spark.read.schema(schema)
    if table.metadata().partition_columns:
        reader = reader.option("basePath", uri)
    return reader.parquet(*files)
