"""Named job savepoints: one name on every stage's snapshot of a job snapshot.

A job savepoint is a named savepoint (see :mod:`pyspark_abs.upkeep.tags`) on each stage's
snapshot of one job snapshot, so retention keeps it in every stage, and the job resolves
the name to the job snapshot whose stage epochs all carry it. Naming is one manifest
commit per stage: if a crash leaves the name on some stages only, the name resolves to
nothing until it is given again.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark_abs.errors import SnapshotNotFoundError
from pyspark_abs.job_ledger.cut import JobSnapshot
from pyspark_abs.job_ledger.listing import job_stages, pick, snapshots_of
from pyspark_abs.job_ledger.manifest import open_job
from pyspark_abs.manifest.table import open_root
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore
from pyspark_abs.upkeep.tags import check_name, tag


def tag_job(root: str, epoch: int | str, name: str, *, move: bool = False) -> JobSnapshot:
    """Name job snapshot ``epoch`` (a number or another job savepoint's name) ``name``.

    Raises:
        ConfigError: ``name`` is not a valid name, or names another snapshot of a stage
            (without ``move``); stages named before the refusal keep the name, and naming
            again with ``move=True`` finishes the job.
        SnapshotNotFoundError: ``root`` is not a job root, or ``epoch`` is not a job snapshot.
    """
    root = SnapshotRoot(root)
    check_name(name)
    stages = job_stages(root)
    job = open_job(DeltaStore(), root, None).job
    snapshot = pick(job, snapshots_of(stages), job_epoch(root, epoch))
    for stage, stage_root in stages.items():
        tag(stage_root, snapshot.stages[stage], name, move=move)
    return snapshot


def job_epoch(root: str, epoch: int | str) -> int:
    """The job snapshot ``epoch`` names: itself, or the job savepoint of that name.

    Raises:
        SnapshotNotFoundError: No job snapshot has the name on every stage; the message
            says which stages lack it, or lists the names every stage has.
    """
    root = SnapshotRoot(root)
    if not isinstance(epoch, str):
        return epoch
    store = DeltaStore()
    stages = job_stages(root)
    job = open_job(store, root, None).job
    names = {stage: open_root(store, stage_root).tags() for stage, stage_root in stages.items()}
    lacking = sorted(stage for stage, tags in names.items() if epoch not in tags)
    if lacking:
        common = set.intersection(*(set(tags) for tags in names.values())) if names else set()
        raise SnapshotNotFoundError(
            f"job {job!r} has no savepoint named {epoch!r}: stage(s) {lacking} lack the name "
            f"(job savepoints: {sorted(common) or 'none'}). Name a job snapshot with "
            f"Job.tag(epoch, name) or pyspark-abs job-tag"
        )
    named = {stage: tags[epoch] for stage, tags in names.items()}
    for snapshot in snapshots_of(stages):
        if dict(snapshot.stages) == named:
            return snapshot.epoch
    raise SnapshotNotFoundError(
        f"the snapshots named {epoch!r} in job {job!r}'s stages ({named}) are no job "
        f"snapshot, or one that has expired; name a job snapshot again with Job.tag(epoch, "
        f"{epoch!r}, move=True)"
    )


def stages_named(stages: Mapping[str, SnapshotRoot], name: str) -> list[str]:
    """The stages (name to snapshot root) that have a savepoint named ``name``."""
    store = DeltaStore()
    return sorted(stage for stage, root in stages.items() if name in open_root(store, root).tags())
