"""Listing a job's snapshots from its stages' manifests, and picking one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pyspark_abs.errors import ConfigError, SnapshotNotFoundError
from pyspark_abs.job_ledger.cut import JobSnapshot, StageEpochs, job_snapshots
from pyspark_abs.job_ledger.manifest import (
    DecisionStatus,
    JobDecision,
    JobManifest,
    JobRecord,
    open_job,
)
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.manifest.table import load_epoch_log
from pyspark_abs.sources.channel.plan import channel_offsets
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore


def snapshots_of(stages: Mapping[str, SnapshotRoot]) -> list[JobSnapshot]:
    """The job snapshots of stages (name to snapshot root), oldest first."""
    store = DeltaStore()
    found = []
    for name, root in stages.items():
        uri = root.manifest_uri
        if not store.exists(uri):
            return []
        found.append(stage_epochs(name, load_epoch_log(store, uri)))
    return job_snapshots(found)


def stage_epochs(name: str, epochs: EpochLog) -> StageEpochs:
    """What a stage's manifest says about its epochs, for the job's cuts."""
    prepared = [p for p in map(epochs.prepared, {e.epoch for e in epochs.entries}) if p]
    return StageEpochs.of(
        name,
        (p.epoch for p in prepared),
        (e.epoch for e in epochs.snapshots()),
        (p.epoch for p in prepared if p.is_restore),
        (p.epoch for p in prepared if _read_taken_back(p)),
    )


def _read_taken_back(entry: ManifestEntry) -> bool:
    return any(o.taken_back for o in channel_offsets(entry.source_offsets))


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


def next_restore_epoch(store: DeltaStore, stages: Mapping[str, SnapshotRoot]) -> int:
    """The epoch after every epoch of every stage: a job-wide restore epoch."""
    newest = -1
    for root in stages.values():
        uri = root.manifest_uri
        if store.exists(uri):
            epochs = load_epoch_log(store, uri).entries
            newest = max(newest, max((e.epoch for e in epochs), default=-1))
    return newest + 1


def require_newest(
    store: DeltaStore, manifest: JobManifest, name: str, snapshot: JobSnapshot, action: str
) -> None:
    """Refuse ``action`` unless job snapshot ``snapshot`` holds stage ``name``'s newest one.

    State derived from a stage's newest snapshot (written state) goes into the job at the
    job snapshot; it must not hold upstream epochs the other stages would read again.

    Raises:
        ConfigError: The stage has snapshots after the job snapshot.
    """
    epochs = load_epoch_log(store, manifest.stages[name].manifest_uri)
    newest = epochs.snapshots()[-1].epoch
    if newest != snapshot.stages[name]:
        raise ConfigError(
            f"cannot {action}: stage {name!r} of job {manifest.job!r} has snapshots up to "
            f"epoch {newest}, after job snapshot {snapshot.epoch}, the newest every stage "
            f"has; nothing was changed. Run the job until every stage has read everything "
            f"(Job.run), then read the state again and write it"
        )


def job_stages(root: str) -> dict[str, SnapshotRoot]:
    """The stages of the job at ``root`` and their snapshot roots, as last recorded.

    Raises:
        SnapshotNotFoundError: ``root`` is not a job root.
    """
    root = SnapshotRoot(root)
    return dict(open_job(DeltaStore(), root, None).stages)


def job_snapshots_at(root: str) -> list[JobSnapshot]:
    """The job snapshots of the job at ``root``, oldest first.

    Raises:
        SnapshotNotFoundError: ``root`` is not a job root.
    """
    return snapshots_of(job_stages(root))


def job_origins(decisions: Iterable[JobDecision]) -> dict[int, str]:
    """What made each job snapshot that a job-wide decision made, by its restore epoch."""
    said = {
        JobRecord.ROLLBACK: lambda d: f"rollback to {d.epoch}",
        JobRecord.RESTORE: lambda d: f"restore of {d.source} at {d.epoch}",
        JobRecord.MIGRATE: lambda d: f"state migration of {', '.join(sorted(d.states))}",
        JobRecord.WRITE_STATE: lambda d: f"write_state of {', '.join(sorted(d.states))}",
    }
    return {
        d.restore_epoch: said[d.kind](d)
        for d in decisions
        if d.status is DecisionStatus.COMMITTED and d.kind in said
    }
