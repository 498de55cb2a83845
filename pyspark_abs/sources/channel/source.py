"""Channels between the stages of a job: :class:`ChannelSource`, what a stage declares.

A stage reads its upstream stages' sink tables through one :class:`ChannelSource`, one
upstream epoch per micro-batch. Three layers, lowest first:
:mod:`~pyspark_abs.sources.channel.plan` plans (pure),
:mod:`~pyspark_abs.sources.channel.log` reads the upstream manifests, and
:mod:`~pyspark_abs.sources.channel.stream` is the Spark data source.

A stage with several input channels (fan-in) reads them through one source, which decides
for all of them at once whether the next epoch is ready: two sources would each decide at
their own moment, and an upstream that commits between the two decisions would put the
stage's channels in different epochs. Its rows carry the channel's name in a column.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from pyspark_abs.errors import ConfigError, OperatorDefinitionError
from pyspark_abs.runtime import require_python_sources, require_workers_import
from pyspark_abs.sources.channel.log import CHANNEL_COLUMN, Channel
from pyspark_abs.sources.channel.plan import SOURCE_NAME, ChannelOffset

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


@dataclass(frozen=True)
class ChannelSource:
    """The outputs of upstream stages, read one upstream epoch per micro-batch.

    A stage's epoch ``n`` reads exactly its upstream stages' epoch-``n`` outputs, once every
    one of them has committed epoch ``n``, so a job's stages keep one epoch numbering and
    the snapshots of epoch ``n`` of all stages form one consistent cut of the job. With
    several channels (fan-in), rows carry their channel's name in column ``channel``.

    Example::

        silver = Pipeline("silver", bronze.channel(), dedup, root=..., sinks=...)
        report = Pipeline("report", ChannelSource.of(silver.channel(), gold.channel()), ...)

    Attributes:
        channels: The channels, in order.
        starting_epoch: The first upstream epoch a new checkpoint reads (default 0).
    """

    channels: tuple[Channel, ...]
    starting_epoch: int = 0

    def __post_init__(self) -> None:
        if not self.channels or not all(isinstance(c, Channel) for c in self.channels):
            raise OperatorDefinitionError(
                "ChannelSource needs one or more channels; build them with Pipeline.channel(output)"
            )
        names = [c.name for c in self.channels]
        if len(set(names)) != len(names):
            raise OperatorDefinitionError(
                f"ChannelSource: channels {names} repeat a name; read each channel once"
            )
        start = self.starting_epoch
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise ConfigError(
                f"ChannelSource: starting_epoch must be an integer >= 0, got {start!r}"
            )

    @classmethod
    def of(cls, *sources: ChannelSource | Channel) -> ChannelSource:
        """One source over the channels of several sources: a fan-in."""
        channels: list[Channel] = []
        for source in sources:
            channels.extend(source.channels if isinstance(source, ChannelSource) else [source])
        return cls(tuple(channels))

    @property
    def fan_in(self) -> bool:
        """Whether the source reads several channels (its rows name their channel)."""
        return len(self.channels) > 1

    def schema(self) -> StructType:
        """The rows' schema: the channels' columns by name, then ``channel`` for a fan-in.

        Raises:
            OperatorDefinitionError: Two channels give one column different types, or a
                fan-in channel already has a ``channel`` column.
        """
        from pyspark.sql.types import StringType, StructField, StructType

        fields: dict[str, StructField] = {}
        for channel in self.channels:
            for column in StructType.fromJson(json.loads(channel.schema)).fields:
                known = fields.get(column.name)
                if known is not None and known.dataType != column.dataType:
                    raise OperatorDefinitionError(
                        f"ChannelSource: column {column.name!r} is {known.dataType.simpleString()} "
                        f"in one channel and {column.dataType.simpleString()} in channel "
                        f"{channel.name!r}; rename it in one of the upstream outputs"
                    )
                fields[column.name] = StructField(column.name, column.dataType, True)
        if self.fan_in:
            if CHANNEL_COLUMN in fields:
                raise OperatorDefinitionError(
                    f"ChannelSource: a fan-in names each row's channel in column "
                    f"{CHANNEL_COLUMN!r}, which an upstream output already has; rename it"
                )
            fields[CHANNEL_COLUMN] = StructField(CHANNEL_COLUMN, StringType(), False)
        return StructType(list(fields.values()))

    def waiting_for(self, epoch: int) -> list[str]:
        """The channels whose upstream stage has not committed upstream ``epoch`` yet."""
        from pyspark_abs.manifest.table import load_epoch_log
        from pyspark_abs.storage.store import DeltaStore

        store = DeltaStore()
        waiting = []
        for channel in self.channels:
            uri = channel.root.manifest_uri
            if not store.exists(uri) or (
                channel.upstream(load_epoch_log(store, uri)).visible_through < epoch
            ):
                waiting.append(channel.name)
        return waiting

    def load(
        self, spark: SparkSession, starting_offset: Mapping[str, Any] | None = None
    ) -> DataFrame:
        """A streaming DataFrame of the channels, aligned at their upstream epochs.

        Args:
            spark: The session.
            starting_offset: An offset of this source from a checkpoint's offset log: a new
                checkpoint starts right after it (at its epoch).

        Raises:
            ConfigError: pyspark-abs came with ``--py-files`` and the workers' Python lacks it.
            SparkVersionError: The session runs Spark 4.0 or 4.1.
        """
        require_python_sources(
            spark,
            f"ChannelSource({', '.join(c.name for c in self.channels)}), a Python data source "
            f"that plans each micro-batch from the last one's offset, and so a Job,",
            "Run each stage as a Pipeline of its own that reads the previous stage's Delta sink "
            "with Delta's own source (each stage then has snapshots of its own, not one cut).",
        )
        require_workers_import(spark, "ChannelSource")
        from pyspark_abs.sources.channel.stream import ChannelDataSource

        start = self.starting_epoch
        if starting_offset is not None:
            start = ChannelOffset.parse(starting_offset).epoch
        spark.dataSource.register(ChannelDataSource)
        return (
            spark.readStream.format(SOURCE_NAME)
            .option("channels", json.dumps([asdict(c) for c in self.channels]))
            .option("schema", self.schema().json())
            .option("startingEpoch", str(start))
            .load()
        )

    def rewound(self, spark: SparkSession, offset_json: str) -> DataFrame:
        """The stream starting right after a recorded offset (see :meth:`offset_of`)."""
        return self.load(spark, starting_offset=self.offset_of(offset_json))

    @staticmethod
    def offset_of(offset_json: str) -> dict[str, Any]:
        """Parse one offset of this source, as Spark wrote it to a checkpoint's offset log.

        Raises:
            ConfigError: The text is not an offset of this source.
        """
        try:
            return ChannelOffset.parse(offset_json).to_dict()
        except ValueError as err:
            raise ConfigError(str(err)) from None
