"""Job-wide decisions: every stage of a job installs one job snapshot as one restore epoch.

A job rollback, a job restore, a state migration of a stage and state written to a stage
all change the stages' epochs, and the stages must keep one epoch numbering so that their
channels stay aligned. Each is therefore one decision for the whole job, made in the job
manifest (:mod:`~pyspark_abs.job_ledger.manifest`) in two phases:

1. every stage's lease is taken, so no stage runs (or starts) while the job decides, and
   no sink would go back across another writer's DELETE (checked before deciding);
2. state the decision installs (a migration's, written state) is written as files;
3. PREPARED records job snapshot ``n``, the restore epoch ``R`` after every epoch of every
   stage, and those files: the decision;
4. each stage installs its snapshot of ``n`` (or the decided state) as restore epoch ``R``,
   with its channels moved to upstream epoch ``R + 1``;
5. COMMITTED, and the leases are released.

A crash after 3 leaves the decision PREPARED. Every stage's own start finishes its part
before it runs (:func:`settle_stage`: a stage knows its job from a link file in its root),
and the job's next start or job-wide operation finishes the rest. A decision one stage can
no longer take (an older pyspark-abs let it run epochs of its own meanwhile) is ABANDONED
and decided again with a later restore epoch. Finishing needs neither Spark nor the job's
code: the CLI can do it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace

from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import (
    ConcurrentWriteError,
    FencingError,
    ManifestError,
    UncommittableEpochError,
)
from pyspark_abs.install.copying import restore_stage
from pyspark_abs.install.installing import (
    StateInstall,
    install_snapshot,
    open_writer,
    snapshot_of,
)
from pyspark_abs.install.sink_restores import check_sink_restores
from pyspark_abs.install.stuck_epochs import recover, unfinishable
from pyspark_abs.job_ledger.cut import JobSnapshot
from pyspark_abs.job_ledger.links import link_stages, linked_job
from pyspark_abs.job_ledger.listing import (
    next_restore_epoch,
    pick,
    snapshots_of,
)
from pyspark_abs.job_ledger.manifest import (
    DecisionStatus,
    JobDecision,
    JobManifest,
    JobRecord,
    open_job,
    record,
    record_decisions,
)
from pyspark_abs.logs import logger
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.manifest.info import SnapshotInfo
from pyspark_abs.manifest.table import load_epoch_log
from pyspark_abs.protocol.epoch_writer import EpochWriter
from pyspark_abs.protocol.lease import Lease, read_lease
from pyspark_abs.sources.channel.plan import realigned
from pyspark_abs.sources.rewind import require_rewindable
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore

log = logger(__name__)

States = Callable[[JobSnapshot, int], Mapping[str, StateInstall]]
"""Writes the state a decision installs in some stages, given the job snapshot and the
restore epoch, and returns it by stage."""


@dataclass
class _Held:
    """The stages' leases a job-wide operation holds, and their writers."""

    store: DeltaStore
    leases: dict[SnapshotRoot, Lease]
    config: AbsConfig
    configs: Mapping[str, AbsConfig]

    def config_of(self, stage: str) -> AbsConfig:
        """The configuration a stage's part is installed with (file size, faults)."""
        return self.configs.get(stage, self.config)

    def writer(self, stage: str, root: SnapshotRoot, pipeline: str | None) -> EpochWriter:
        """A writer of a stage's root that writes as the holder of its lease."""
        lease = self.leases[root]
        return open_writer(self.store, root, pipeline, self.config_of(stage), lease)


@contextmanager
def _holding(
    store: DeltaStore,
    action: str,
    roots: Mapping[str, SnapshotRoot],
    config: AbsConfig,
    configs: Mapping[str, AbsConfig] | None = None,
) -> Iterator[_Held]:
    """Take every stage's lease (stage name to root) for a job-wide ``action``.

    Raises:
        FencingError: A stage runs (or another job-wide operation holds it); the leases
            taken so far are given back and nothing is changed.
    """
    run_id = f"job-{uuid.uuid4().hex}"
    leases: dict[SnapshotRoot, Lease] = {}
    try:
        for name, root in roots.items():
            try:
                leases[root] = Lease.acquire(root, name, run_id)
            except FencingError:
                holder = read_lease(root)
                shown = "another run" if holder is None else holder.describe(time.time())
                raise FencingError(
                    f"{action} is refused: stage {name!r} is held by {shown}; nothing was "
                    f"changed. Stop every stage of the job first"
                ) from None
        yield _Held(store, leases, config, dict(configs or {}))
    finally:
        for lease in leases.values():
            lease.release()


