"""Barrier markers: a partition's acknowledgement of an epoch.

When a pre-commit task has written its partition's files for epoch e, it yields exactly one
marker: the paper's barrier, acknowledged with the handles of what was snapshotted. The
coordinator aligns the markers of all partitions before it records the epoch as PREPARED.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from pyspark_abs.storage.files import FILE_TYPE, FileEntry

_MARKER_FIELDS: list[pa.Field[Any]] = [
    pa.field("operator", pa.string()),
    pa.field("epoch", pa.int64()),
    pa.field("partition", pa.int32()),
    pa.field("attempt", pa.int32()),
    pa.field("keys_delta", pa.int64()),
    pa.field("precommit_ms", pa.float64()),
    pa.field("acked_at_ms", pa.float64()),
    pa.field("files", pa.list_(FILE_TYPE)),
]
MARKER_SCHEMA = pa.schema(_MARKER_FIELDS)
"""Arrow schema of a marker row."""

MARKER_DDL = (
    "operator string, epoch bigint, partition int, attempt int, keys_delta bigint, "
    "precommit_ms double, acked_at_ms double, files array<struct<table:string, path:string, "
    "size_bytes:bigint, num_rows:bigint, crc32:bigint, partition_values:string, stats:string>>"
)
"""Spark schema of a marker row (the same as MARKER_SCHEMA)."""


@dataclass(frozen=True)
class BarrierMarker:
    """One partition's acknowledgement of an epoch.

    Attributes:
        operator: The operator.
        epoch: The epoch.
        partition: The Spark partition that wrote the files.
        attempt: The task attempt number that wrote them.
        keys_delta: Net change of the number of live keys in this partition.
        precommit_ms: Time the task spent writing files.
        acked_at_ms: Wall-clock time (Unix epoch, ms) at which the partition acknowledged.
        files: Files the partition pre-committed.
    """

    operator: str
    epoch: int
    partition: int
    attempt: int
    keys_delta: int
    precommit_ms: float
    acked_at_ms: float
    files: tuple[FileEntry, ...] = field(default_factory=tuple)

    def to_batch(self) -> pa.RecordBatch:
        """The marker as a one-row record batch of MARKER_SCHEMA."""
        row = asdict(self)
        row["files"] = [f.to_dict() for f in self.files]
        return pa.RecordBatch.from_pylist([row], schema=MARKER_SCHEMA)

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> BarrierMarker:
        """Build a marker from a row dict (``Row.asDict(recursive=True)``)."""
        return cls(
            operator=row["operator"],
            epoch=row["epoch"],
            partition=row["partition"],
            attempt=row["attempt"],
            keys_delta=row["keys_delta"],
            precommit_ms=row["precommit_ms"],
            acked_at_ms=row["acked_at_ms"],
            files=tuple(FileEntry.from_dict(f) for f in row["files"] or ()),
        )
