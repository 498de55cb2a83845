"""Recovery on start: load the manifest and check that root and checkpoint belong together.

After these checks the coordinator commits every epoch left PREPARED by an earlier run
(:meth:`~pyspark_abs.coordinator.EpochCoordinator.recover`); Spark then replays the
micro-batches it had not committed, and the coordinator discards replays of decided epochs.
"""

from __future__ import annotations

import json

from pyspark_abs.checkpoint import CheckpointReader
from pyspark_abs.errors import ManifestError, PipelineMismatchError
from pyspark_abs.manifest import (
    FORMAT_VERSION,
    MANIFEST_SCHEMA,
    EpochLog,
    EpochStatus,
    ManifestEntry,
)
from pyspark_abs.store import DeltaStore, TableSpec


def manifest_spec(root: str, pipeline: str) -> TableSpec:
    """The ``_manifest`` table of a snapshot root."""
    return TableSpec(
        table="_manifest",
        uri=f"{root}/_manifest",
        schema=MANIFEST_SCHEMA,
        description=json.dumps({"pipeline": pipeline, "format_version": FORMAT_VERSION}),
    )


def open_manifest(store: DeltaStore, root: str, pipeline: str) -> EpochLog:
    """Create the root's manifest, or load it after checking it belongs to ``pipeline``.

    Raises:
        PipelineMismatchError: The root belongs to another pipeline.
        ManifestError: The manifest cannot be read or breaks the epoch state machine.
    """
    spec = manifest_spec(root, pipeline)
    if store.exists(spec.uri):
        owner = manifest_owner(store, root)
        if owner != pipeline:
            raise PipelineMismatchError(
                f"snapshot root {root} belongs to pipeline {owner!r}, not {pipeline!r}; give "
                f"this pipeline its own snapshot root"
            )
    store.ensure_table(spec)
    try:
        rows = store.read(spec.uri).to_pylist()
        return EpochLog(ManifestEntry.from_row(r) for r in rows)
    except ManifestError:
        raise
    except Exception as err:
        raise ManifestError(f"cannot read the manifest at {spec.uri}: {err}") from err


def manifest_owner(store: DeltaStore, root: str) -> str | None:
    """The pipeline a snapshot root belongs to, from its manifest's description."""
    description = store.description(f"{root}/_manifest")
    try:
        owner = json.loads(description or "{}").get("pipeline")
    except json.JSONDecodeError:
        owner = None
    return owner if isinstance(owner, str) else None


def check_lineage(epochs: EpochLog, checkpoint: CheckpointReader, root: str) -> None:
    """Check that the checkpoint is the one the snapshot root was written through.

    Raises:
        PipelineMismatchError: The root holds epochs of another checkpoint, or the
            checkpoint has committed micro-batches the root knows nothing about.
    """
    decided = [
        e for e in epochs.entries if e.status in (EpochStatus.PREPARED, EpochStatus.COMMITTED)
    ]
    query_id = checkpoint.query_id()
    if decided:
        expected = decided[-1].query_id
        if query_id is None:
            raise PipelineMismatchError(
                f"snapshot root {root} holds epochs up to {decided[-1].epoch} written through "
                f"checkpoint query {expected}, but checkpoint {checkpoint.location} is new. "
                f"Restart with the checkpoint location the root was written with, or use a new "
                f"snapshot root"
            )
        if query_id != expected:
            raise PipelineMismatchError(
                f"snapshot root {root} was written through checkpoint query {expected}, but "
                f"checkpoint {checkpoint.location} belongs to query {query_id}. Use the "
                f"matching checkpoint location or another snapshot root"
            )
        return
    committed = checkpoint.committed_batches()
    if committed:
        raise PipelineMismatchError(
            f"checkpoint {checkpoint.location} has committed micro-batches up to "
            f"{committed[-1]}, but snapshot root {root} has no snapshot of them. Use a new "
            f"checkpoint location with this root, or the root this checkpoint was used with"
        )
