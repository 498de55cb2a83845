"""Wiring a pipeline into Spark: replays of decided epochs, exact instants, the watermark floor."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.operators.plan import DecidedReplay
from pyspark_abs.protocol.lineage import Lineage
from pyspark_abs.protocol.spark_checkpoint import CheckpointReader

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def decided_replays(
    epochs: EpochLog, checkpoint: CheckpointReader, lineage: Lineage, table: str
) -> tuple[DecidedReplay, ...]:
    """The micro-batches Spark will replay whose epochs are already decided.

    Those the checkpoint planned but did not commit, whose epoch has a PREPARED entry: each
    comes with the state-change files of ``table`` that the epoch pre-committed.
    """
    if lineage.fresh:
        return ()
    committed = set(checkpoint.committed_batches())
    replays = []
    for batch in checkpoint.planned_batches():
        entry = epochs.prepared(lineage.epoch_base + batch)
        if batch in committed or entry is None or table not in entry.tables:
            continue
        uri = entry.tables[table]
        files = tuple(f"{uri}/{f.path}" for f in entry.files if f.table == table)
        replays.append(DecidedReplay(batch, entry.epoch, files))
    return tuple(replays)


def as_micros(frame: DataFrame) -> DataFrame:
    """``frame`` with its top-level ``timestamp`` columns as microseconds since the Unix epoch.

    So they reach the operator as exact instants (see
    :func:`~pyspark_abs.operators.schema.localize`).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    if not any(isinstance(f.dataType, TimestampType) for f in frame.schema.fields):
        return frame
    return frame.select(
        *(
            # the metadata keeps a watermark column's mark (event-time timeouts need one)
            F.unix_micros(frame[f.name]).alias(f.name, metadata=f.metadata)
            if isinstance(f.dataType, TimestampType)
            else frame[f.name]
            for f in frame.schema.fields
        )
    )


def watermark_floor(epochs: EpochLog) -> int:
    """The watermark of the newest decided epoch: where this run's watermark starts."""
    decided = epochs.latest_decided()
    return (decided.watermark_ms or 0) if decided is not None else 0
