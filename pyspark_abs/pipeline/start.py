"""Starting a pipeline: the named steps from the root's lease to the running query.

:func:`start` runs them in order; each step is a function of its own, so the sequence reads
as the list below and a step can be read, tested and changed alone:

1. :func:`open_root`: the root exists; its layout, checkpoint, fault injector, lease and
   epoch writer for this run.
2. :func:`settle_root`: the manifest, a sound last snapshot, sinks of this root only;
   recovery of pending epochs, the stage's part of a job decision or a migration of the
   state; the lineage (fresh, restored or continued) and its key groups.
3. :func:`ready_tables`: the run's slots, every table the run commits to, the Kafka
   publishers and what they still owe.
4. :func:`run_plan`: the operator's plan for this run (watermark floors, time zone,
   replays, live state, slots).
5. :func:`start_stream`: the input (rewound, with loop heads and restore rows) and Spark's
   streaming query.

A step that fails releases what the steps before it took (the lease, the publishers, the
protocol run), so a failed start leaves the root as it found it, recovered at most.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from pyspark_abs.config import AbsConfig
from pyspark_abs.faults import FaultInjector
from pyspark_abs.install.migration import migrate_state
from pyspark_abs.install.stuck_epochs import recover
from pyspark_abs.job_actions.decisions import settle_stage
from pyspark_abs.job_actions.state import Redeployed, refuse_lone_migration
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.manifest.table import open_manifest
from pyspark_abs.operators.contract import Operator, TimeoutMode
from pyspark_abs.operators.partitioning import key_group_column
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.schema import KEY_GROUP
from pyspark_abs.pipeline.backedge import BackEdge, loop_head
from pyspark_abs.pipeline.connect import ConnectRun, is_connect, protocol_run, require_supported
from pyspark_abs.pipeline.launch import (
    live_state,
    require_same_key_groups,
    require_upstream_ready,
    run_slots,
    start_query,
)
from pyspark_abs.pipeline.sinks import DeltaSink, kafka_publishers
from pyspark_abs.pipeline.targets import table_specs, table_targets
from pyspark_abs.pipeline.wiring import rewound_frame, with_restore_rows, with_watermark_floors
from pyspark_abs.protocol.coordinator import EpochCoordinator
from pyspark_abs.protocol.epoch_writer import EpochWriter
from pyspark_abs.protocol.layout import SnapshotLayout
from pyspark_abs.protocol.lease import Lease
from pyspark_abs.protocol.lineage import Lineage, require_own_sinks, resolve_lineage
from pyspark_abs.protocol.listeners import SnapshotListener
from pyspark_abs.protocol.publishing import KafkaPublisher
from pyspark_abs.protocol.replay import decided_replays
from pyspark_abs.protocol.spark_checkpoint import CheckpointReader
from pyspark_abs.sources import RewindableSource
from pyspark_abs.sources.channel.source import ChannelSource
from pyspark_abs.storage.root import (
    BACKEDGE_PREFIX,
    SINK_PREFIX,
    STATE_PREFIX,
    SnapshotRoot,
)
from pyspark_abs.storage.store import DeltaStore
from pyspark_abs.upkeep.validation import require_sound_start

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery


class Declared(Protocol):
    """What a start reads of the declared pipeline (a :class:`~.declaration.Pipeline`)."""

    name: str
    spark: SparkSession
    source: DataFrame | RewindableSource
    transform: Callable[[DataFrame], DataFrame] | None
    frame: DataFrame
    operator: Operator
    plan: OperatorPlan
    config: AbsConfig
    root: SnapshotRoot
    checkpoint: str
    back_edges: tuple[BackEdge, ...]
    sinks: dict[str, DeltaSink]
    listeners: tuple[SnapshotListener, ...]

    def deployed(self) -> Redeployed:
        """This definition, as a job-wide migration of its state needs it."""


@dataclass(frozen=True)
class Trigger:
    """How the query runs: Spark's trigger, and where the run stops."""

    processing_time: str | None
    available_now: bool
    epoch_limit: int | None


@dataclass
class Opened:
    """What :func:`open_root` took for this run."""

    store: DeltaStore
    layout: SnapshotLayout
    checkpoint: CheckpointReader
    faults: FaultInjector
    run_id: str
    lease: Lease
    writer: EpochWriter


@dataclass
class Settled:
    """What :func:`settle_root` found: the epochs recovery committed, and the lineage."""

    recovered: list[int]
    lineage: Lineage


@dataclass
class Started:
    """A running start: Spark's query, the protocol run behind it, and what recovery did."""

    query: StreamingQuery
    run: EpochCoordinator | ConnectRun
    recovered: list[int]
    stop_when_idle: bool


def start(declared: Declared, trigger: Trigger) -> Started:
    """Run the steps of a start in order; see the module's docstring."""
    remote = is_connect(declared.spark)
    stop_when_idle = declared.plan.timeout is TimeoutMode.PROCESSING_TIME and (
        trigger.available_now or not trigger.processing_time
    )
    if remote:
        require_supported(declared.name, declared.config, stop_when_idle)
    opened = open_root(declared)
    publishers: list[KafkaPublisher] = []
    try:
        settled = settle_root(declared, opened)
        slots = run_slots(
            declared.name,
            opened.checkpoint,
            opened.writer.epochs,
            settled.lineage,
            declared.config,
            remote=remote,
            spark=declared.spark,
        )
        publishers = ready_tables(declared, opened, remote)
        opened.checkpoint.clear_unfinished_first_batch()
    except BaseException:
        for publisher in publishers:
            publisher.close()
        opened.writer.close()
        raise
    run, batch_function = protocol_run(
        opened.layout,
        declared.config,
        opened.writer,
        opened.checkpoint,
        opened.lease.record,
        remote=remote,
        epoch_base=settled.lineage.epoch_base,
        epoch_limit=trigger.epoch_limit,
        listeners=declared.listeners,
        publishers=publishers,
        slots=slots,
    )
    try:
        plan = run_plan(declared, opened, settled.lineage, slots, remote)
        query = start_stream(declared, plan, batch_function, settled.lineage, trigger)
    except BaseException:
        run.close()
        raise
    return Started(query, run, settled.recovered, trigger.available_now and stop_when_idle)


