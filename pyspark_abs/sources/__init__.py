"""Streaming sources a restore can rewind to a snapshot's offsets; channels between stages."""

from pyspark_abs.sources.channel import ChannelSource
from pyspark_abs.sources.delta import DeltaSource
from pyspark_abs.sources.file_source import FileSource
from pyspark_abs.sources.kafka import KafkaSource
from pyspark_abs.sources.spark_delta import SparkDeltaSource
from pyspark_abs.sources.spark_files import SparkFileSource

RewindableSource = (
    DeltaSource | FileSource | KafkaSource | SparkDeltaSource | SparkFileSource | ChannelSource
)
"""A source that a restore can start right after a snapshot's offsets."""
REWINDABLE = (
    DeltaSource,
    FileSource,
    KafkaSource,
    SparkDeltaSource,
    SparkFileSource,
    ChannelSource,
)

__all__ = [
    "REWINDABLE",
    "ChannelSource",
    "DeltaSource",
    "FileSource",
    "KafkaSource",
    "RewindableSource",
    "SparkDeltaSource",
    "SparkFileSource",
]
