"""Migrating an operator's stored state to its declared schema, as a restore epoch.

When a pipeline starts (or is checked) against a root whose state table was written by an
earlier version of its operator, :func:`compare_stored_state` compares the stored columns
with the declared ones under the operator's :class:`~pyspark_abs.StateEvolution`.
:func:`migrate_state` then installs the migrated live state of the newest snapshot as a
restore epoch, through the same two-phase commit as a rollback: the state table takes the
declared schema in that epoch's commit (earlier versions keep theirs, so earlier snapshots
stay readable), and the run starts a fresh checkpoint from that epoch. A crash before the
decision leaves nothing changed; after it, recovery finishes the epoch. Once migrated, the
stored and declared schemas agree and later starts do nothing.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import SchemaMismatchError, StateEvolutionError
from pyspark_abs.install.installing import install_state, installed_table, require_one_row_per_key
from pyspark_abs.logs import logger
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.manifest.info import SnapshotInfo
from pyspark_abs.operators.arrow_types import same_type
from pyspark_abs.operators.changelog import latest_per_key
from pyspark_abs.operators.contract import TimeoutMode
from pyspark_abs.operators.evolution import (
    StateComparison,
    StateEvolution,
    compare_state,
    evolve_rows,
)
from pyspark_abs.operators.partitioning import key_group_column
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.schema import (
    DELETED,
    EPOCH,
    KEY_GROUP,
    RESERVED_COLUMNS,
    TIMEOUT,
)
from pyspark_abs.protocol.epoch_writer import EpochWriter
from pyspark_abs.storage.root import SnapshotRoot, state_table
from pyspark_abs.storage.schemas import arrow_schema
from pyspark_abs.storage.store import DeltaStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logger(__name__)


@dataclass(frozen=True)
class StoredState:
    """An operator's state table as it is stored, against the operator's declaration.

    Attributes:
        table: The stored state table's id: the operator's, or its earlier name's.
        uri: Its location.
        schema: Its current schema.
        keys: Its key columns.
        comparison: Its key and state columns against the declared ones.
    """

    table: str
    uri: str
    schema: pa.Schema
    keys: tuple[str, ...]
    comparison: StateComparison

    def needs_migration(self, operator: str) -> bool:
        """Whether a start migrates this state (or refuses to)."""
        return self.comparison.differs or self.table != state_table(operator)


def compare_stored_state(
    store: DeltaStore, root: SnapshotRoot, plan: OperatorPlan, evolution: StateEvolution | None
) -> StoredState | None:
    """The operator's stored state against its declaration; None if it has no state table.

    The stored state is the operator's own state table, or else the state table of its
    earlier name (``evolution.renamed_from``).
    """
    table = state_table(plan.name)
    uri = root.table_uri(table)
    if not store.exists(uri) and evolution is not None and evolution.renamed_from:
        table = state_table(evolution.renamed_from)
        uri = root.table_uri(table)
    if not store.exists(uri):
        return None
    schema = arrow_schema(store.open(uri))
    keys: list[str] = json.loads(store.description(uri) or "{}").get("key", [])
    stored_key = pa.schema([schema.field(k) for k in keys if k in schema.names])
    stored_state = pa.schema(
        [f for f in schema if f.name not in keys and f.name not in RESERVED_COLUMNS]
    )
    comparison = compare_state(
        stored_key, stored_state, plan.key_schema, plan.state_schema, evolution
    )
    return StoredState(table, uri, schema, tuple(keys), comparison)


@dataclass(frozen=True)
class Migration:
    """What a start does with an operator's stored state (see :func:`plan_migration`).

    Attributes:
        stored: The stored state against the declaration.
        operator: The operator's id.
        clockless: Live keys that get a TTL expiry (the TTL was declared since).
    """

    stored: StoredState
    operator: str
    clockless: int

    @property
    def moved(self) -> bool:
        """Whether the state moves from the table of the operator's earlier name."""
        return self.stored.table != state_table(self.operator)

    @property
    def rewrites(self) -> bool:
        """Whether the state is rewritten by the evolution rules (or refused)."""
        return self.stored.needs_migration(self.operator)

    @property
    def needed(self) -> bool:
        """Whether a start installs a migration epoch."""
        return self.rewrites or bool(self.clockless)