def open_root(declared: Declared) -> Opened:
    """Step 1: the root, its layout and checkpoint, and this run's lease and epoch writer."""
    store = DeltaStore()
    store.ensure_root(declared.root)
    layout = SnapshotLayout(
        declared.name,
        declared.root,
        declared.plan.name,
        table_targets(
            declared.root,
            declared.plan,
            declared.config.snapshots,
            declared.back_edges,
            declared.sinks,
        ),
    )
    checkpoint = CheckpointReader.for_session(declared.spark, declared.checkpoint)
    faults = FaultInjector(declared.config.faults)
    run_id = uuid.uuid4().hex
    lease = Lease.acquire(declared.root, declared.name, run_id)
    writer = EpochWriter(declared.name, declared.root, store, EpochLog(), run_id, faults, lease)
    return Opened(store, layout, checkpoint, faults, run_id, lease, writer)


def settle_root(declared: Declared, opened: Opened) -> Settled:
    """Step 2: the manifest read and checked, pending epochs decided, the lineage resolved."""
    writer, store = opened.writer, opened.store
    writer.epochs = open_manifest(store, declared.root, declared.name)
    snapshots = declared.config.snapshots
    if snapshots:
        require_sound_start(declared.root, writer.epochs)
    decided = writer.epochs.latest_decided()
    require_own_sinks(
        store,
        declared.name,
        declared.root,
        writer.root_id,
        {t.table: t.uri for t in opened.layout.targets if t.table.startswith(SINK_PREFIX)},
        None if decided is None else decided.epoch,
    )
    if not snapshots:
        return Settled([], Lineage())
    recovered = recover(writer)
    job = settle_stage(writer, declared.config)
    if job is None:
        migrate_state(
            writer, declared.plan, declared.operator.evolution, declared.spark, declared.config
        )
    else:
        refuse_lone_migration(store, job, declared.deployed())
    lineage = resolve_lineage(writer.epochs, opened.checkpoint, declared.root)
    if lineage.fresh:
        require_upstream_ready(declared.name, declared.source, lineage)
    require_same_key_groups(declared.name, declared.checkpoint, lineage, declared.config.key_groups)
    return Settled(recovered, lineage)


def ready_tables(declared: Declared, opened: Opened, remote: bool) -> list[KafkaPublisher]:
    """Step 3: every table the run commits to exists; the Kafka publishers, caught up."""
    for spec in table_specs(opened.layout, declared.plan):
        opened.store.ensure_table(spec)
        if spec.table.startswith((STATE_PREFIX, BACKEDGE_PREFIX)):
            opened.store.keep_log(spec.uri)  # tables of older roots; the lease is held
    publishers = kafka_publishers(
        declared.name,
        declared.sinks,
        declared.plan,
        opened.layout.tables,
        opened.writer.root_id or declared.root.tag,
        opened.faults,
        snapshots=declared.config.snapshots,
        remote=remote,
    )
    try:
        for publisher in publishers:
            publisher.publish(opened.writer.epochs.entries)
    except BaseException:
        for publisher in publishers:
            publisher.close()
        raise
    return publishers


def run_plan(
    declared: Declared, opened: Opened, lineage: Lineage, slots: int | None, remote: bool
) -> OperatorPlan:
    """Step 4: the operator's plan for this run."""
    epochs = opened.writer.epochs if declared.config.snapshots else None
    replays = (
        decided_replays(epochs, opened.checkpoint, lineage, opened.layout.targets[0].table)
        if epochs is not None
        else ()
    )
    return replace(
        with_watermark_floors(declared.plan, epochs),
        time_zone=str(declared.spark.conf.get("spark.sql.session.timeZone")),
        replays=replays,
        live_state=live_state(
            opened.layout,
            declared.config,
            opened.writer.root_id,
            lineage.epoch_base,
            remote,
            opened.run_id,
        ),
        slots=slots,
    )


def start_stream(
    declared: Declared,
    plan: OperatorPlan,
    batch_function: Callable[[DataFrame, int], None],
    lineage: Lineage,
    trigger: Trigger,
) -> StreamingQuery:
    """Step 5: the input the run reads, keyed into key groups, and Spark's streaming query."""
    frame = declared.frame
    if lineage.fresh and lineage.restore is not None:
        rewound = rewound_frame(
            declared.name,
            declared.source,
            declared.transform,
            lineage.restore,
            declared.spark,
            declared.root,
        )
        frame = rewound or frame
    for edge in declared.back_edges:
        uri = declared.root.table_uri(edge.table)
        frame = frame.unionByName(
            loop_head(declared.spark, edge, uri, lineage.restore), allowMissingColumns=True
        )
    keyed = frame.withColumn(
        KEY_GROUP, key_group_column(declared.plan.key_columns, declared.config.key_groups)
    )
    if lineage.restore is not None:
        keyed = with_restore_rows(keyed, lineage.restore, plan, declared.config.key_groups)
    return start_query(
        declared.name,
        keyed,
        plan,
        batch_function,
        declared.checkpoint,
        (trigger.processing_time, trigger.available_now),
        from_channels=isinstance(declared.source, ChannelSource),
    )
