"""Streaming sources: tables read as replayable streams."""

from pyspark_abs.sources.delta import DeltaSource

__all__ = ["DeltaSource"]
