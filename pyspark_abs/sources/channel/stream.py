"""The Spark data source ``pyspark_abs_channel``: upstream stages' outputs, epoch by epoch.

:class:`~pyspark_abs.sources.channel.source.ChannelSource` registers it and passes its options; the
reader plans micro-batches with :mod:`~pyspark_abs.sources.channel.plan` over the upstream
manifests and reads the channel tables' files with :mod:`~pyspark_abs.sources.delta.log`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from pyspark_abs.errors import ConfigError, ExternalChangeError, SourceError
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.runtime import settle_worker_heap
from pyspark_abs.sources.channel.log import (
    CHANNEL_COLUMN,
    Channel,
    ManifestFollower,
    Rewrites,
    Survivor,
    channels_of,
)
from pyspark_abs.sources.channel.plan import (
    SOURCE_NAME,
    ChannelOffset,
    Upstream,
    frontier_of,
    next_epoch,
)
from pyspark_abs.sources.delta.files import DeltaFilePartition, read_slice, read_whole
from pyspark_abs.storage.files import file_sizes
from pyspark_abs.storage.store import DeltaStore


@dataclass(frozen=True)
class ChannelPartition(InputPartition):
    """One file of one channel's upstream epoch: one Spark task.

    Attributes:
        channel: The channel's name.
        file: The file's rows.
        survivors: When another writer rewrote the file (a ``DELETE``, an ``OPTIMIZE``):
            the files now holding what remains of its rows; only its rows found there are
            read. None when the file is as the upstream stage committed it.
    """

    channel: str
    file: DeltaFilePartition
    survivors: tuple[Survivor, ...] | None = None


class ChannelStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark's stream reader over a stage's input channels (see the module docstring).

    Args:
        channels: The channels.
        schema: The stream's schema.
        starting_epoch: The first upstream epoch a new checkpoint reads.
    """

    def __init__(self, channels: list[Channel], schema: StructType, starting_epoch: int) -> None:
        self._channels = channels
        self._schema = schema
        self._starting_epoch = starting_epoch
        self._frontier: int | None = None
        self._manifests: dict[str, ManifestFollower] = {}
        self._store: DeltaStore | None = None
        self._views: dict[str, tuple[EpochLog, Upstream]] = {}
        self._rewrites: dict[str, Rewrites] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_manifests"] = {}
        state["_store"] = None
        state["_views"] = {}
        state["_rewrites"] = {}
        return state

    def _logs(self) -> dict[str, EpochLog | None]:
        """Each channel's upstream manifest (None before the upstream stage's first start).

        Spark asks for the latest offset every few milliseconds while a stage waits for its
        upstream stages; a manifest is read again only when its Delta log has moved, and
        then only what was appended (see :class:`ManifestFollower`).
        """
        if self._store is None:
            self._store = DeltaStore()
        logs: dict[str, EpochLog | None] = {}
        for channel in self._channels:
            follower = self._manifests.get(channel.root)
            if follower is None:
                follower = self._manifests[channel.root] = ManifestFollower(channel.root)
            logs[channel.name] = follower.read(self._store)
        return logs

    def _upstreams(self, logs: dict[str, EpochLog | None]) -> list[Upstream]:
        return [self._upstream(c, logs[c.name]) for c in self._channels]

    def _upstream(self, channel: Channel, log: EpochLog | None) -> Upstream:
        """The channel's upstream history, folded again only when its manifest moved."""
        if log is None:
            return Upstream(channel.stage, {})
        cached = self._views.get(channel.name)
        if cached is None or cached[0] is not log:
            cached = self._views[channel.name] = (log, channel.upstream(log))
        return cached[1]

    def initialOffset(self) -> dict[str, Any]:
        """Before upstream epoch ``starting_epoch``."""
        return ChannelOffset(self._starting_epoch).to_dict()

    def getDefaultReadLimit(self) -> ReadLimit:
        """One upstream epoch per micro-batch, whatever the limit says."""
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Pin the newest epoch visible in every channel: ``availableNow`` reads no further."""
        self._frontier = frontier_of(self._upstreams(self._logs()))

    def _offset(self, value: object, what: str) -> ChannelOffset:
        try:
            return ChannelOffset.parse(value)
        except ValueError as err:
            raise SourceError(
                f"the {what} offset of the stream over channels {self._names()} is not this "
                f"source's: {err}. Was the checkpoint written by another query?"
            ) from None

    def _names(self) -> list[str]:
        return [c.name for c in self._channels]

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The next upstream epoch once every channel has committed it, else ``start``.

        Raises:
            SourceError: An upstream stage was rolled back on its own.
        """
        begin = self._offset(start, "start")
        upstreams = self._upstreams(self._logs())
        try:
            end = next_epoch(begin.epoch, upstreams, self._frontier)
        except ValueError as err:
            raise SourceError(
                f"the stream over channels {self._names()} cannot read upstream epoch "
                f"{begin.epoch}: {err}. Roll back the whole job (Job.rollback), so that every "
                f"stage goes back to the same epoch"
            ) from None
        if end == begin.epoch:
            return start
        pairs = list(zip(self._channels, upstreams, strict=True))
        barriers = {c.name: u.barrier(end - 1) for c, u in pairs}
        taken = tuple(c.name for c, u in pairs if u.taken_back(end - 1))
        return ChannelOffset(end, barriers, taken).to_dict()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        """One partition per channel file of the upstream epochs between the offsets."""
        begin, finish = self._offset(start, "start"), self._offset(end, "end")
        logs = self._logs()
        parts: list[InputPartition] = []
        for channel in self._channels:
            log = logs[channel.name]
            if log is None:
                continue
            upstream = self._upstream(channel, log)
            rewrites = self._rewrites_of(channel, upstream.barrier(begin.epoch - 1) + 1)
            for epoch in range(begin.epoch, finish.epoch):
                if upstream.visible_through < epoch:
                    raise SourceError(
                        f"upstream epoch {epoch} of channel {channel.name!r} is no longer "
                        f"committed in {channel.root}; was the upstream stage restored into "
                        f"another root? Roll back the whole job (Job.rollback)"
                    )
                if upstream.taken_back(epoch):
                    continue  # not on the timeline this stage continues
                for data in channel.files(log, epoch):
                    part = DeltaFilePartition(
                        channel.uri,
                        upstream.barrier(epoch),
                        data.path,
                        0,
                        data.num_rows,
                        tuple(sorted(data.partitions.items())),
                    )
                    if rewrites.replaced_by(data.path) is None:
                        parts.append(ChannelPartition(channel.name, part))
                    else:
                        parts.extend(self._rewritten(channel, epoch, part, rewrites))
        return parts

    def _rewrites_of(self, channel: Channel, first: int) -> Rewrites:
        """Other writers' rewrites of the channel table, read up to its latest version."""
        assert self._store is not None
        rewrites = self._rewrites.get(channel.name)
        if rewrites is None:
            rewrites = self._rewrites[channel.name] = Rewrites(channel.uri)
        rewrites.update(first, int(self._store.open(channel.uri).version()))
        return rewrites

    def _rewritten(
        self, channel: Channel, epoch: int, part: DeltaFilePartition, rewrites: Rewrites
    ) -> list[ChannelPartition]:
        """The partition of a listed file another writer rewrote: its rows still there.

        Raises:
            ExternalChangeError: The rewrite changed rows (not a DELETE or a compaction),
                or the file is gone (vacuumed), so the epoch's rows cannot be told.
        """
        where = f"upstream epoch {epoch} of channel {channel.name!r} ({channel.uri})"
        try:
            survivors, chain = rewrites.survivors(part.path)
        except ExternalChangeError as err:
            raise ExternalChangeError(
                f"the stream cannot read {where}: {err}. Nothing was read. Undo that change "
                f"(Delta's RESTORE of the channel table), or restore the job from a job "
                f"snapshot before epoch {epoch} into a new root (Job.restore_from)"
            ) from None
        if not survivors:
            return []  # every row of the file was deleted
        if file_sizes(channel.uri, [part.path])[0] is None:
            done = ", ".join(f"{c.operation} at version {c.version}" for c in chain)
            raise ExternalChangeError(
                f"the stream cannot read {where}: its file {part.path} was rewritten by "
                f"another writer ({done}) and then deleted (a VACUUM) before this stage read "
                f"it, so which rows remain of that epoch can no longer be told. Nothing was "
                f"read. Put the file back from a backup, or restore the job from a job "
                f"snapshot before epoch {epoch} into a new root (Job.restore_from): its "
                f"stages read their input again from there. Vacuum a channel only of files "
                f"every stage reading it has read"
            )
        return [ChannelPartition(channel.name, part, survivors)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The partition's rows, with the stream's schema."""
        from pyspark_abs.operators.schema import to_arrow

        settle_worker_heap()
        if not isinstance(partition, ChannelPartition):
            raise SourceError(f"unexpected partition {partition!r} for {SOURCE_NAME}")
        schema = to_arrow(self._schema)
        fan_in = CHANNEL_COLUMN in schema.names and len(self._channels) > 1
        rows_schema = pa.schema([f for f in schema if not (fan_in and f.name == CHANNEL_COLUMN)])
        kept = _rows_in(partition, rows_schema) if partition.survivors is not None else None
        for batch in read_slice(partition.file, rows_schema):
            if kept is not None:
                mask = [tuple(r.values()) in kept for r in batch.to_pylist()]
                batch = batch.filter(pa.array(mask, pa.bool_()))
            if fan_in:
                name = pa.array([partition.channel] * batch.num_rows, pa.string())
                batch = pa.RecordBatch.from_arrays([*batch.columns, name], schema=schema)
            yield batch

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to forget: the reader keeps no state between micro-batches."""


def _rows_in(partition: ChannelPartition, schema: pa.Schema) -> set[tuple[Any, ...]]:
    """The rows (as tuples) of the files holding what remains of a rewritten file."""
    assert partition.survivors is not None
    rows: set[tuple[Any, ...]] = set()
    for path, values in partition.survivors:
        for batch in read_whole(partition.file.table, path, values, schema):
            rows.update(tuple(r.values()) for r in batch.to_pylist())
    return rows


class ChannelDataSource(DataSource):
    """The ``pyspark_abs_channel`` data source; created by :meth:`ChannelSource.load`."""

    @classmethod
    def name(cls) -> str:
        """The short name to pass to ``readStream.format``."""
        return SOURCE_NAME

    def _option(self, name: str) -> str:
        value = self.options.get(name.lower())
        if not value:
            raise ConfigError(
                f"{SOURCE_NAME} needs the option {name}; load it with "
                f"pyspark_abs.ChannelSource(...).load(spark) or Pipeline.channel()"
            )
        return str(value)

    def schema(self) -> StructType:
        """The stream's schema, as :meth:`ChannelSource.load` computed it."""
        return StructType.fromJson(json.loads(self._option("schema")))

    def streamReader(self, schema: StructType) -> ChannelStreamReader:
        """A stream reader over the channels."""
        return ChannelStreamReader(
            list(channels_of(self._option("channels"))),
            schema,
            int(self._option("startingEpoch")),
        )
