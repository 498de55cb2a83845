"""Starting a pipeline's run.

The checks a start makes against its checkpoint and its upstream channels, where its key
groups keep live state, and the streaming query itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import ConfigError, UpstreamNotReadyError
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.operators.plan import LiveState, OperatorPlan, StateInSpark
from pyspark_abs.pipeline.wiring import operator_stage
from pyspark_abs.protocol.layout import SnapshotLayout
from pyspark_abs.protocol.lineage import Lineage, written_slots
from pyspark_abs.protocol.live_state import LocalLiveState
from pyspark_abs.protocol.spark_checkpoint import CheckpointReader
from pyspark_abs.sources import RewindableSource
from pyspark_abs.sources.channel.plan import channel_offsets
from pyspark_abs.sources.channel.source import ChannelSource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

_NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


def require_upstream_ready(
    name: str, source: DataFrame | RewindableSource, lineage: Lineage
) -> None:
    """Refuse to start a fresh checkpoint on channels that have nothing to read yet.

    Spark runs a fresh checkpoint's first micro-batch at once, whatever its sources have; on
    channels without the epoch it reads first, that micro-batch would read nothing and take
    an epoch number that its upstream stages have not used.

    Raises:
        UpstreamNotReadyError: An upstream stage has not committed that epoch.
    """
    if not isinstance(source, ChannelSource):
        return
    first = first_upstream_epoch(source, lineage)
    waiting = source.waiting_for(first)
    if waiting:
        raise UpstreamNotReadyError(
            f"pipeline {name!r} has nothing to read yet: channels {waiting} have not "
            f"committed upstream epoch {first}, which this stage's first micro-batch "
            f"reads. Start the upstream stages first, or run the stages together as a "
            f"Job, which starts each stage once its upstream stages are ahead"
        )


def first_upstream_epoch(source: ChannelSource, lineage: Lineage) -> int:
    """The upstream epoch a fresh checkpoint's first micro-batch reads on ``source``."""
    restored = channel_offsets(lineage.restore.source_offsets if lineage.restore else None)
    return restored[0].epoch if restored else source.starting_epoch


def require_same_key_groups(name: str, checkpoint: str, lineage: Lineage, key_groups: int) -> None:
    """Refuse a key-group count other than the one the checkpoint's state is kept in.

    Raises:
        ConfigError: The counts differ.
    """
    if lineage.key_groups is not None and lineage.key_groups != key_groups:
        raise ConfigError(
            f"pipeline {name!r}: checkpoint {checkpoint} holds state in "
            f"{lineage.key_groups} key groups, but key_groups is {key_groups}. "
            f"Keep key_groups={lineage.key_groups}, or roll back to the latest epoch "
            f"(pyspark_abs.rollback) and start again to change it"
        )


def run_slots(
    name: str,
    checkpoint: CheckpointReader,
    epochs: EpochLog,
    lineage: Lineage,
    config: AbsConfig,
    *,
    remote: bool,
    spark: SparkSession,
) -> int | None:
    """How many slots this run's checkpoint groups its key groups into (None: none).

    A slot is one call of the operator per epoch for all its key groups. A new checkpoint
    with live state on local disk takes one slot per shuffle partition (at most one per
    key group); a checkpoint keeps the slots it began with, and one begun before slots
    keeps one group per key group. Without snapshots (or through Spark Connect) Spark's
    state store holds each key group's whole state, one group per key group.

    Raises:
        ConfigError: A run without snapshots or through Spark Connect continues a
            checkpoint whose state is in slots; it would start every key group empty.
    """
    if not config.snapshots or remote:
        written = written_slots(epochs, checkpoint.query_id())
        if written is not None:
            how = "through Spark Connect" if remote else "with snapshots off"
            raise ConfigError(
                f"pipeline {name!r}: checkpoint {checkpoint.location} keeps its state on the "
                f"executors' local disks, in {written} slots (it was written with snapshots "
                f"on, outside Spark Connect), which a run {how} cannot read. Start it with "
                f"snapshots on outside Spark Connect, or give it a new checkpoint"
            )
        return None
    if not lineage.fresh:
        return lineage.slots
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or 1)
    return max(1, min(config.key_groups, partitions))


def live_state(
    layout: SnapshotLayout,
    config: AbsConfig,
    root_id: str | None,
    epoch_base: int,
    remote: bool,
    run_id: str,
) -> LiveState:
    """Where key groups keep their live state in this run.

    Local files rebuilt from the snapshots; Spark's state store without snapshots, or
    through Spark Connect, whose tasks do not see their micro-batch's id.
    """
    if not config.snapshots or remote:
        return StateInSpark()
    state = layout.targets[0]
    return LocalLiveState.for_root(
        layout.root,
        root_id,
        state.table,
        state.uri,
        config.local_state_dir,
        epoch_base,
        run_id,
        config.local_state_change_share,
    )


def start_query(
    name: str,
    keyed: DataFrame,
    plan: OperatorPlan,
    batch_function: Callable[[DataFrame, int], None],
    checkpoint: str,
    trigger: tuple[str | None, bool],
    *,
    from_channels: bool,
) -> StreamingQuery:
    """Start the query that runs ``plan`` over ``keyed``, each micro-batch to ``batch_function``.

    ``trigger`` is (processing time, available now).
    """
    writer = (
        operator_stage(keyed, plan)
        .writeStream.outputMode("update")
        .foreachBatch(batch_function)
        .option("checkpointLocation", checkpoint)
        .queryName(name)
    )
    processing_time, available_now = trigger
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif processing_time:
        writer = writer.trigger(processingTime=processing_time)
    if not from_channels:
        return writer.start()
    # A no-data micro-batch would take an epoch number without reading an upstream
    # epoch, and the stage's epochs would drift from its upstream stages'. The query
    # takes its own copy of the session's conf when it starts.
    conf = keyed.sparkSession.conf
    before = conf.get(_NO_DATA_BATCHES, None)
    conf.set(_NO_DATA_BATCHES, "false")
    try:
        return writer.start()
    finally:
        if before is None:
            conf.unset(_NO_DATA_BATCHES)
        else:
            conf.set(_NO_DATA_BATCHES, before)