def decide(
    store: DeltaStore,
    manifest: JobManifest,
    kind: JobRecord,
    *,
    epoch: int | None = None,
    states: States | None = None,
    config: AbsConfig | None = None,
    configs: Mapping[str, AbsConfig] | None = None,
) -> JobDecision:
    """Install job snapshot ``epoch`` (None: the newest) in every stage, as one decision.

    ``states`` writes the state that replaces some stages' own (a migration, written state).
    Each stage's part is installed with its configuration in ``configs`` (by stage name),
    else with ``config``: their file size and injected faults matter.

    Returns:
        The decision, COMMITTED.

    Raises:
        FencingError: A stage is running; nothing was changed.
        SnapshotNotFoundError: ``epoch`` is not a job snapshot, or the job has none.
        ConcurrentWriteError: Another process decided at the same moment; nothing was
            changed by this one.
        CommitError: A table could not be installed; the decision stays PREPARED and is
            finished by the next start of the job or of a stage, or the next operation.

    An unfinished decision that can never be finished, because files a stage's part needs
    are gone (see :mod:`~pyspark_abs.install.stuck_epochs`), is recorded ABANDONED with this
    one, which replaces its stuck parts.
    """
    config = config if config is not None else AbsConfig()
    action = f"a {kind.value.lower().replace('_', ' ')} of job {manifest.job!r}"
    with _holding(store, action, manifest.stages, config, configs) as held:
        try:
            manifest = _finish(held, manifest)
            stuck = None
        except UncommittableEpochError:
            manifest = open_job(store, manifest.root, manifest.job)
            stuck = manifest.unfinished  # it can never be finished: this decision replaces it
            if stuck is None:
                raise
        snapshot = pick(manifest.job, snapshots_of(manifest.stages), epoch)
        for name, stage_epoch in snapshot.stages.items():  # once decided, it is finished
            writer = held.writer(name, manifest.stages[name], None)
            check_sink_restores(writer, snapshot_of(writer.epochs, stage_epoch, writer.root))
        restore_epoch = next_restore_epoch(store, manifest.stages)
        written = states(snapshot, restore_epoch) if states is not None else {}
        decided = JobDecision(
            kind,
            snapshot.epoch,
            restore_epoch,
            dict(snapshot.stages),
            DecisionStatus.PREPARED,
            states={n: s.to_json() for n, s in written.items()},
        )
        replaced = () if stuck is None else (replace(stuck, status=DecisionStatus.ABANDONED),)
        try:
            manifest = record_decisions(store, manifest, *replaced, decided)
        except ConcurrentWriteError as err:
            raise ConcurrentWriteError(
                f"job {manifest.job!r}: another process changed the job manifest while "
                f"deciding a {kind.value.lower()} to job snapshot {snapshot.epoch}; nothing "
                f"was changed. List the job snapshots and try again ({err})"
            ) from None
        return _finished(held, manifest)


def restore_into(
    store: DeltaStore,
    source: JobManifest,
    target: JobManifest,
    stages: Mapping[str, SnapshotRoot],
    epoch: int,
    config: AbsConfig | None = None,
) -> JobDecision:
    """Decide and install a copy of job snapshot ``epoch`` of ``source`` into ``target``.

    Each stage is copied into its new root ``stages[name]`` as restore epoch ``epoch``.
    """
    config = config if config is not None else AbsConfig()
    target = record(store, target, record=JobRecord.STAGES.value, stages=dict(stages))
    link_stages(target.job, target.root, stages)
    snapshot = pick(source.job, snapshots_of(source.stages), epoch)
    with _holding(store, f"a restore of job {target.job!r}", stages, config) as held:
        decided = JobDecision(
            JobRecord.RESTORE,
            snapshot.epoch,
            snapshot.epoch,
            dict(snapshot.stages),
            DecisionStatus.PREPARED,
            source.root,
            dict(source.stages),
        )
        return _finished(held, record_decisions(store, target, decided))


def finish(
    store: DeltaStore,
    manifest: JobManifest,
    config: AbsConfig | None = None,
    configs: Mapping[str, AbsConfig] | None = None,
) -> JobManifest:
    """Finish the job's unfinished decision, if it has one (taking every stage's lease).

    Each stage's part is installed with its configuration in ``configs``, else ``config``.

    Raises:
        FencingError: A stage is running (it has installed its part: it may run on).
    """
    if manifest.unfinished is None:
        return manifest
    config = config if config is not None else AbsConfig()
    action = f"finishing a decision of job {manifest.job!r}"
    with _holding(store, action, manifest.stages, config, configs) as held:
        return _finish(held, manifest)


def _finished(held: _Held, manifest: JobManifest) -> JobDecision:
    """Finish the manifest's unfinished decision and return it, committed."""
    finished = _finish(held, manifest)
    decided = finished.decisions[-1]
    assert decided.status is DecisionStatus.COMMITTED
    return decided


