"""Job-wide operations on a job root: list its snapshots, roll it back, finish a rollback.

They need only the roots (the job manifest names the stages' snapshot roots), so the CLI
runs them without the job's definition and without Spark.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pyspark_abs.admin.savepoints import rollback_stage
from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import ConcurrentWriteError, SnapshotNotFoundError
from pyspark_abs.job.cut import JobSnapshot, StageEpochs, job_snapshots
from pyspark_abs.job.manifest import (
    JobManifest,
    JobRecord,
    Rollback,
    RollbackStatus,
    open_job,
    record,
)
from pyspark_abs.manifest.table import load_epoch_log
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
    return snapshots_of(open_job(DeltaStore(), root, None).stages)


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
    restore_epoch = 1 + max(
        max((e.epoch for e in load_epoch_log(store, _manifest_uri(r)).entries), default=-1)
        for r in manifest.stages.values()
    )
    try:
        manifest = record(
            store,
            manifest,
            record=JobRecord.ROLLBACK.value,
            status=RollbackStatus.PREPARED.value,
            epoch=snapshot.epoch,
            restore_epoch=restore_epoch,
            stage_epochs=dict(snapshot.stages),
        )
    except ConcurrentWriteError as err:
        raise ConcurrentWriteError(
            f"job {manifest.job!r}: another process changed the job manifest while rolling "
            f"back to epoch {epoch}; nothing was changed. List the job snapshots and try "
            f"again ({err})"
        ) from None
    rollback = manifest.unfinished
    assert rollback is not None
    finish_unfinished(store, manifest, config)
    return Rollback(rollback.epoch, restore_epoch, rollback.stage_epochs, RollbackStatus.COMMITTED)


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
    log.info("job %s: finishing its rollback to epoch %d", manifest.job, rollback.epoch)
    for name, epoch in rollback.stage_epochs.items():
        rollback_stage(manifest.stages[name], epoch, rollback.restore_epoch, config=config)
    return record(
        store,
        manifest,
        record=JobRecord.ROLLBACK.value,
        status=RollbackStatus.COMMITTED.value,
        epoch=rollback.epoch,
        restore_epoch=rollback.restore_epoch,
        stage_epochs=dict(rollback.stage_epochs),
    )


def _manifest_uri(root: str) -> str:
    return SnapshotRoot(root).manifest_uri
