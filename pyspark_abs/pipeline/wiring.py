"""Wiring a pipeline into Spark.

The operator stage, restore rows, replays of decided epochs, exact instants and the
watermark floor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from pyspark.sql.streaming.state import GroupStateTimeout

from pyspark_abs.errors import ConfigError, OperatorDefinitionError, SourceError
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.operators.contract import TimeoutMode
from pyspark_abs.operators.envelope import ENVELOPE_DDL, STATE_DDL
from pyspark_abs.operators.partitioning import key_group_column, slot_column
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.schema import (
    KEY_GROUP,
    NULL_MASK_PREFIX,
    RESTORE,
    SLOT_COLUMN,
    TIMEOUT,
    instant_columns,
)
from pyspark_abs.operators.task import KeyGroupTask
from pyspark_abs.sources import REWINDABLE, DeltaSource, RewindableSource, SparkFileSource
from pyspark_abs.sources.backedge_log import split_offsets
from pyspark_abs.sources.files.rewinds import rewound_files
from pyspark_abs.storage.root import SnapshotRoot, state_table
from pyspark_abs.storage.store import DeltaStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_TIMEOUT_CONF = {
    TimeoutMode.NONE: GroupStateTimeout.NoTimeout,
    TimeoutMode.PROCESSING_TIME: GroupStateTimeout.ProcessingTimeTimeout,
    TimeoutMode.EVENT_TIME: GroupStateTimeout.EventTimeTimeout,
}


def operator_stage(keyed: DataFrame, plan: OperatorPlan) -> DataFrame:
    """The operator over ``keyed`` rows: one pandas call per slot (or key group) and epoch.

    Its rows are envelopes: encoded state changes and outputs per key group and target.
    """
    from pyspark.sql import functions as F

    group = KEY_GROUP
    if plan.slots is not None:
        group = SLOT_COLUMN
        keyed = keyed.withColumn(group, slot_column(F.col(KEY_GROUP), plan.slots))
    return (
        exact_for_pandas(keyed)
        .groupBy(group)
        .applyInPandasWithState(
            KeyGroupTask(plan), ENVELOPE_DDL, STATE_DDL, "update", _TIMEOUT_CONF[plan.timeout]
        )
    )


def with_restore_rows(
    keyed: DataFrame, restore: ManifestEntry, plan: OperatorPlan, key_groups: int
) -> DataFrame:
    """``keyed`` with the restore epoch's state as restore rows, read in the first batch."""
    from pyspark.sql import functions as F

    table = state_table(plan.name)
    if table not in restore.tables:
        return keyed
    version = restore.table_versions[table]
    state = DeltaSource(
        restore.tables[table],
        starting_version=version,
        ending_version=version,
        ignore_changes=True,
    ).load(keyed.sparkSession)
    instants = instant_columns(plan.state_schema)
    values = F.struct(
        *(
            F.unix_micros(c).alias(c) if c in instants else F.col(c)
            for c in plan.state_schema.names
        ),
        TIMEOUT,
        KEY_GROUP,  # the key group the snapshot holds the key in
    )
    restore_rows = state.select(
        *plan.key_columns,
        values.alias(RESTORE),
        key_group_column(plan.key_columns, key_groups).alias(KEY_GROUP),
    )
    no_restore = F.lit(None).cast(restore_rows.schema[RESTORE].dataType)
    return keyed.withColumn(RESTORE, no_restore).unionByName(restore_rows, allowMissingColumns=True)


_WATERMARK_MARK = "spark.watermarkDelayMs"


