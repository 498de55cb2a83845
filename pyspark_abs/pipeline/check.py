"""The upgrade check: what starting a new pipeline definition on a snapshot root would do.

:func:`check` loads nothing but the tables' metadata and the manifest; it runs no epoch and
changes nothing. Each operator, sink and back-edge log of the definition gets a verdict:

- ``compatible``: the stored table fits the declaration as it is;
- ``needs migration``: the start migrates the operator's stored state once (the details
  list each column rule it applies);
- ``incompatible``: the start would refuse; the details say what differs and what would
  allow it;
- ``new``: nothing is stored yet; the start creates it empty;
- ``removed``: the newest snapshot holds it, the definition does not: the start leaves it
  in the earlier snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from pyspark_abs.errors import AbsError, ConfigError
from pyspark_abs.install.migration import plan_migration
from pyspark_abs.job_actions.state import job_migration_plan
from pyspark_abs.job_ledger.links import linked_job
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.manifest.table import manifest_owner, open_manifest
from pyspark_abs.operators.envelope import Kind
from pyspark_abs.pipeline.declaration import Pipeline
from pyspark_abs.pipeline.targets import table_targets
from pyspark_abs.sources.rewind import require_rewindable
from pyspark_abs.storage.root import (
    SINK_PREFIX,
    STATE_PREFIX,
    SnapshotRoot,
    state_table,
)
from pyspark_abs.storage.store import DeltaStore, TableSpec


class Verdict(str, Enum):
    """What a start would do with one operator, sink or back-edge log."""

    COMPATIBLE = "compatible"
    NEEDS_MIGRATION = "needs migration"
    INCOMPATIBLE = "incompatible"
    NEW = "new"
    REMOVED = "removed"


@dataclass(frozen=True)
class CheckItem:
    """The verdict on one operator, sink or back-edge log.

    Attributes:
        kind: ``operator``, ``sink`` or ``back-edge``.
        name: The operator's id, the sink's output name, or the back-edge's table id.
        verdict: What a start would do.
        details: What differs, one line each.
    """

    kind: str
    name: str
    verdict: Verdict
    details: tuple[str, ...] = ()


EXIT_COMPATIBLE = 0
EXIT_INCOMPATIBLE = 1
EXIT_MIGRATION = 3


@dataclass(frozen=True)
class UpgradeReport:
    """What starting a pipeline definition on a snapshot root would do.

    Attributes:
        root: The snapshot root.
        pipeline: The definition's pipeline name.
        items: One verdict per operator, sink and back-edge log.
    """

    root: SnapshotRoot
    pipeline: str
    items: tuple[CheckItem, ...]

    @property
    def exit_code(self) -> int:
        """1 if a start would refuse, 3 if it would migrate state, else 0."""
        verdicts = {item.verdict for item in self.items}
        if Verdict.INCOMPATIBLE in verdicts:
            return EXIT_INCOMPATIBLE
        if Verdict.NEEDS_MIGRATION in verdicts:
            return EXIT_MIGRATION
        return EXIT_COMPATIBLE


def check(pipeline: Pipeline, root: str | None = None) -> UpgradeReport:
    """Check a pipeline definition against a snapshot root without running or changing it.

    Args:
        pipeline: The new definition.
        root: The snapshot root (default: the pipeline's).

    Returns:
        A verdict per operator, sink and back-edge log; ``exit_code`` sums them up.

    Raises:
        ConfigError: ``pipeline`` is not a Pipeline.
        SnapshotNotFoundError: ``root`` holds no snapshot root.
    """
    if not isinstance(pipeline, Pipeline):
        raise ConfigError(f"check needs a pyspark_abs.Pipeline, got {type(pipeline).__name__}")
    root = SnapshotRoot(root or pipeline.root)
    store = DeltaStore()
    if not store.exists(root.manifest_uri):
        raise root.not_found()
    owner = manifest_owner(store, root)
    if owner != pipeline.name:
        item = CheckItem(
            "pipeline",
            pipeline.name,
            Verdict.INCOMPATIBLE,
            (f"the root belongs to pipeline {owner!r}; name the pipeline {owner!r}",),
        )
        return UpgradeReport(root, pipeline.name, (item,))
    snapshots = open_manifest(store, root, owner).snapshots()
    latest = snapshots[-1] if snapshots else None
    items = [_operator_item(store, root, pipeline, latest)]
    declared = {state_table(pipeline.plan.name)}
    evolution = pipeline.operator.evolution
    if evolution is not None and evolution.renamed_from:
        declared.add(state_table(evolution.renamed_from))
    targets = table_targets(
        root, pipeline.plan, pipeline.config.snapshots, pipeline.back_edges, pipeline.sinks
    )
    for target in targets:
        declared.add(target.table)
        if target.kind is Kind.STATE:
            continue
        spec = TableSpec(target.table, target.uri, target.table_schema, target.partition_by)
        kind, name = _kind_and_name(target.table)
        if not store.exists(target.uri):
            items.append(CheckItem(kind, name, Verdict.NEW, (f"created at {target.uri}",)))
            continue
        problems = store.schema_problems(spec)
        verdict = Verdict.INCOMPATIBLE if problems else Verdict.COMPATIBLE
        items.append(CheckItem(kind, name, verdict, tuple(problems)))
    for table in latest.tables if latest is not None else {}:
        if table not in declared:
            kind, name = _kind_and_name(table)
            detail = "in the newest snapshot, not in the definition; earlier snapshots keep it"
            items.append(CheckItem(kind, name, Verdict.REMOVED, (detail,)))
    return UpgradeReport(root, pipeline.name, tuple(items))


def _operator_item(
    store: DeltaStore, root: SnapshotRoot, pipeline: Pipeline, latest: ManifestEntry | None
) -> CheckItem:
    plan = pipeline.plan
    migration = plan_migration(store, root, plan, pipeline.operator.evolution, latest)
    if migration is None:
        return CheckItem("operator", plan.name, Verdict.NEW, ("no stored state; starts empty",))
    comparison = migration.stored.comparison
    if not comparison.compatible:
        lines = comparison.summary().splitlines()
        return CheckItem("operator", plan.name, Verdict.INCOMPATIBLE, tuple(lines))
    if not migration.needed:
        return CheckItem("operator", plan.name, Verdict.COMPATIBLE)
    lines = [f"state moves from {migration.stored.table}"] * migration.moved
    lines += [str(change) for change in comparison.migrations]
    clockless = migration.clockless
    lines += [f"ttl clocks start for {clockless} key(s) without one"] * bool(clockless)
    if latest is not None:
        try:
            require_rewindable(latest, root, f"migrate the state of operator {plan.name!r}")
        except AbsError as err:
            return CheckItem("operator", plan.name, Verdict.INCOMPATIBLE, (*lines, str(err)))
    job = linked_job(store, root)
    if job is not None:
        lines += job_migration_plan(store, job, root)
    return CheckItem("operator", plan.name, Verdict.NEEDS_MIGRATION, tuple(lines))


def _kind_and_name(table: str) -> tuple[str, str]:
    """How the report names a table: its kind and the name the definition uses."""
    for prefix, kind in ((STATE_PREFIX, "operator"), (SINK_PREFIX, "sink")):
        if table.startswith(prefix):
            return kind, table[len(prefix) :]
    return "back-edge", table
