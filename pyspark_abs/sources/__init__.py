"""Streaming sources that a restore can rewind to a snapshot's offsets."""

from pyspark_abs.sources.delta import DeltaSource
from pyspark_abs.sources.kafka import KafkaSource

__all__ = ["DeltaSource", "KafkaSource"]
