"""Job-wide operations on a job root: list its snapshots, roll it back, finish a rollback.

They need only the roots (the job manifest names the stages' snapshot roots), so the CLI
runs them without the job's definition and without Spark.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from pyspark_abs.admin.job_manifest import (
    JobManifest,
    JobRecord,
    Rollback,
    RollbackStatus,
    open_job,
    record,
    record_installation,
)
from pyspark_abs.admin.savepoints import restore_stage, rollback_stage
from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import (
    ConcurrentWriteError,
    ConfigError,
    SnapshotNotFoundError,
    SnapshotRootError,
)
from pyspark_abs.job.cut import JobSnapshot, StageEpochs, job_snapshots
from pyspark_abs.manifest.table import load_epoch_log
from pyspark_abs.protocol.lease import require_no_live_holder
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore

log = logging.getLogger(__name__)


def snapshots_of(stages: Mapping[str, str]) -> list[JobSnapshot]:
    """The job snapshots of stages (name to snapshot root), oldest first."""
    store = DeltaStore()
    found = []
    for name, root in stages.items():
        uri = SnapshotRoot(root).manifest_uri
        if not store.exists(uri):
            return []
        epochs = load_epoch_log(store, uri)
        prepared = [p for p in map(epochs.prepared, {e.epoch for e in epochs.entries}) if p]
        found.append(
            StageEpochs.of(
                name,
                (p.epoch for p in prepared),
                (e.epoch for e in epochs.snapshots()),
                (p.epoch for p in prepared if p.is_restore),
            )
        )
    return job_snapshots(found)


def job_snapshots_at(root: str) -> list[JobSnapshot]:
    """The job snapshots of the job at ``root``, oldest first.

    Raises:
        SnapshotNotFoundError: ``root`` is not a job root.
    """
    return snapshots_of(job_stages(root))


def job_stages(root: str) -> dict[str, str]:
    """The stages of the job at ``root`` and their snapshot roots, as last recorded.

    Raises:
        SnapshotNotFoundError: ``root`` is not a job root.
    """
    return dict(open_job(DeltaStore(), root, None).stages)


def pick(job: str, found: list[JobSnapshot], epoch: int | None) -> JobSnapshot:
    """Job snapshot ``epoch`` (None: the newest) among ``found``.

    Raises:
        SnapshotNotFoundError: It is not there; the message lists those that are.
    """
    if not found:
        raise SnapshotNotFoundError(
            f"job {job!r} has no job snapshot yet: some stage has committed nothing"
        )
    if epoch is None:
        return found[-1]
    for snapshot in found:
        if snapshot.epoch == epoch:
            return snapshot
    raise SnapshotNotFoundError(
        f"epoch {epoch} is not a job snapshot of job {job!r} (not every stage has committed it "
        f"as a snapshot); job snapshots are {[s.epoch for s in found]}"
    )


def rollback_job(root: str, epoch: int, *, config: AbsConfig | None = None) -> Rollback:
    """Roll every stage, channel and sink of the job at ``root`` back to job snapshot ``epoch``.

    See :meth:`~pyspark_abs.job.declaration.Job.rollback`.
    """
    store = DeltaStore()
    manifest = finish_unfinished(store, open_job(store, root, None), config)
    snapshot = pick(manifest.job, snapshots_of(manifest.stages), epoch)
    for name, stage_root in manifest.stages.items():  # before the decision, which binds
        require_no_live_holder(stage_root, f"a rollback of job {manifest.job!r} (stage {name!r})")
    restore_epoch = 1 + max(
        max((e.epoch for e in load_epoch_log(store, _manifest_uri(r)).entries), default=-1)
        for r in manifest.stages.values()
    )
    try:
        decided = Rollback(
            snapshot.epoch, restore_epoch, dict(snapshot.stages), RollbackStatus.PREPARED
        )
        manifest = record_installation(store, manifest, decided)
    except ConcurrentWriteError as err:
        raise ConcurrentWriteError(
            f"job {manifest.job!r}: another process changed the job manifest while rolling "
            f"back to epoch {epoch}; nothing was changed. List the job snapshots and try "
            f"again ({err})"
        ) from None
    return _finished(store, manifest, config)


def finish_unfinished(
    store: DeltaStore, manifest: JobManifest, config: AbsConfig | None = None
) -> JobManifest:
    """Finish a rollback that was decided (PREPARED) but not committed, if there is one.

    Installs its restore epoch in every stage (a stage that has it already is left as it
    is), then records COMMITTED.
    """
    rollback = manifest.unfinished
    if rollback is None:
        return manifest
    log.info("job %s: finishing the installation of epoch %d", manifest.job, rollback.epoch)
    for name, epoch in rollback.stage_epochs.items():
        if rollback.source is None:
            rollback_stage(manifest.stages[name], epoch, rollback.restore_epoch, config=config)
        else:
            restore_stage(
                rollback.source_stages[name],
                epoch,
                manifest.stages[name],
                rollback.restore_epoch,
                config=config,
            )
    return record_installation(store, manifest, replace(rollback, status=RollbackStatus.COMMITTED))


def restore_job(
    root: str,
    epoch: int,
    into: str,
    stages: Mapping[str, str] | None = None,
    *,
    config: AbsConfig | None = None,
) -> Rollback:
    """Copy job snapshot ``epoch`` of the job at ``root`` into a new job root ``into``.

    Every stage is copied into its new snapshot root as restore epoch ``epoch``, so the
    new job continues at ``epoch + 1`` with one epoch numbering: the head stages from
    their sources' offsets of ``epoch``, the others from their (new, empty) channels.
    The new job needs its own sink tables. The new job manifest records the restore
    PREPARED before any stage is copied and COMMITTED after: running it again, or
    starting the new job, finishes an interrupted restore.

    Args:
        root: The job root to copy from.
        epoch: One of its job snapshots.
        into: The new job root.
        stages: Each stage's new snapshot root (default: ``<into>/stages/<name>``).
        config: File size and injected faults (default: ``AbsConfig()``).

    Raises:
        SnapshotNotFoundError: ``root`` is not a job root or ``epoch`` not a job snapshot.
        SnapshotRootError: ``into`` already holds a job with epochs, or a stage's new root
            holds epochs.
    """
    store = DeltaStore()
    source = open_job(store, root, None)
    target = open_job(store, into, source.job)
    if target.unfinished is not None:
        return _finished(store, target, config)
    if target.rollbacks:
        raise SnapshotRootError(f"job root {into} already holds a job; restore into a new root")
    snapshot = pick(source.job, snapshots_of(source.stages), epoch)
    new_stages = dict(stages or {n: f"{target.root}/stages/{n}" for n in source.stages})
    if set(new_stages) != set(source.stages):
        raise ConfigError(
            f"restore of job {source.job!r} into {into}: give a new root for exactly the "
            f"stages {sorted(source.stages)}, got {sorted(new_stages)}"
        )
    target = record(store, target, record=JobRecord.STAGES.value, stages=new_stages)
    decided = Rollback(
        snapshot.epoch,
        snapshot.epoch,
        dict(snapshot.stages),
        RollbackStatus.PREPARED,
        source.root,
        dict(source.stages),
    )
    target = record_installation(store, target, decided)
    return _finished(store, target, config)


def _finished(store: DeltaStore, manifest: JobManifest, config: AbsConfig | None) -> Rollback:
    """Finish the manifest's unfinished installation and return it, committed."""
    unfinished = manifest.unfinished
    assert unfinished is not None
    finish_unfinished(store, manifest, config)
    return replace(unfinished, status=RollbackStatus.COMMITTED)


def _manifest_uri(root: str) -> str:
    return SnapshotRoot(root).manifest_uri
