"""Channels as their upstream manifests show them: which epochs are visible, which files.

A channel is one output of an upstream stage: a Delta table its epochs commit to. Which
rows an upstream epoch holds comes from the upstream stage's manifest (the files its
PREPARED entry lists for the channel table), and whether they are visible from its
COMMITTED and MERGED entries, so a reader never sees rows of an epoch that is not committed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark_abs.manifest.entries import EpochStatus
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.sources.channel_plan import Upstream, UpstreamEpoch
from pyspark_abs.storage.files import FileEntry

_VISIBLE = frozenset(
    {EpochStatus.COMMITTED, EpochStatus.MERGED, EpochStatus.RESTORED, EpochStatus.EXPIRED}
)

CHANNEL_COLUMN = "channel"
"""The column naming each row's channel, in the rows of a source with several channels."""


@dataclass(frozen=True)
class Channel:
    """One output of an upstream stage, read by a downstream stage.

    Build it with ``Pipeline.channel(output)``.

    Attributes:
        name: The channel's name: the upstream stage, or ``stage.output`` when the stage
            has several outputs.
        stage: The upstream stage (pipeline) name.
        root: The upstream stage's snapshot root.
        table: The channel's table id in the upstream manifest (``sink/<output>``).
        uri: The channel table's location.
        schema: The rows' Spark schema, as JSON.
    """

    name: str
    stage: str
    root: str
    table: str
    uri: str
    schema: str

    def to_dict(self) -> dict[str, str]:
        """The channel as the data source's options carry it."""
        return {
            "name": self.name,
            "stage": self.stage,
            "root": self.root,
            "table": self.table,
            "uri": self.uri,
            "schema": self.schema,
        }

    def upstream(self, log: EpochLog) -> Upstream:
        """The upstream history of this channel, from the upstream manifest."""
        epochs = []
        for epoch in sorted({e.epoch for e in log.entries}):
            entry = log.latest(epoch)
            if entry is None or entry.status not in _VISIBLE:
                continue
            closing = log.latest(epoch if entry.snapshot_epoch is None else entry.snapshot_epoch)
            barrier = None if closing is None else closing.table_versions.get(self.table)
            restored = entry.restored_from if entry.is_restore else None
            epochs.append(UpstreamEpoch(epoch, True, barrier, restored))
        return Upstream.of(self.stage, epochs)

    def files(self, log: EpochLog, epoch: int) -> list[FileEntry]:
        """The channel's files of an upstream epoch: none for an idle epoch."""
        prepared = log.prepared(epoch)
        if prepared is None or prepared.is_restore:
            return []
        return [f for f in prepared.files if f.table == self.table]


def channels_of(value: str) -> Sequence[Channel]:
    """The channels of the data source's ``channels`` option."""
    return [Channel(**c) for c in json.loads(value)]
