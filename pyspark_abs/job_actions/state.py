"""State changes of job stages: a migration to a new state schema, and written state.

Both are job-wide decisions (:mod:`~pyspark_abs.job_actions.decisions`): every stage goes
back to the newest job snapshot as one restore epoch, so that the stages keep one epoch
numbering, and the changed stages get their new state in that epoch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import ConfigError
from pyspark_abs.install.installing import StateInstall, prepare_state, snapshot_of
from pyspark_abs.install.migration import migrated_state, plan_migration
from pyspark_abs.job_actions.decisions import decide
from pyspark_abs.job_ledger.cut import JobSnapshot
from pyspark_abs.job_ledger.listing import next_restore_epoch, require_newest, snapshots_of
from pyspark_abs.job_ledger.manifest import JobDecision, JobManifest, JobRecord
from pyspark_abs.logs import logger
from pyspark_abs.manifest.info import SnapshotInfo
from pyspark_abs.manifest.table import load_epoch_log
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from pyspark_abs.operators.evolution import StateEvolution
    from pyspark_abs.operators.plan import OperatorPlan

log = logger(__name__)


@dataclass(frozen=True)
class Redeployed:
    """A stage's definition as it starts now: what a job-wide migration needs of it.

    Attributes:
        root: The stage's snapshot root.
        plan: Its operator's plan.
        evolution: Its operator's state evolution.
        spark: The session a ``migrate=`` function runs in.
        config: Its configuration.
    """

    root: SnapshotRoot
    plan: OperatorPlan
    evolution: StateEvolution | None
    spark: SparkSession
    config: AbsConfig


def needs_migration(store: DeltaStore, stage: Redeployed) -> bool:
    """Whether starting ``stage`` would migrate its stored state (or refuse to)."""
    uri = stage.root.manifest_uri
    if not store.exists(uri):
        return False
    snapshots = load_epoch_log(store, uri).snapshots()
    latest = snapshots[-1] if snapshots else None
    migration = plan_migration(store, stage.root, stage.plan, stage.evolution, latest)
    return migration is not None and migration.needed


def migrate_job(
    store: DeltaStore,
    manifest: JobManifest,
    stages: Mapping[str, Redeployed],
    config: AbsConfig | None = None,
) -> JobDecision | None:
    """Migrate the state of the stages whose operators declare another state schema.

    One job-wide decision: every stage goes back to the newest job snapshot as one restore
    epoch, the migrating stages with their state as of that snapshot, migrated. Returns the
    decision, or None when no stage needs a migration.

    Raises:
        StateEvolutionError: A stage's declared evolution does not cover the difference;
            nothing was changed.
        SchemaMismatchError: A ``migrate=`` function failed; nothing was changed.
        FencingError: A stage is running.
    """
    needing = {n: s for n, s in stages.items() if needs_migration(store, s)}
    if not needing:
        return None

    def migrated(snapshot: JobSnapshot, restore_epoch: int) -> dict[str, StateInstall]:
        states = {}
        for name, stage in needing.items():
            epochs = load_epoch_log(store, stage.root.manifest_uri)
            target = snapshot_of(epochs, snapshot.stages[name], stage.root)
            rows = migrated_state(
                store, stage.root, stage.plan, stage.evolution, stage.spark, stage.config, target
            )
            if rows is not None:
                states[name] = prepare_state(
                    store,
                    stage.root,
                    stage.plan,
                    rows[0],
                    restore_epoch,
                    action=f"migrate the state of stage {name!r} of job {manifest.job!r}",
                    origin=rows[1],
                    config=stage.config,
                )
        return states

    configs = {n: s.config for n, s in stages.items()}
    decided = decide(
        store, manifest, JobRecord.MIGRATE, states=migrated, config=config, configs=configs
    )
    log.info(
        "job %s: state of stage(s) %s migrated; every stage continues from job snapshot %d "
        "at restore epoch %d",
        manifest.job,
        sorted(decided.states),
        decided.epoch,
        decided.restore_epoch,
    )
    return decided


def write_job_state(
    store: DeltaStore,
    manifest: JobManifest,
    root: SnapshotRoot,
    plan: OperatorPlan,
    rows: pa.Table,
    *,
    origin: str,
    config: AbsConfig,
) -> SnapshotInfo:
    """Install ``rows`` as the state of the job's stage at ``root``, job-wide.

    Every stage goes back to the newest job snapshot as one restore epoch; the stage at
    ``root`` gets ``rows`` as its state. The rows must come from that stage's state as of
    that snapshot: a stage with snapshots after it is refused.

    Raises:
        ConfigError: The stage has snapshots after the newest job snapshot.
        FencingError: A stage is running.
    """
    name = manifest.stage_of(root)
    assert name is not None
    action = f"write the state of stage {name!r} of job {manifest.job!r}"

    def written(snapshot: JobSnapshot, restore_epoch: int) -> dict[str, StateInstall]:
        require_newest(store, manifest, name, snapshot, action)
        return {
            name: prepare_state(
                store, root, plan, rows, restore_epoch, action=action, origin=origin, config=config
            )
        }

    decided = decide(store, manifest, JobRecord.WRITE_STATE, states=written, config=config)
    entry = load_epoch_log(store, root.manifest_uri).latest(decided.restore_epoch)
    assert entry is not None
    return SnapshotInfo.from_entry(entry)


def refuse_lone_migration(store: DeltaStore, manifest: JobManifest, stage: Redeployed) -> None:
    """Refuse to start one stage of a job on its own when its state needs a migration.

    Raises:
        ConfigError: The stage's operator declares another state schema than its stored
            state: only the whole job may migrate it.
    """
    if needs_migration(store, stage):
        raise ConfigError(
            f"stage {manifest.stage_of(stage.root)!r} of job {manifest.job!r} declares "
            f"another state schema than its stored state: a migration, which every stage of "
            f"the job takes together (one restore epoch for all keeps their channels "
            f"aligned). Nothing was changed. Start the job (Job.start or Job.run) to migrate "
            f"it; pyspark_abs.check(pipeline) shows what that start will do"
        )


def job_migration_plan(store: DeltaStore, manifest: JobManifest, root: SnapshotRoot) -> list[str]:
    """What starting the job does when the stage at ``root`` needs a migration, a line each."""
    name = manifest.stage_of(root)
    found = snapshots_of(manifest.stages)
    if not found:
        return [
            f"stage {name!r} of job {manifest.job!r}: the job has no job snapshot yet, so "
            f"the job's start refuses the migration; run it with the old definition until "
            f"every stage has committed an epoch"
        ]
    snapshot = found[-1]
    restore_epoch = next_restore_epoch(store, manifest.stages)
    lines = [
        f"stage {name!r} of job {manifest.job!r}: migrated by the job's start (Job.start or "
        f"Job.run; a start of the stage alone refuses): every stage goes back to job snapshot "
        f"{snapshot.epoch} and continues at epoch {restore_epoch + 1}"
    ]
    for stage, stage_root in manifest.stages.items():
        epochs = load_epoch_log(store, stage_root.manifest_uri).entries
        newest = max((e.epoch for e in epochs), default=-1)
        if newest > snapshot.epoch:
            lines.append(
                f"stage {stage!r} processes the input of its epochs {snapshot.epoch + 1}.."
                f"{newest} again"
            )
    return lines
