"""Savepoints: rollback, restore into another root, and state written from a DataFrame.

Each of these installs a snapshot as a *restore epoch* R, through the same two-phase commit
as a micro-batch epoch:

1. the state to install is written as Parquet files into each state table's directory, and
   the back-edge records in flight in the snapshot into each back-edge log's;
2. PREPARED(R) records those files, the sink versions to go back to, and the source
   offsets the next run starts from: the decision;
3. each state table's and back-edge log's files are replaced by the installed ones (so a
   log holds exactly the records to replay), each sink is restored to
   its recorded Delta version (one transaction per table, idempotent by the application
   transaction (pipeline/table, R)), and RESTORED(R) records the new versions.

A crash anywhere leaves either no decision (nothing changed; the orphan files are vacuumed)
or a PREPARED restore epoch that the next start, rollback or restore finishes. The pipeline
then starts a fresh checkpoint whose micro-batch 0 is epoch R + 1: it feeds the installed
state to the operator in that micro-batch (with any partition or key-group count), and a
:class:`~pyspark_abs.sources.DeltaSource` resumes at R's source offsets.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa

from pyspark_abs.admin.installing import (
    install_state,
    install_tables,
    installed_table,
    next_epoch,
    open_writer,
    require_one_row_per_key,
    shown,
    snapshot_of,
    write_rows,
)
from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import (
    AbsError,
    ManifestError,
    PipelineMismatchError,
    SchemaMismatchError,
    SnapshotDamagedError,
    SnapshotRootError,
)
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.manifest.info import SnapshotInfo
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.manifest.table import manifest_owner
from pyspark_abs.operators.keygroups import key_group_column
from pyspark_abs.operators.schema import KEY_GROUP, RESERVED_COLUMNS, TIMEOUT
from pyspark_abs.protocol.epoch_writer import EpochWriter
from pyspark_abs.sources.channel_plan import realigned
from pyspark_abs.sources.rewind import require_no_channels, require_rewindable
from pyspark_abs.storage.files import FileEntry
from pyspark_abs.storage.root import (
    SINK_PREFIX,
    STATE_PREFIX,
    SnapshotRoot,
)
from pyspark_abs.storage.schemas import arrow_schema
from pyspark_abs.storage.store import DeltaStore, TableSpec, normalize_uri

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pyspark_abs.operators.contract import Operator


def rollback(root: str, epoch: int | str, *, config: AbsConfig | None = None) -> SnapshotInfo:
    """Roll a stopped pipeline back to a committed epoch or a named savepoint.

    State returns to what it was after ``epoch``, every sink table to its Delta version as
    of ``epoch``, and the manifest records a RESTORED epoch. The next start of the pipeline
    (with its usual checkpoint location, which is moved aside as superseded) reprocesses
    from the source offsets of ``epoch``. Epochs after ``epoch`` stay readable in the
    manifest and by Delta time travel until retention expires them.

    Args:
        root: The snapshot root.
        epoch: A COMMITTED or RESTORED epoch of the root, or the name of a savepoint
            (see :func:`~pyspark_abs.tag`).
        config: File size and injected faults (default: ``AbsConfig()``).

    Returns:
        The RESTORED epoch.

    Raises:
        SnapshotNotFoundError: The root or epoch does not exist or is not a snapshot (for
            example MERGED into a later snapshot by a snapshot interval).
        SourceError: ``epoch`` was read from a source that cannot be rewound (nothing is
            changed).
        CommitError: A table could not be restored (e.g. its files were vacuumed); the
            rollback is finished by the next start or rollback once that is fixed.
    """
    root = normalize_uri(root)
    config = config if config is not None else AbsConfig()
    store = DeltaStore()
    writer = open_writer(store, root, None, config)
    writer.recover()
    target = snapshot_of(writer.epochs, epoch, root)
    require_rewindable(target, root, f"roll back to {shown(epoch)}")
    require_no_channels(target, root, f"roll back to {shown(epoch)}")
    restore_epoch = next_epoch(writer.epochs)
    try:
        return _roll_back(store, writer, target, restore_epoch, config)
    except AbsError as err:
        # name the epoch the user asked for; the restore epoch is an internal number
        raise type(err)(
            f"rollback of {root} to {shown(epoch)} (restore epoch {restore_epoch}): {err}"
        ) from None


def rollback_stage(
    root: str, epoch: int, restore_epoch: int, *, config: AbsConfig | None = None
) -> SnapshotInfo:
    """Roll one stage of a job back to ``epoch`` as restore epoch ``restore_epoch``.

    Every stage of a job rollback gets the same restore epoch, and a stage's channels
    resume at upstream epoch ``restore_epoch + 1``, so the stages keep one epoch
    numbering. Repeating it is safe: a restore epoch left PREPARED is finished, and a
    RESTORED one is returned as it is.

    Raises:
        SnapshotNotFoundError: ``epoch`` is not a snapshot of the stage.
        ManifestError: The stage already has another epoch ``restore_epoch``.
        CommitError: A table could not be restored; repeating the rollback finishes it.
    """
    root = normalize_uri(root)
    config = config if config is not None else AbsConfig()
    store = DeltaStore()
    writer = open_writer(store, root, None, config)
    writer.recover()
    done = writer.epochs.latest(restore_epoch)
    if done is not None:
        if done.is_restore and done.restored_from == epoch:
            return SnapshotInfo.from_entry(done)
        raise ManifestError(
            f"job rollback of {root} to epoch {epoch}: the stage already has an epoch "
            f"{restore_epoch} ({done.status}, {done.origin or 'a micro-batch'}), which was to "
            f"be the job's restore epoch. Run validate on the root"
        )
    target = snapshot_of(writer.epochs, epoch, root)
    require_rewindable(target, root, f"roll back to epoch {epoch}")
    moved = replace(target, source_offsets=realigned(target.source_offsets, restore_epoch + 1))
    return _roll_back(store, writer, moved, restore_epoch, config)


def _roll_back(
    store: DeltaStore,
    writer: EpochWriter,
    target: ManifestEntry,
    restore_epoch: int,
    config: AbsConfig,
) -> SnapshotInfo:
    """Record and commit ``restore_epoch``, which installs ``target`` in the root again."""
    files: list[FileEntry] = []
    rows: dict[str, int] = {}
    schemas: dict[str, pa.Schema] = {}
    for table, uri in target.tables.items():
        installed = installed_table(store, table, uri, target)
        if installed is not None:
            # a state table takes its schema as of the target back (a migration since)
            schema = installed.schema if table.startswith(STATE_PREFIX) else None
            files += write_rows(store, table, uri, installed, restore_epoch, config, schema)
            rows[table] = installed.num_rows
            if schema is not None:
                schemas[table] = schema
    restore_versions = {t: v for t, v in target.table_versions.items() if t not in rows}
    tables = dict(target.tables)
    for table, (uri, version) in _sinks_written_later(writer.epochs, target).items():
        tables[table] = uri
        restore_versions[table] = version
    return install_tables(
        writer,
        target,
        restore_epoch,
        tables=tables,
        files=files,
        rows=rows,
        restore_versions=restore_versions,
        origin=f"rollback to epoch {target.epoch}",
        schemas=schemas,
    )


def _sinks_written_later(epochs: EpochLog, target: ManifestEntry) -> dict[str, tuple[str, int]]:
    """Sinks the root wrote that ``target`` has no version of, with a version to go back to.

    That is the version before the root's first write to the sink.

    ``target`` predates them: it is a restored copy's first epoch, a ``write_state`` on a
    new root, or a rollback to one of those.

    Raises:
        SnapshotDamagedError: The root's first write to such a sink created the table, so
            no version of it holds the sink as of ``target``.
    """
    first: dict[str, tuple[str, int]] = {}
    for entry in epochs.entries:
        for table, version in entry.table_versions.items():
            later = table.startswith(SINK_PREFIX) and table not in target.table_versions
            if later and (table not in first or version < first[table][1]):
                first[table] = (entry.tables[table], version)
    for table, (uri, version) in first.items():
        if version < 1:
            raise SnapshotDamagedError(
                f"epoch {target.epoch} predates every write to sink {table} at {uri}, but "
                f"version 0 of that table already holds rows of this root, so no version "
                f"holds the sink as of epoch {target.epoch}; roll back to a later epoch"
            )
    return {table: (uri, version - 1) for table, (uri, version) in first.items()}


def restore(
    root: str,
    epoch: int | str,
    into: str,
    *,
    pipeline: str | None = None,
    config: AbsConfig | None = None,
) -> SnapshotInfo:
    """Copy the snapshot of ``epoch`` into a new snapshot root, as its first epoch.

    A pipeline started on ``into`` (with a new checkpoint location, any partition count and
    any key-group count) continues from that snapshot: its operator starts with the
    snapshot's state (timeouts included), and a DeltaSource resumes at the snapshot's
    source offsets. Give it its own sink tables.

    Args:
        root: The snapshot root to copy from.
        epoch: A COMMITTED or RESTORED epoch of ``root``, or the name of a savepoint.
        into: A new snapshot root (it must hold no epochs).
        pipeline: The pipeline ``into`` belongs to (default: the pipeline of ``root``).
        config: File size and injected faults (default: ``AbsConfig()``).

    Returns:
        The RESTORED epoch of ``into``, which has the number of the epoch copied.

    Raises:
        SnapshotNotFoundError: The root or epoch does not exist or is not a snapshot (for
            example MERGED into a later snapshot by a snapshot interval).
        SourceError: ``epoch`` was read from a source that cannot be rewound.
        SnapshotRootError: ``into`` already holds epochs, or is ``root`` itself. Running
            the same restore again after it was interrupted finishes it instead.
    """
    root, into = normalize_uri(root), normalize_uri(into)
    config = config if config is not None else AbsConfig()
    source = open_writer(DeltaStore(), root, None, config)
    target = snapshot_of(source.epochs, epoch, root)
    require_no_channels(target, root, f"restore {shown(epoch)} into {into}")
    return _restore(source, target, epoch, into, pipeline, config, target.epoch)


def restore_stage(
    root: str, epoch: int, into: str, restore_epoch: int, *, config: AbsConfig | None = None
) -> SnapshotInfo:
    """Copy one stage of a job into a new root as restore epoch ``restore_epoch``.

    Every stage of a job restore gets the same restore epoch, and a stage's channels
    resume at upstream epoch ``restore_epoch + 1``, so the new job's stages keep one
    epoch numbering. Repeating it after an interruption finishes it.

    Raises:
        SnapshotNotFoundError: ``epoch`` is not a snapshot of the stage.
        SnapshotRootError: ``into`` already holds other epochs.
    """
    root, into = normalize_uri(root), normalize_uri(into)
    config = config if config is not None else AbsConfig()
    source = open_writer(DeltaStore(), root, None, config)
    target = snapshot_of(source.epochs, epoch, root)
    moved = replace(target, source_offsets=realigned(target.source_offsets, restore_epoch + 1))
    return _restore(source, moved, epoch, into, None, config, restore_epoch)


def _restore(
    source: EpochWriter,
    target: ManifestEntry,
    epoch: int | str,
    into: str,
    pipeline: str | None,
    config: AbsConfig,
    restore_epoch: int,
) -> SnapshotInfo:
    """Install ``target`` of ``source``'s root in the new root ``into`` as ``restore_epoch``."""
    root, store = source.root, source.store
    require_rewindable(target, root, f"restore {shown(epoch)} into {into}")
    if into == root:
        raise SnapshotRootError(
            f"restore copies a snapshot into another root; to go back to {shown(epoch)} in "
            f"{root} itself, use rollback({root!r}, {epoch!r})"
        )
    name = pipeline or source.pipeline
    origin = f"restored from {root} epoch {target.epoch}"
    writer = open_writer(store, into, name, config)
    writer.recover()
    if writer.epochs.entries:
        done = writer.epochs.latest(restore_epoch)
        if len(writer.epochs.snapshots()) == 1 and done is not None and done.origin == origin:
            return SnapshotInfo.from_entry(done)  # an interrupted restore, now finished
        raise SnapshotRootError(
            f"{into} already holds epochs of pipeline {name!r}; restore into a new root"
        )
    tables: dict[str, str] = {}
    files: list[FileEntry] = []
    rows: dict[str, int] = {}
    for table, uri in target.tables.items():
        installed = installed_table(store, table, uri, target)
        if installed is None:
            continue
        new_uri = f"{into}/{table}"
        schema = installed.schema if table.startswith(STATE_PREFIX) else None
        store.ensure_table(
            TableSpec(
                table,
                new_uri,
                schema if schema is not None else arrow_schema(store.open(uri)),
                (),
                store.description(uri),
            )
        )
        files += write_rows(store, table, new_uri, installed, restore_epoch, config)
        tables[table] = new_uri
        rows[table] = installed.num_rows
    return install_tables(
        writer,
        target,
        restore_epoch,
        tables=tables,
        files=files,
        rows=rows,
        restore_versions={},
        origin=origin,
    )


