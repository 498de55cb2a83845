"""Per-epoch snapshot metrics: a table for SQL and plots, and listeners for live reporting.

Every figure comes from the manifest, so the metrics of past runs and of the running one are
read the same way. A :class:`SnapshotListener` receives each epoch as it is committed or
aborted, the way Spark's ``StreamingQueryListener`` receives query progress; the events carry
Spark's query id and batch id so the two can be joined.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pyspark_abs.manifest.entries import MANIFEST_SCHEMA

if TYPE_CHECKING:
    from pyspark_abs.manifest.info import SnapshotInfo


_INT_MAP = pa.map_(pa.string(), pa.int64())

_TIMINGS = ("batch_ms", "precommit_ms", "align_wait_ms", "align_ms", "prepare_ms", "commit_ms")

_METRICS_FIELDS: list[pa.Field[Any]] = [
    *(MANIFEST_SCHEMA.field(n) for n in ("epoch", "status")),
    pa.field("snapshot_epoch", pa.int64()),
    *(MANIFEST_SCHEMA.field(n) for n in ("recorded_at", "query_id", "batch_id")),
    pa.field("rows", pa.int64()),
    pa.field("bytes", pa.int64()),
    pa.field("rows_by_table", _INT_MAP),
    pa.field("bytes_by_table", _INT_MAP),
    *(MANIFEST_SCHEMA.field(n) for n in ("state_keys", *_TIMINGS, "pending_epochs")),
]
METRICS_SCHEMA = pa.schema(_METRICS_FIELDS)
"""Columns of :meth:`Snapshots.metrics <pyspark_abs.snapshots.reading.Snapshots.metrics>`.

``rows`` and ``bytes`` are totals over the epoch's tables; ``rows_by_table`` and
``bytes_by_table`` map each table id (``state/<operator>``, ``sink/<output>``,
``backedge/<edge>``) to what the epoch wrote to it.

With ``snapshot_interval`` > 1 every epoch still has its own row with its own figures: the
epochs committed as part of a later snapshot have status ``MERGED`` and that snapshot's epoch
in ``snapshot_epoch`` (a snapshot has its own epoch there), so ``GROUP BY snapshot_epoch``
sums a snapshot's group; ``commit_ms`` is on the snapshot and covers its whole group.
"""


def metrics_table(infos: Sequence[SnapshotInfo]) -> pa.Table:
    """One row of :data:`METRICS_SCHEMA` per epoch."""
    copied = ("snapshot_epoch", "recorded_at", "query_id", "batch_id", "state_keys")
    rows = [
        {
            "epoch": i.epoch,
            "status": i.status.value,
            "rows": sum(i.rows.values()),
            "bytes": sum(i.bytes.values()),
            "rows_by_table": sorted(i.rows.items()),
            "bytes_by_table": sorted(i.bytes.items()),
            **{name: getattr(i, name) for name in (*copied, *_TIMINGS, "pending_epochs")},
        }
        for i in infos
    ]
    return pa.Table.from_pylist(rows, schema=METRICS_SCHEMA)
