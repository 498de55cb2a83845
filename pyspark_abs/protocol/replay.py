"""Replays of decided epochs: Spark re-runs them, and its state store takes the decided state.

A micro-batch that Spark replays after a restart, whose epoch is already decided, is not
processed again: its tasks install the epoch's decided state changes instead of calling
the operator (:class:`~pyspark_abs.operators.plan.DecidedReplay`), so the live state never
drifts from the snapshot.
"""

from __future__ import annotations

from collections.abc import Set

from pyspark_abs.errors import ReplayDivergedError
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.operators.plan import DecidedReplay
from pyspark_abs.operators.schema import KEY_GROUP
from pyspark_abs.protocol.lineage import Lineage
from pyspark_abs.protocol.spark_checkpoint import CheckpointReader
from pyspark_abs.storage.files import read_files
from pyspark_abs.storage.root import SnapshotRoot, state_table
from pyspark_abs.storage.store import DeltaStore


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


def check_replay_reached(
    store: DeltaStore,
    epochs: EpochLog,
    prepared: ManifestEntry | None,
    reached: Set[int],
    *,
    pipeline: str,
    root: SnapshotRoot,
    operator: str,
    epoch: int,
) -> None:
    """Check that a replay of decided ``epoch`` reached every key group the epoch changed.

    A key group the replay does not reach (its input changed since) would keep stale
    state in Spark's state store, so the run stops instead.

    Args:
        store: Reads the epoch's state-change files.
        epochs: The root's epoch log.
        prepared: The epoch's PREPARED entry, if it has one.
        reached: The key groups the replayed micro-batch installed changes for.
        pipeline: The pipeline, for the message.
        root: The snapshot root, for the message.
        operator: The operator, whose state table the epoch changed.
        epoch: The replayed epoch.

    Raises:
        ReplayDivergedError: A key group the epoch changed was not reached.
    """
    table = state_table(operator)
    if prepared is None or table not in prepared.tables:
        return
    uri = prepared.tables[table]
    paths = [f.path for f in prepared.files if f.table == table]
    changed: set[int] = set()
    if paths:
        groups = read_files(uri, paths, [KEY_GROUP])[KEY_GROUP].to_pylist()
        changed = {int(g) for g in groups if g is not None}
    missing = sorted(changed - reached)
    if missing:
        latest = epochs.latest(epoch)
        snapshot = latest.snapshot_epoch if latest and latest.snapshot_epoch else epoch
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise ReplayDivergedError(
            f"pipeline {pipeline!r}: Spark replayed epoch {epoch} after a "
            f"restart, but its input no longer reaches key group(s) {shown} whose state "
            f"epoch {epoch} changed (the source, a joined table or the key-group count "
            f"changed since); the live state would differ from snapshot {epoch}. Roll "
            f"back to it with pyspark_abs.rollback({root!r}, {snapshot}) and start again"
        )