def plan_migration(
    store: DeltaStore,
    root: SnapshotRoot,
    plan: OperatorPlan,
    evolution: StateEvolution | None,
    latest: ManifestEntry | None,
) -> Migration | None:
    """What a start on ``root`` does with the operator's stored state; None without any."""
    stored = compare_stored_state(store, root, plan, evolution)
    if stored is None:
        return None
    clockless = without_expiry(store, plan, stored, latest) if stored.comparison.compatible else 0
    return Migration(stored, plan.name, clockless)


def migrate_state(
    writer: EpochWriter,
    plan: OperatorPlan,
    evolution: StateEvolution | None,
    spark: SparkSession,
    config: AbsConfig,
) -> SnapshotInfo | None:
    """Migrate the operator's stored state to its declared schema, if they differ.

    Returns the RESTORED epoch holding the migrated state, or None when nothing differs.

    Raises:
        StateEvolutionError: The difference is not one the declared evolution allows;
            every column difference is listed with the option that would allow it.
            Nothing is changed.
        SchemaMismatchError: A migration function failed or returned the wrong columns.
        SourceError: The newest snapshot was read from a source that cannot be rewound.
    """
    snapshots = writer.epochs.snapshots()
    latest = snapshots[-1] if snapshots else None
    migrated = migrated_state(writer.store, writer.root, plan, evolution, spark, config, latest)
    if migrated is None:
        return None
    rows, origin = migrated
    info = install_state(
        writer,
        plan,
        rows,
        action=f"migrate the state of operator {plan.name!r}",
        origin=origin,
        config=config,
    )
    log.info(
        "operator %s: %d keys of state migrated in restore epoch %d (%s)",
        plan.name,
        rows.num_rows,
        info.epoch,
        origin,
    )
    return info


def migrated_state(
    store: DeltaStore,
    root: SnapshotRoot,
    plan: OperatorPlan,
    evolution: StateEvolution | None,
    spark: SparkSession,
    config: AbsConfig,
    target: ManifestEntry | None,
) -> tuple[pa.Table, str] | None:
    """The operator's state as of ``target``, migrated to its declared schema.

    Returns the rows (key and state columns, ``_key_group`` and ``_timeout``) and what the
    migration did, for the manifest; None when nothing differs.

    Raises:
        StateEvolutionError: The difference is not one the declared evolution allows.
        SchemaMismatchError: A migration function failed or returned the wrong columns.
    """
    migration = plan_migration(store, root, plan, evolution, target)
    if migration is None:
        return None
    stored, rewrites, clockless = migration.stored, migration.rewrites, migration.clockless
    if rewrites and not stored.comparison.compatible:
        raise StateEvolutionError(
            f"operator {plan.name!r}: the state stored at {stored.uri} has another schema "
            f"than the operator declares, and the declared evolution does not cover every "
            f"difference; nothing was run or changed. Differences:\n"
            f"{stored.comparison.summary()}"
        )
    if not migration.needed:
        return None
    rows = live_state(store, stored, target)
    evolution = evolution or StateEvolution()
    what = f"migrated state of operator {plan.name!r}"
    if not rewrites:
        migrated = rows
    elif evolution.migrate is not None:
        migrated = _migrated(rows, plan, evolution, spark, config, what)
    else:
        migrated = evolve_rows(
            rows, plan.key_columns, stored.comparison, plan.state_schema, evolution, plan.name
        )
    require_one_row_per_key(migrated, plan.key_columns, what)
    if clockless:
        migrated = _start_ttl_clocks(plan, migrated, target)
    changes = "; ".join(
        [f"moved from {stored.table}"] * migration.moved
        + [str(c) for c in stored.comparison.migrations] * rewrites
        + [f"ttl clocks started for {clockless} key(s)"] * bool(clockless)
    )
    selected = migrated.select([*plan.key_columns, *plan.state_schema.names, KEY_GROUP, TIMEOUT])
    return selected, f"state of operator {plan.name!r} migrated: {changes}"


def live_state(store: DeltaStore, stored: StoredState, latest: ManifestEntry | None) -> pa.Table:
    """The stored live state as of the newest snapshot (empty without one)."""
    if latest is not None and stored.table in latest.tables:
        rows = installed_table(store, stored.table, stored.uri, latest)
        if rows is not None:
            return rows
    return stored.schema.empty_table()


