"""Compacting a snapshot root on demand (the pipeline compacts in the background)."""

from __future__ import annotations

from pyspark_abs.config import AbsConfig
from pyspark_abs.faults import FaultInjector
from pyspark_abs.manifest.table import (
    open_root,
)
from pyspark_abs.protocol.compaction import Compaction, Progress, compact_snapshot, quiet
from pyspark_abs.storage.rewrites import compact_small_files
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import (
    DeltaStore,
)


def compact(
    root: str, *, progress: Progress = quiet, config: AbsConfig | None = None
) -> list[Compaction]:
    """Compact a snapshot root as of its newest snapshot (see :func:`compact_snapshot`).

    Safe while the pipeline runs. The manifest is compacted too (small-file bin packing).
    ``config`` only matters for its injected faults.

    Raises:
        SnapshotNotFoundError: The root does not exist.
        CommitError: Delta kept reporting conflicts.
    """
    root = SnapshotRoot(root)
    store = DeltaStore()
    epochs = open_root(store, root)
    snapshots = epochs.snapshots()
    if not snapshots:
        return []
    latest = snapshots[-1]
    results = compact_snapshot(
        store, latest, FaultInjector((config or AbsConfig()).faults), progress
    )
    progress("compacting _manifest")
    compact_small_files(root.manifest_uri)
    return results
