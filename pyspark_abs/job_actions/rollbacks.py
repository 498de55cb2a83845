"""A job's rollback to one of its job snapshots, and its restore into a new job root.

Both are job-wide decisions (see :mod:`~pyspark_abs.job_actions.decisions`).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import ConfigError, SnapshotRootError
from pyspark_abs.job_actions.decisions import decide, finish, restore_into
from pyspark_abs.job_actions.tags import job_epoch
from pyspark_abs.job_ledger.manifest import JobDecision, JobRecord, open_job
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore


def rollback_job(root: str, epoch: int | str, *, config: AbsConfig | None = None) -> JobDecision:
    """Roll every stage, channel and sink of the job at ``root`` back to job snapshot ``epoch``.

    ``epoch`` is a job snapshot's number or a job savepoint's name. See
    :meth:`~pyspark_abs.job.declaration.Job.rollback`.
    """
    root = SnapshotRoot(root)
    store = DeltaStore()
    manifest = open_job(store, root, None)
    target = job_epoch(root, epoch)
    return decide(store, manifest, JobRecord.ROLLBACK, epoch=target, config=config)


def restore_job(
    root: str,
    epoch: int | str,
    into: str,
    stages: Mapping[str, str] | None = None,
    *,
    config: AbsConfig | None = None,
) -> JobDecision:
    """Copy job snapshot ``epoch`` of the job at ``root`` into a new job root ``into``.

    Every stage is copied into its new snapshot root as restore epoch ``epoch``, so the
    new job continues at ``epoch + 1`` with one epoch numbering: the head stages from
    their sources' offsets of ``epoch``, the others from their (new, empty) channels.
    The new job needs its own sink tables. The new job manifest records the restore
    PREPARED before any stage is copied and COMMITTED after: running it again, or
    starting the new job, finishes an interrupted restore.

    Args:
        root: The job root to copy from.
        epoch: One of its job snapshots, or a job savepoint's name.
        into: The new job root.
        stages: Each stage's new snapshot root (default: ``<into>/stages/<name>``).
        config: File size and injected faults (default: ``AbsConfig()``).

    Raises:
        SnapshotNotFoundError: ``root`` is not a job root or ``epoch`` not a job snapshot.
        SnapshotRootError: ``into`` already holds a job with epochs, or a stage's new root
            holds epochs.
        ConfigError: ``stages`` does not name exactly the job's stages.
    """
    root, into = SnapshotRoot(root), SnapshotRoot(into)
    store = DeltaStore()
    source = open_job(store, root, None)
    target = open_job(store, into, source.job)
    if target.unfinished is not None:
        return finish(store, target, config).decisions[-1]
    if target.decisions:
        raise SnapshotRootError(f"job root {into} already holds a job; restore into a new root")
    new_stages = {
        n: SnapshotRoot(r)
        for n, r in (stages or {n: f"{target.root}/stages/{n}" for n in source.stages}).items()
    }
    if set(new_stages) != set(source.stages):
        raise ConfigError(
            f"restore of job {source.job!r} into {into}: give a new root for exactly the "
            f"stages {sorted(source.stages)}, got {sorted(new_stages)}"
        )
    return restore_into(store, source, target, new_stages, job_epoch(root, epoch), config)