def write_state(
    state: DataFrame,
    root: str,
    operator: Operator,
    *,
    pipeline: str | None = None,
    config: AbsConfig | None = None,
    clear_timeouts: bool = False,
) -> SnapshotInfo:
    """Write a DataFrame as an operator's state: a new snapshot a pipeline can start from.

    ``state`` holds the operator's key columns and declared state columns, and ``_timeout``
    (epoch milliseconds, null for none) when the operator has a timeout mode. On a root with
    snapshots, the new snapshot replaces the operator's state and keeps the sinks and source
    offsets of the newest snapshot: read the state with
    ``Snapshots.state(operator, with_metadata=True)`` (which has ``_timeout``), fix it with
    DataFrame code, write it back. On a new root, it bootstraps a pipeline with initial state.
    The state table takes ``operator``'s state schema, whatever it held before (earlier
    snapshots keep theirs); to migrate state by rules instead, declare
    :class:`~pyspark_abs.StateEvolution` on the operator.

    Args:
        state: One row per key.
        root: The snapshot root.
        operator: The operator the state is for (its key and state schema are used).
        pipeline: The pipeline; needed for a new root.
        config: For the key-group count recorded with the rows (default: Spark conf).
        clear_timeouts: Write an operator with a timeout mode without ``_timeout``: every
            key's timer is dropped.

    Returns:
        The RESTORED epoch that holds the state.

    Raises:
        SchemaMismatchError: Columns are missing or do not fit the declared schema.
        OperatorDefinitionError: ``state`` has a key more than once.
        SourceError: The newest snapshot was read from a source that cannot be rewound.
        TableSchemaError: The root's state table is keyed by other columns.
        PipelineMismatchError: ``pipeline`` differs from the root's pipeline.
    """
    from pyspark.sql import functions as F

    from pyspark_abs.operators.contract import TimeoutMode
    from pyspark_abs.operators.plan import resolve_plan

    root = normalize_uri(root)
    store = DeltaStore()
    owner = manifest_owner(store, root) if store.exists(SnapshotRoot(root).manifest_uri) else None
    if owner is not None and pipeline is not None and pipeline != owner:
        raise PipelineMismatchError(
            f"snapshot root {root} belongs to pipeline {owner!r}, not {pipeline!r}"
        )
    name = owner or pipeline
    if name is None:
        raise PipelineMismatchError(
            f"{root} is a new snapshot root: pass pipeline= to name the pipeline it belongs to"
        )
    # what Snapshots.state(..., with_metadata=True) adds is recomputed here, or kept (_timeout)
    plan = resolve_plan(name, state.drop(*RESERVED_COLUMNS), operator, snapshots=True)
    expected = [*plan.key_columns, *plan.state_schema.names]
    missing = [c for c in expected if c not in state.columns]
    if missing:
        raise SchemaMismatchError(
            f"state for operator {operator.name!r} lacks column(s) {missing}; it needs "
            f"{expected} and optionally {TIMEOUT!r}"
        )
    if clear_timeouts:
        state = state.drop(TIMEOUT)
    elif operator.timeout is not TimeoutMode.NONE and TIMEOUT not in state.columns:
        raise SchemaMismatchError(
            f"state for operator {operator.name!r} has no {TIMEOUT!r} column, but the "
            f"operator has {operator.timeout.value} timeouts: written like this, no key "
            f"would ever time out. Read the state with Snapshots.state({operator.name!r}, "
            f"with_metadata=True) to keep the timers, or pass clear_timeouts=True"
        )
    config = config if config is not None else AbsConfig.from_spark_conf(state.sparkSession)
    timeout = F.col(TIMEOUT) if TIMEOUT in state.columns else F.lit(None)
    selected = state.select(
        *expected,
        key_group_column(plan.key_columns, config.key_groups).alias(KEY_GROUP),
        timeout.cast("long").alias(TIMEOUT),
    )
    rows = selected.toArrow()
    require_one_row_per_key(rows, plan.key_columns, f"state for operator {operator.name!r}")
    writer = open_writer(store, root, name, config)
    writer.recover()
    return install_state(
        writer,
        plan,
        rows,
        action=f"write state for operator {operator.name!r}",
        origin=f"state of operator {operator.name!r} written by write_state",
        config=config,
    )
