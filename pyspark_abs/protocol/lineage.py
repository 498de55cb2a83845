"""Recovery on start: load the manifest and check that root and checkpoint belong together.

After these checks every epoch left PREPARED by an earlier run is committed, in the groups
of its snapshot interval (:meth:`~pyspark_abs.protocol.epoch_writer.EpochWriter.recover`),
the checkpoint's micro-batches are mapped onto epochs (:func:`resolve_lineage`), and Spark
replays the micro-batches it had not committed; the coordinator discards replays of decided epochs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from pyspark_abs.errors import PipelineMismatchError
from pyspark_abs.logs import logger
from pyspark_abs.manifest.entries import EpochStatus, ManifestEntry
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.manifest.table import load_epoch_log, manifest_root_id, tables_of
from pyspark_abs.protocol.spark_checkpoint import SUPERSEDED, CheckpointReader
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore
from pyspark_abs.storage.transactions import APP_ID_KEY, EPOCH_KEY, ROOT_KEY, app_id

log = logger(__name__)


def require_own_sinks(
    store: DeltaStore,
    pipeline: str,
    root: SnapshotRoot,
    root_id: str | None,
    sinks: Mapping[str, str],
    newest_decided: int | None,
) -> None:
    """Refuse to write sinks that another snapshot root of the pipeline has written to.

    A sink that holds epochs of this pipeline committed under another root's transactions
    would get the two roots' outputs mixed, and one whose transaction for this root is
    ahead of every epoch the root has decided would have the root's next epochs skipped as
    already committed. A root copied as a directory keeps the original's id, so its commits
    would pass for the original's: a sink that the original, still in place, writes too is
    refused (a copied sink table, written by the copy alone, is the copy's own). Sinks
    written by other pipelines are shared tables and are left alone.

    Args:
        store: Delta access.
        pipeline: The root's pipeline.
        root: The snapshot root.
        root_id: The root's id (see :func:`manifest_root_id`).
        sinks: Sink table id to location.
        newest_decided: The newest epoch the root has decided (None: none).

    Raises:
        PipelineMismatchError: A sink belongs to another root or is ahead of this one.
    """
    ours = app_id(pipeline, "", root_id)
    originals: dict[str, Mapping[str, str]] = {}
    for table, uri in sinks.items():
        if not store.exists(uri):
            continue
        own = app_id(pipeline, table, root_id)
        sink = store.open(uri)
        for commit in sink.history():
            other = commit.get(APP_ID_KEY)
            if not isinstance(other, str) or not other.startswith(app_id(pipeline, "", None)):
                continue
            if other == own or (root_id is not None and other.startswith(ours)):
                _refuse_copy(store, pipeline, root, root_id, table, uri, commit, originals)
                continue
            owner = commit.get(ROOT_KEY) or "a snapshot root created before root ids"
            raise PipelineMismatchError(
                f"sink {table} at {uri} holds epochs of pipeline {pipeline!r} written by "
                f"snapshot root {owner} (transaction {other!r}, epoch {commit.get(EPOCH_KEY)}), "
                f"not by {root}. Writing to it would mix the two roots' outputs. Give this "
                f"root its own sink table (a restored copy needs new sinks), or roll the "
                f"original root back instead"
            )
        done = sink.transaction_version(own)
        if done is not None and (newest_decided is None or done > newest_decided):
            raise PipelineMismatchError(
                f"sink {table} at {uri} holds epoch {done} of snapshot root {root}, but the "
                f"root has decided epochs only up to {newest_decided}: its manifest was "
                f"replaced or lost. Restore the root's _manifest, or give the root a new sink"
            )


def _refuse_copy(
    store: DeltaStore,
    pipeline: str,
    root: SnapshotRoot,
    root_id: str | None,
    table: str,
    uri: str,
    commit: Mapping[str, object],
    originals: dict[str, Mapping[str, str]],
) -> None:
    """Refuse a sink written under this root's id from another location that writes it still.

    Raises:
        PipelineMismatchError: This root is a copy of one that writes the same sink.
    """
    elsewhere = commit.get(ROOT_KEY)
    if root_id is None or not isinstance(elsewhere, str) or elsewhere == root:
        return
    if elsewhere not in originals:
        other = SnapshotRoot(elsewhere)
        same = store.exists(other.manifest_uri) and manifest_root_id(store, other) == root_id
        entries = load_epoch_log(store, other.manifest_uri).entries if same else []
        originals[elsewhere] = tables_of(entries)
    if originals[elsewhere].get(table) == uri:
        raise PipelineMismatchError(
            f"snapshot root {root} is a copy of {elsewhere} (both have root id {root_id}), "
            f"which wrote sink {table} at {uri} (epoch {commit.get(EPOCH_KEY)}). Writing to "
            f"it from the copy would mix the two roots' outputs. Give the copy its own sink "
            f"tables, or make copies with pyspark_abs.restore, which gives the copy its own id"
        )


@dataclass(frozen=True)
class Lineage:
    """How a run's Spark micro-batches map onto the epochs of a snapshot root.

    Attributes:
        epoch_base: Epoch of micro-batch 0 (epoch = epoch_base + batch id).
        restore: The restore epoch this checkpoint started from, if any: its state is fed
            to the operator in the checkpoint's first micro-batch.
        fresh: Whether the checkpoint has not committed a micro-batch yet.
        key_groups: Key groups of the checkpoint's state, None when it is fresh.
        slots: The slots the checkpoint groups its key groups into (None: one group per
            key group, or fresh).
        superseded: Whether the checkpoint on disk began before ``restore`` (a rollback):
            it is moved aside, and the run starts a fresh one at the same location.
    """

    epoch_base: int = 0
    restore: ManifestEntry | None = None
    fresh: bool = True
    key_groups: int | None = None
    slots: int | None = None
    superseded: bool = False


def resolve_lineage(epochs: EpochLog, checkpoint: CheckpointReader, root: SnapshotRoot) -> Lineage:
    """Check that the checkpoint belongs to the snapshot root, and map its micro-batches.

    A checkpoint superseded by a restore epoch (a rollback) is moved aside, and the run
    starts from the restore epoch with a fresh checkpoint at the same location.

    Raises:
        PipelineMismatchError: The root holds epochs of another checkpoint, or the
            checkpoint has committed micro-batches the root knows nothing about.
    """
    lineage = read_lineage(epochs, checkpoint, root)
    if lineage.superseded and lineage.restore is not None:
        # Its planned micro-batches would replay the source offsets and restore rows
        # it began with, not the newer restore epoch's.
        moved = checkpoint.move_aside(f"{SUPERSEDED}{lineage.restore.epoch}")
        log.warning(
            "checkpoint %s was superseded by restore epoch %d (%s); moved it to %s",
            checkpoint.location,
            lineage.restore.epoch,
            lineage.restore.origin,
            moved,
        )
    return lineage


def read_lineage(epochs: EpochLog, checkpoint: CheckpointReader, root: SnapshotRoot) -> Lineage:
    """:func:`resolve_lineage` without its side effect: a superseded checkpoint stays.

    What a look before a start asks (is the checkpoint fresh, or does it continue?).

    Raises:
        PipelineMismatchError: As :func:`resolve_lineage`.
    """
    decided = epochs.latest_decided()
    query_id = checkpoint.query_id()
    mine = [
        e
        for e in epochs.entries
        if query_id is not None
        and e.query_id == query_id
        and e.batch_id is not None
        and e.status is not EpochStatus.ABORTED
    ]
    if decided is not None and decided.is_restore:
        began = mine[-1].epoch if mine else None
        superseded = (
            decided.epoch > began
            if began is not None
            else bool(checkpoint.planned_batches()) and not checkpoint.committed_batches()
        )
        if superseded:
            return replace(_start_from(decided), superseded=True)
    if mine and decided is not None:
        last = mine[-1]
        assert last.batch_id is not None
        base = last.epoch - last.batch_id
        start = epochs.latest(base - 1)
        return Lineage(
            epoch_base=base,
            restore=start if start is not None and start.is_restore else None,
            fresh=False,
            key_groups=last.key_groups,
            slots=last.run.slots if last.run is not None else None,
        )
    committed = checkpoint.committed_batches()
    if committed:
        raise PipelineMismatchError(
            f"checkpoint {checkpoint.location} has committed micro-batches up to "
            f"{committed[-1]}, but snapshot root {root} has no snapshot of them. Use a new "
            f"checkpoint location with this root, or the root this checkpoint was used with"
        )
    if decided is None:
        return Lineage()
    if decided.is_restore:
        return _start_from(decided)
    written = decided.run.checkpoint if decided.run is not None else None
    raise PipelineMismatchError(
        f"snapshot root {root} holds epochs up to {decided.epoch} written through checkpoint "
        f"{written or decided.query_id}, but checkpoint {checkpoint.location} is "
        f"new. Restart with the checkpoint the root was written with; to start a new "
        f"checkpoint (e.g. with another partition or key-group count), first run "
        f"pyspark_abs.rollback({root!r}, {decided.epoch})"
    )


def written_slots(epochs: EpochLog, query_id: str | None) -> int | None:
    """The slots the checkpoint of ``query_id`` recorded with its newest epoch (None: none)."""
    mine = [e for e in epochs.entries if query_id is not None and e.query_id == query_id]
    ran = [e.run for e in mine if e.batch_id is not None and e.run is not None]
    return ran[-1].slots if ran else None


def _start_from(restore: ManifestEntry) -> Lineage:
    return Lineage(epoch_base=restore.epoch + 1, restore=restore)