def without_expiry(
    store: DeltaStore, plan: OperatorPlan, stored: StoredState, latest: ManifestEntry | None
) -> int:
    """Live keys of an operator with a TTL that have no expiry yet (it was declared since).

    Reads only the key and bookkeeping columns of the newest snapshot's state.
    """
    if plan.ttl_ms is None or latest is None or stored.table not in latest.table_versions:
        return 0
    columns = [*stored.keys, EPOCH, DELETED, TIMEOUT]
    changes = store.read(stored.uri, latest.table_versions[stored.table], columns)
    return int(latest_per_key(changes, stored.keys, latest.epoch)[TIMEOUT].null_count)


def _start_ttl_clocks(plan: OperatorPlan, rows: pa.Table, latest: ManifestEntry | None) -> pa.Table:
    """``rows`` with an expiry for each key without one: one TTL after the newest snapshot.

    That is the snapshot's watermark for an event-time TTL (0 included: the event-time
    clock never starts from the wall clock; a snapshot without one counts as 0), and the
    current time for a processing-time TTL.
    """
    assert plan.ttl_ms is not None
    if plan.timeout is TimeoutMode.EVENT_TIME:
        watermark = latest.watermark_ms if latest is not None else None
        base = watermark or 0
    else:
        base = int(time.time() * 1000)
    expiry: Any = pc.fill_null(rows[TIMEOUT], pa.scalar(base + plan.ttl_ms, pa.int64()))
    return rows.set_column(rows.schema.get_field_index(TIMEOUT), TIMEOUT, expiry)


def _migrated(
    rows: pa.Table,
    plan: OperatorPlan,
    evolution: StateEvolution,
    spark: SparkSession,
    config: AbsConfig,
    what: str,
) -> pa.Table:
    """The state ``evolution.migrate`` makes of ``rows``, with timeouts kept per key."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    keys = list(plan.key_columns)
    old_state = [n for n in rows.column_names if n not in keys and n not in RESERVED_COLUMNS]
    frame = spark.createDataFrame(rows.select([*keys, *old_state]))
    assert evolution.migrate is not None
    try:
        result = evolution.migrate(frame)
    except Exception as err:
        raise SchemaMismatchError(
            f"{what}: the migrate= function failed: {type(err).__name__}: {err}"
        ) from err
    if not isinstance(result, DataFrame):
        raise SchemaMismatchError(
            f"{what}: migrate= must return a Spark DataFrame, got {type(result).__name__}"
        )
    expected = [*keys, *plan.state_schema.names]
    missing = [c for c in expected if c not in result.columns]
    extra = [c for c in result.columns if c not in expected]
    if missing or extra:
        raise SchemaMismatchError(
            f"{what}: migrate= returned columns {result.columns}; it must return exactly the "
            f"key and declared state columns {expected} (missing {missing}, unexpected {extra})"
        )
    timers = spark.createDataFrame(rows.select([*keys, TIMEOUT])).select(
        *(F.col(k).alias(f"_abs_old_{k}") for k in keys), TIMEOUT
    )
    same_key = reduce(
        lambda a, b: a & b, (result[k].eqNullSafe(timers[f"_abs_old_{k}"]) for k in keys)
    )
    joined = result.join(timers, same_key, "left").select(
        *expected,
        key_group_column(plan.key_columns, config.key_groups).alias(KEY_GROUP),
        F.col(TIMEOUT).cast("long").alias(TIMEOUT),
    )
    migrated = joined.toArrow()
    declared = {f.name: f.type for f in plan.state_schema} | {
        f.name: f.type for f in plan.key_schema
    }
    wrong = [
        f"{f.name} is {f.type}, declared {declared[f.name]}"
        for f in migrated.schema
        if f.name in declared and not _fits(f.type, declared[f.name])
    ]
    if wrong:
        raise SchemaMismatchError(
            f"{what}: migrate= returned columns of other types: {'; '.join(wrong)}; cast them "
            f"to the declared types"
        )
    return migrated


def _fits(returned: pa.DataType, declared: pa.DataType) -> bool:
    """Whether a returned column holds the declared type (instants in any time zone)."""
    if pa.types.is_timestamp(returned) and pa.types.is_timestamp(declared):
        return bool((returned.tz is None) == (declared.tz is None))
    return same_type(returned, declared)
