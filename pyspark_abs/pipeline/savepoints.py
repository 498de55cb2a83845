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
or a PREPARED restore epoch that the next start, rollback or restore finishes (or, if files
it needs are gone for good, that a rollback replaces: see
:mod:`~pyspark_abs.install.stuck_epochs`). The pipeline
then starts a fresh checkpoint whose micro-batch 0 is epoch R + 1: it feeds the installed
state to the operator in that micro-batch (with any partition or key-group count), and a
:class:`~pyspark_abs.sources.DeltaSource` resumes at R's source offsets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import (
    AbsError,
    PipelineMismatchError,
    SchemaMismatchError,
    SnapshotRootError,
)
from pyspark_abs.install.copying import copy_snapshot
from pyspark_abs.install.installing import (
    install_snapshot,
    install_state,
    next_epoch,
    open_writer,
    require_one_row_per_key,
    shown,
    snapshot_of,
)
from pyspark_abs.install.stuck_epochs import recover, unfinishable
from pyspark_abs.job_actions.decisions import settle_stage
from pyspark_abs.job_actions.state import write_job_state
from pyspark_abs.job_ledger.links import linked_job
from pyspark_abs.manifest.info import SnapshotInfo
from pyspark_abs.manifest.table import manifest_owner
from pyspark_abs.operators.partitioning import key_group_column
from pyspark_abs.operators.schema import KEY_GROUP, RESERVED_COLUMNS, TIMEOUT, TIMERS
from pyspark_abs.sources.rewind import require_no_channels, require_rewindable
from pyspark_abs.storage.root import (
    SnapshotRoot,
)
from pyspark_abs.storage.store import DeltaStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pyspark_abs.operators.contract import Operator


def rollback(root: str, epoch: int | str, *, config: AbsConfig | None = None) -> SnapshotInfo:
    """Roll a stopped pipeline back to a committed epoch or a named savepoint.

    State returns to what it was after ``epoch``, every sink table to its Delta version as
    of ``epoch``, and the manifest records a RESTORED epoch. The next start of the pipeline
    (with its usual checkpoint location, which is moved aside as superseded) reprocesses
    from the source offsets of ``epoch``. Epochs after ``epoch`` stay readable in the
    manifest and by Delta time travel until retention expires them. Decided epochs that no
    start can commit, because files they need are gone, are replaced: they are recorded
    ABORTED together with the restore epoch (on a job's stage, only a job rollback replaces
    them: see :meth:`~pyspark_abs.job.declaration.Job.rollback`).

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
        ExternalChangeError: A sink cannot go back to its version of ``epoch``: another
            writer deleted rows since, or a VACUUM deleted files of that version (nothing is
            changed).
        CommitError: A table could not be restored; the rollback is finished by the next
            start or rollback once that is fixed.
    """
    root = SnapshotRoot(root)
    config = config if config is not None else AbsConfig()
    store = DeltaStore()
    writer = open_writer(store, root, None, config)
    # on a job's stage only a job rollback replaces them (it takes their readers back too)
    stuck = unfinishable(writer) if linked_job(store, root) is None else None
    if stuck is None:
        recover(writer)
    settle_stage(writer, config)  # a job's unfinished decision first: it reserved an epoch
    target = snapshot_of(writer.epochs, epoch, root)
    require_rewindable(target, root, f"roll back to {shown(epoch)}")
    require_no_channels(target, root, f"roll back to {shown(epoch)}")
    restore_epoch = next_epoch(writer.epochs)
    try:
        return install_snapshot(writer, target, restore_epoch, config, replacing=stuck)
    except AbsError as err:
        # name the epoch the user asked for; the restore epoch is an internal number
        raise type(err)(
            f"rollback of {root} to {shown(epoch)} (restore epoch {restore_epoch}): {err}"
        ) from None


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
    root, into = SnapshotRoot(root), SnapshotRoot(into)
    config = config if config is not None else AbsConfig()
    source = open_writer(DeltaStore(), root, None, config)
    target = snapshot_of(source.epochs, epoch, root)
    require_no_channels(target, root, f"restore {shown(epoch)} into {into}")
    require_rewindable(target, root, f"restore {shown(epoch)} into {into}")
    if into == root:
        raise SnapshotRootError(
            f"restore copies a snapshot into another root; to go back to {shown(epoch)} in "
            f"{root} itself, use rollback({root!r}, {epoch!r})"
        )
    writer = open_writer(DeltaStore(), into, pipeline or source.pipeline, config)
    return copy_snapshot(source, target, epoch, writer, config, target.epoch)


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

    On a stage of a :class:`~pyspark_abs.Job`, the state goes in through one job-wide
    decision: every stage goes back to the newest job snapshot as one restore epoch, and
    this stage gets the written state, so the stages stay aligned. The state must be
    derived from that snapshot: a stage with newer snapshots is refused (run the job until
    every stage has read everything first), as is a running job.

    Args:
        state: One row per key.
        root: The snapshot root.
        operator: The operator the state is for (its key and state schema are used).
        pipeline: The pipeline; needed for a new root.
        config: For the key-group count recorded with the rows (default: Spark conf).
        clear_timeouts: Write an operator with a timeout mode without ``_timeout``: every
            key's timer is dropped. With ``timers=True``, the timers are the ``_timers``
            column, and each key's ``_timeout`` is set to its earliest timer.

    Returns:
        The RESTORED epoch that holds the state.

    Raises:
        SchemaMismatchError: Columns are missing or do not fit the declared schema.
        OperatorDefinitionError: ``state`` has a key more than once.
        SourceError: The newest snapshot was read from a source that cannot be rewound.
        TableSchemaError: The root's state table is keyed by other columns.
        PipelineMismatchError: ``pipeline`` differs from the root's pipeline.
        ConfigError: A job stage has snapshots after the newest job snapshot.
        FencingError: The pipeline (or, for a job stage, any stage of its job) is running.
    """
    from pyspark.sql import functions as F

    from pyspark_abs.operators.contract import TimeoutMode
    from pyspark_abs.operators.plan import resolve_plan

    root = SnapshotRoot(root)
    store = DeltaStore()
    owner = manifest_owner(store, root) if store.exists(root.manifest_uri) else None
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
    if TIMERS in plan.state_schema.names:  # a key's timeout is its earliest timer
        timers = F.lit(None).cast("array<bigint>") if clear_timeouts else F.col(TIMERS)
        state = state.withColumn(TIMERS, timers).withColumn(TIMEOUT, F.array_min(TIMERS))
    elif clear_timeouts:
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
    origin = f"state of operator {operator.name!r} written by write_state"
    job = linked_job(store, root)
    if job is not None:
        return write_job_state(store, job, root, plan, rows, origin=origin, config=config)
    writer = open_writer(store, root, name, config)
    recover(writer)
    return install_state(
        writer,
        plan,
        rows,
        action=f"write state for operator {operator.name!r}",
        origin=origin,
        config=config,
    )