def exact_for_pandas(frame: DataFrame) -> DataFrame:
    """``frame`` as the operator's rows cross into pandas without a value changing.

    Top-level ``timestamp`` columns become microseconds since the Unix epoch, so they reach
    the operator as exact instants (see :func:`~pyspark_abs.operators.schema.localize`).
    Spark turns a nullable integer column that holds nulls into float in pandas, so each
    such column (instants included, but not the watermark's) is sent with its nulls as 0
    beside a mask column, and becomes whole again in the worker
    (:func:`~pyspark_abs.operators.schema.exact_columns`).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import ByteType, IntegerType, LongType, ShortType, TimestampType

    integral = (ByteType, ShortType, IntegerType, LongType, TimestampType)
    columns = []
    for f in frame.schema.fields:
        column = frame[f.name]
        if isinstance(f.dataType, TimestampType):
            column = F.unix_micros(column)
        # Spark drops input rows older than the watermark by the marked column itself: a 0
        # in place of null would drop restore rows; instants up to 2255 are exact as float
        watermark = _WATERMARK_MARK in f.metadata
        if (
            f.name in (KEY_GROUP, SLOT_COLUMN)
            or watermark
            or not (f.nullable and isinstance(f.dataType, integral))
        ):
            # the metadata keeps a watermark column's mark (event-time timeouts need one)
            columns.append(column.alias(f.name, metadata=f.metadata))
            continue
        zero = F.lit(0).cast(LongType() if isinstance(f.dataType, TimestampType) else f.dataType)
        columns.append(F.coalesce(column, zero).alias(f.name, metadata=f.metadata))
        columns.append(frame[f.name].isNull().alias(NULL_MASK_PREFIX + f.name))
    return frame.select(*columns)


def with_watermark_floors(plan: OperatorPlan, epochs: EpochLog | None) -> OperatorPlan:
    """``plan`` with the floors where this run's watermark starts (see ``OperatorPlan``).

    They come from the newest decided epoch (none without ``epochs``, a run without
    snapshots): its watermark, and after a restore epoch the one the epoch after the
    installed one ran with, the installed epoch's own judging the first micro-batch's rows.
    """
    decided = epochs.latest_decided() if epochs is not None else None
    if decided is None:
        return plan
    restored = decided.restore is not None and decided.restore.watermark_after_ms is not None
    return replace(
        plan,
        watermark_floor_ms=decided.watermark_floor_ms,
        first_batch_floor_ms=decided.watermark_ms if restored else None,
    )


def source_frame(
    name: str,
    source: DataFrame | RewindableSource,
    transform: Callable[[DataFrame], DataFrame] | None,
) -> DataFrame:
    """The streaming DataFrame of a pipeline's source, transformed.

    Raises:
        OperatorDefinitionError: ``source`` is neither a streaming DataFrame nor a source.
        ConfigError: A rewindable source is given without an active SparkSession.
    """
    if isinstance(source, REWINDABLE):
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            raise ConfigError(
                f"pipeline {name!r}: a {type(source).__name__} needs an active SparkSession"
            )
        frame = source.load(spark)
    elif getattr(source, "isStreaming", False):
        frame = source
    else:
        raise OperatorDefinitionError(
            f"pipeline {name!r}: the source must be a streaming DataFrame "
            f"(spark.readStream...), a DeltaSource, FileSource, KafkaSource, "
            f"SparkDeltaSource or SparkFileSource, got "
            f"{type(source).__name__}"
        )
    return transform(frame) if transform is not None else frame


def rewound_frame(
    name: str,
    source: DataFrame | RewindableSource,
    transform: Callable[[DataFrame], DataFrame] | None,
    restore: ManifestEntry,
    spark: SparkSession,
    root: SnapshotRoot,
) -> DataFrame | None:
    """The source rewound to a restore epoch's offsets, or None if the epoch has none.

    Raises:
        SourceError: The epoch has offsets, but the source cannot be rewound.
    """
    lines = split_offsets(restore.source_offsets)[0]
    if not lines:
        return None
    line = lines[0]
    if not isinstance(source, REWINDABLE):
        raise SourceError(
            f"pipeline {name!r} starts from restore epoch {restore.epoch} "
            f"({restore.origin}), whose source offset is {line}; only a "
            f"pyspark_abs.DeltaSource, FileSource, KafkaSource, SparkDeltaSource or "
            f"SparkFileSource can be rewound to it. Use one as the source (SparkFileSource for "
            f"spark.readStream over files), or start from a snapshot without offsets "
            f"(write_state)"
        )
    if isinstance(source, SparkFileSource):
        read = rewound_files(DeltaStore(), root, restore.epoch, restore.run_id)
        frame = source.rewound(spark, read)
    else:
        frame = source.rewound(spark, line)
    return transform(frame) if transform is not None else frame