def _finish(held: _Held, manifest: JobManifest) -> JobManifest:
    """Install the unfinished decision in every stage, then record COMMITTED.

    A stage that has its part keeps it. If a stage can no longer take the decision, it is
    decided again with a later restore epoch.
    """
    decision = manifest.unfinished
    if decision is None:
        return manifest
    store = held.store
    log.info(
        "job %s: finishing the %s to job snapshot %d (restore epoch %d)",
        manifest.job,
        decision.kind.value.lower(),
        decision.epoch,
        decision.restore_epoch,
    )
    blocked = [n for n in decision.stage_epochs if _blocks(store, manifest, decision, n)]
    if blocked and decision.kind is not JobRecord.RESTORE:
        again = replace(decision, restore_epoch=next_restore_epoch(store, manifest.stages))
        log.warning(
            "job %s: stage(s) %s ran past restore epoch %d of the unfinished %s; deciding it "
            "again as restore epoch %d",
            manifest.job,
            blocked,
            decision.restore_epoch,
            decision.kind.value.lower(),
            again.restore_epoch,
        )
        abandoned = replace(decision, status=DecisionStatus.ABANDONED)
        manifest = record_decisions(store, manifest, abandoned, again)
        decision = again
    for name in decision.stage_epochs:
        root = manifest.stages[name]
        writer = held.writer(name, root, None if decision.source is None else name)
        install_part(writer, manifest, decision, name, held.config_of(name))
    return record_decisions(store, manifest, replace(decision, status=DecisionStatus.COMMITTED))


def _blocks(store: DeltaStore, manifest: JobManifest, decision: JobDecision, name: str) -> bool:
    """Whether a stage ran epochs from the restore epoch on without installing its part.

    A stage that installed its part may have run on after it: that is no conflict.
    """
    uri = manifest.stages[name].manifest_uri
    if not store.exists(uri):
        return False
    epochs = load_epoch_log(store, uri)
    part = epochs.latest(decision.restore_epoch)
    if part is not None:
        return not _is_part(part, manifest, decision, name)
    return any(e.epoch > decision.restore_epoch for e in epochs.entries)


def _is_part(entry: ManifestEntry, manifest: JobManifest, decision: JobDecision, name: str) -> bool:
    """Whether a stage's entry is its part of ``decision`` (older ones name no job)."""
    return (
        entry.epoch == decision.restore_epoch
        and entry.is_restore
        and entry.restored_from == decision.stage_epochs[name]
        and entry.restore is not None
        and entry.restore.job in (None, manifest.root)
    )


def install_part(
    writer: EpochWriter,
    manifest: JobManifest,
    decision: JobDecision,
    name: str,
    config: AbsConfig,
) -> SnapshotInfo:
    """Install stage ``name``'s part of ``decision`` with ``writer``; idempotent.

    Raises:
        ManifestError: The stage has another epoch with the decision's restore epoch.
        SnapshotNotFoundError: The stage's epoch of the job snapshot is no snapshot.
        CommitError: A table could not be installed; repeating finishes it.
    """
    epoch, restore_epoch = decision.stage_epochs[name], decision.restore_epoch
    if decision.kind is JobRecord.RESTORE:
        assert decision.source_stages
        return restore_stage(
            decision.source_stages[name],
            epoch,
            writer,
            restore_epoch,
            job=manifest.root,
            config=config,
        )
    # epochs that can never be committed are replaced: the decision takes every reader back
    stuck = unfinishable(writer)
    if stuck is None:
        writer.recover()
    done = writer.epochs.latest(restore_epoch)
    if done is not None:
        if _is_part(done, manifest, decision, name):
            if stuck is not None:
                recover(writer)  # the part itself is stuck: this raises what to do
            return SnapshotInfo.from_entry(done)
        raise ManifestError(
            f"job {manifest.job!r}, stage {name!r}: the stage has an epoch {restore_epoch} "
            f"({done.status}, {done.origin or 'a micro-batch'}) of its own, which was to be "
            f"the restore epoch of the job's {decision.kind.value.lower()}; start the job "
            f"(Job.start or Job.run), which decides it again"
        )
    target = snapshot_of(writer.epochs, epoch, writer.root)
    what = f"install job snapshot {decision.epoch} of job {manifest.job!r} in stage {name!r}"
    require_rewindable(target, writer.root, what)
    moved = replace(target, source_offsets=realigned(target.source_offsets, restore_epoch + 1))
    state = decision.states.get(name)
    return install_snapshot(
        writer,
        moved,
        restore_epoch,
        config,
        state=StateInstall.from_json(state) if state is not None else None,
        job=manifest.root,
        origin=f"{decision.kind.value.lower()} of job {manifest.job!r} to job snapshot "
        f"{decision.epoch}",
        refuse_lost_changes=False,
        replacing=stuck,
    )


def settle_stage(writer: EpochWriter, config: AbsConfig) -> JobManifest | None:
    """Before a stage runs: install its part of its job's unfinished decision, if any.

    ``writer`` holds the stage's lease. Returns the job's manifest, or None if the root is
    no job's stage.

    Raises:
        ManifestError: The stage ran past the decision's restore epoch (only an older
            pyspark-abs allowed that); starting the job decides it again.
    """
    manifest = linked_job(writer.store, writer.root)
    if manifest is None:
        return None
    decision = manifest.unfinished
    name = manifest.stage_of(writer.root)
    if decision is None or name is None or name not in decision.stage_epochs:
        return manifest
    log.info(
        "stage %s of job %s: installing its part of the job's unfinished %s first",
        name,
        manifest.job,
        decision.kind.value.lower(),
    )
    install_part(writer, manifest, decision, name, config)
    return manifest
