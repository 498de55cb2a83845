"""Streaming sources a restore can rewind to a snapshot's offsets; channels between stages."""

from pyspark_abs.sources.channel.source import ChannelSource
from pyspark_abs.sources.delta.source import DeltaSource
from pyspark_abs.sources.delta.spark import SparkDeltaSource
from pyspark_abs.sources.files.source import FileSource
from pyspark_abs.sources.files.spark import SparkFileSource
from pyspark_abs.sources.kafka.source import KafkaSource

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
