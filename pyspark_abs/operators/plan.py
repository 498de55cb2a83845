"""The plan of an operator: what it reads, keeps and writes, resolved against its input."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Protocol

import pandas as pd
import pyarrow as pa

from pyspark_abs.errors import OperatorDefinitionError, StateEncodingError, StateTooLargeError
from pyspark_abs.operators.contract import (
    AnyKeyGroupFunction,
    Operator,
    TimeoutMode,
)
from pyspark_abs.operators.keys import BoolArray
from pyspark_abs.operators.schema import (
    DELETED,
    EPOCH,
    KEY_GROUP,
    RESERVED_COLUMNS,
    RESTORE,
    SLOT_COLUMN,
    STATELESS_COLUMN,
    TIMEOUT,
    TIMERS,
    frame_to_arrow,
    instant_columns,
    localize,
    resolve_struct,
    table_to_arrow,
    to_arrow,
    to_frame,
)
from pyspark_abs.operators.state_codec import SLOT, BatchCodec, decode_marker

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType


@dataclass(frozen=True)
class DecidedReplay:
    """A micro-batch that Spark will replay although its epoch is already decided.

    Attributes:
        batch_id: Spark's micro-batch id.
        epoch: The decided epoch.
        files: The epoch's pre-committed state-change files (absolute locations).
    """

    batch_id: int
    epoch: int
    files: tuple[str, ...]


class LiveState(Protocol):
    """Where a key group's live state is kept between epochs.

    Spark's state store keeps one value per key group, ``stored``: the state itself
    (:class:`StateInSpark`) or a small reference to it kept elsewhere.
    """

    def load(
        self, plan: OperatorPlan, key_group: int, stored: bytes, batch_id: int | None
    ) -> pa.Table:
        """The key group's state (blob schema) that ``stored`` holds or refers to."""
        ...

    def save(
        self,
        plan: OperatorPlan,
        key_group: int,
        state: pa.Table,
        batch_id: int | None,
        replaced: bytes | None,
        kept: BoolArray | None,
    ) -> bytes:
        """Keep the key group's new state; the value for Spark's state store.

        ``replaced`` is the value it replaces (None: the key group had no state). ``kept``
        says which rows of the state loaded from ``replaced`` begin ``state``, in their
        order; its other rows are new (None: not known).
        """
        ...


@dataclass(frozen=True)
class StateInSpark:
    """The whole state of a key group is one blob in Spark's state store.

    Every change rewrites and checkpoints the whole blob; used when snapshots are off,
    since there is then no snapshot to rebuild the state from.
    """

    def load(
        self, plan: OperatorPlan, key_group: int, stored: bytes, batch_id: int | None
    ) -> pa.Table:
        """Decode the blob.

        Raises:
            StateEncodingError: The checkpoint holds a marker of live state on local disk.
        """
        if stored.startswith(SLOT) or decode_marker(stored) is not None:
            raise StateEncodingError(
                f"operator {plan.name!r}, key group {key_group}: the checkpoint keeps this key "
                f"group's state on the executors' local disk (it was written with snapshots "
                f"on), which this run (snapshots off, or through Spark Connect) cannot read. "
                f"Start it with snapshots on outside Spark Connect, or give it a new checkpoint"
            )
        return plan.state_codec.decode(stored)

    def save(
        self,
        plan: OperatorPlan,
        key_group: int,
        state: pa.Table,
        batch_id: int | None,
        replaced: bytes | None,
        kept: BoolArray | None,
    ) -> bytes:
        """Encode the blob (see :meth:`OperatorPlan.encode_state`)."""
        return plan.encode_state(state, key_group, batch_id)


@dataclass(frozen=True)
class OperatorPlan:
    """An operator resolved against its input: everything the tasks need, picklable.

    Attributes:
        name: Operator id.
        key_columns: Key column names.
        input_schema: Columns of the input rows the function sees.
        state_schema: Declared state columns, all nullable.
        outputs: Output names and schemas, in declaration order.
        timeout: The clock of key timeouts.
        function: The key-group function (for a per-key operator, its adapter).
        snapshots: Whether state changes are emitted for the snapshot.
        max_state_bytes: The largest encoded state of one key group (None: no bound).
        replays: Micro-batches of decided epochs that this run's Spark will replay: their
            key groups install the decided state changes instead of running the function.
        time_zone: The session time zone: the function sees instants as datetimes aware of
            it, and naive datetimes it returns are wall-clock times there.
        event_time: The input column the query's watermark is defined on, if any.
        watermark_floor_ms: The watermark of the snapshot this run continues from (for a
            restore epoch, the one the epoch after the installed one ran with). A restore
            starts Spark's watermark afresh at 0; with the floor, late rows are dropped and
            timeouts fire as in a run that never restarted.
        first_batch_floor_ms: After a restore epoch, the late-row floor of the fresh
            checkpoint's micro-batch 0: Spark judges a batch's rows against the previous
            batch's watermark, here the installed epoch's own. None: ``watermark_floor_ms``.
        ttl_ms: State time-to-live (see :attr:`Operator.ttl_ms`), on the ``timeout`` clock.
        live_state: Where key groups keep their state between epochs.
        arrow: The function takes ``pyarrow`` tables, not pandas frames.
        slots: How many slots Spark groups the key groups into, one call per slot and
            epoch (see :func:`~pyspark_abs.operators.partitioning.slot_values`); None: one
            call per key group.
    """

    name: str
    key_columns: tuple[str, ...]
    input_schema: pa.Schema
    state_schema: pa.Schema
    outputs: tuple[tuple[str, pa.Schema], ...]
    timeout: TimeoutMode
    function: AnyKeyGroupFunction
    snapshots: bool = True
    max_state_bytes: int | None = None
    replays: tuple[DecidedReplay, ...] = ()
    time_zone: str = "UTC"
    event_time: str | None = None
    watermark_floor_ms: int = 0
    first_batch_floor_ms: int | None = None
    ttl_ms: int | None = None
    live_state: LiveState = field(default_factory=StateInSpark)
    arrow: bool = False
    slots: int | None = None

    def replay_of(self, batch_id: int | None) -> DecidedReplay | None:
        """The decided epoch that micro-batch ``batch_id`` replays, if it is one."""
        return next((r for r in self.replays if r.batch_id == batch_id), None)

    @cached_property
    def key_schema(self) -> pa.Schema:
        """The key columns with their input types (nullable)."""
        return pa.schema([self.input_schema.field(k).with_nullable(True) for k in self.key_columns])

    @cached_property
    def input_instants(self) -> tuple[str, ...]:
        """Input columns holding instants, which reach the function zone-aware."""
        return instant_columns(self.input_schema)

    @cached_property
    def no_keys(self) -> pd.DataFrame:
        """An empty frame of the key columns."""
        return self.frame(self.key_schema.empty_table())

    def without_late_rows(self, rows: pd.DataFrame, batch_id: int | None) -> pd.DataFrame:
        """``rows`` of micro-batch ``batch_id`` without those older than the floor.

        Instants are still in microseconds.
        Spark drops rows older than its own watermark before the function, for event-time
        timeouts only; this drops those older than the floor, which Spark's fresh
        watermark may not have reached yet. Restore rows have no event time and stay.
        """
        column = self.event_time
        if self.timeout is not TimeoutMode.EVENT_TIME or column is None or not len(rows):
            return rows
        first = batch_id == 0 and self.first_batch_floor_ms is not None
        floor = self.first_batch_floor_ms if first else self.watermark_floor_ms
        late = (rows[column] < (floor or 0) * 1000).fillna(False)  # a null time is not late
        return rows[~late] if late.any() else rows

    def watermark(self, spark_watermark_ms: int | None) -> int | None:
        """The watermark the function sees: Spark's, never below the floor."""
        if spark_watermark_ms is None:
            return None
        return max(spark_watermark_ms, self.watermark_floor_ms)

    def frame(self, table: pa.Table) -> pd.DataFrame:
        """An Arrow table as the function sees it: instants aware of the session time zone."""
        return localize(to_frame(table), instant_columns(table.schema), self.time_zone)

    def to_arrow(self, rows: pd.DataFrame | pa.Table, schema: pa.Schema, what: str) -> pa.Table:
        """Rows the function returned, checked and converted.

        A frame as :func:`frame_to_arrow` converts it, a table as :func:`table_to_arrow`.
        """
        if isinstance(rows, pa.Table):
            return table_to_arrow(rows, schema, what, self.time_zone)
        return frame_to_arrow(rows, schema, what, self.time_zone)

    @cached_property
    def blob_schema(self) -> pa.Schema:
        """A key group's state: key columns, state columns and ``_timeout``."""
        return pa.schema([*self.key_schema, *self.state_schema, pa.field(TIMEOUT, pa.int64())])

    @cached_property
    def upsert_schema(self) -> pa.Schema:
        """New state a function returns: key and state columns (``_timeout`` optional)."""
        return pa.schema([*self.key_schema, *self.state_schema])

    @cached_property
    def has_timers(self) -> bool:
        """Whether each key keeps several timers (``timers=True``).

        Timers fire once the clock has reached their time; a key's one timeout fires once
        the clock has passed it.
        """
        return TIMERS in self.state_schema.names

    @property
    def stateless(self) -> bool:
        """Whether the operator was declared without state."""
        return self.state_schema.names == [STATELESS_COLUMN]

    @cached_property
    def change_schema(self) -> pa.Schema:
        """A key group's state changes: the blob schema plus ``_deleted``."""
        return self.blob_schema.append(pa.field(DELETED, pa.bool_()))

    @cached_property
    def state_table_schema(self) -> pa.Schema:
        """The state table: key and state columns, then the reserved columns."""
        return pa.schema(
            [
                *self.key_schema,
                *self.state_schema,
                pa.field(KEY_GROUP, pa.int32()),
                pa.field(EPOCH, pa.int64()),
                pa.field(DELETED, pa.bool_()),
                pa.field(TIMEOUT, pa.int64()),
            ]
        )

    @cached_property
    def state_codec(self) -> BatchCodec:
        """Codec of the key-group state blob."""
        return BatchCodec(self.blob_schema, f"state of operator {self.name!r}", compress=True)

    def encode_state(self, state: pa.Table, key_group: int, batch_id: int | None) -> bytes:
        """Encode a key group's state as one LZ4-compressed blob.

        Raises:
            StateTooLargeError: See :meth:`state_message`.
        """
        return self.state_codec.frame(self.state_message(state, key_group, batch_id))

    def state_message(self, state: pa.Table, key_group: int, batch_id: int | None) -> pa.Buffer:
        """A key group's state as an Arrow IPC message, not framed yet.

        Raises:
            StateTooLargeError: See :meth:`check_state_size`.
        """
        message = self.state_codec.message(state)
        self.check_state_size(state, key_group, batch_id)
        return message

    def check_state_size(self, state: pa.Table, key_group: int, batch_id: int | None) -> None:
        """Raise :class:`StateTooLargeError` if ``state`` holds too many bytes of Arrow.

        Every way of writing a state measures it alike, so whether an epoch fails does not
        depend on how its state is written.
        """
        bound, size = self.max_state_bytes, state.nbytes
        if bound is not None and size > bound:
            raise StateTooLargeError(
                f"operator {self.name!r}, epoch {batch_id}, key group {key_group}: the key "
                f"group's state holds {size:,} bytes of Arrow ({state.num_rows:,} keys), "
                f"above max_key_group_state_bytes={bound:,}; the epoch is not committed. "
                f"Spread the keys over more key groups (raise key_groups; on an existing "
                f"checkpoint roll back to the latest epoch first) or raise "
                f"max_key_group_state_bytes"
            )

    @cached_property
    def change_codec(self) -> BatchCodec:
        """Codec of state-change payloads."""
        return BatchCodec(self.change_schema, f"state changes of operator {self.name!r}")

    @cached_property
    def output_codecs(self) -> tuple[BatchCodec, ...]:
        """Codecs of output payloads, by output index."""
        return tuple(
            BatchCodec(schema, f"output {name!r} of operator {self.name!r}")
            for name, schema in self.outputs
        )


# Spark's field metadata key marking the column a watermark is defined on.
EVENT_TIME_MARK = "spark.watermarkDelayMs"


def check_source(pipeline: str, operator: Operator, plan: OperatorPlan, schema: StructType) -> None:
    """Refuse a source the operator cannot run over.

    That is event-time timeouts or an event-time ttl without a watermark, or what the
    operator's own ``input_problem`` finds.

    Raises:
        OperatorDefinitionError: The source does not fit; the message says what to change.
    """
    if plan.timeout is TimeoutMode.EVENT_TIME and plan.event_time is None:
        what = "an event-time ttl" if plan.ttl_ms is not None else "event-time timeouts"
        raise OperatorDefinitionError(
            f"pipeline {pipeline!r}: operator {plan.name!r} has {what}, but the source has no "
            f"watermark (the source's columns are {plan.input_schema.names}); set one with "
            f"transform=lambda df: df.withWatermark(<event-time column>, <delay>)"
        )
    problem = operator.input_problem and operator.input_problem(schema, plan.event_time)
    if problem:
        raise OperatorDefinitionError(f"pipeline {pipeline!r}: operator {plan.name!r}: {problem}")


def resolve_plan(
    name: str,
    source: DataFrame,
    operator: Operator,
    snapshots: bool,
    *,
    max_state_bytes: int | None = None,
) -> OperatorPlan:
    """Resolve an operator against its input DataFrame.

    ``max_state_bytes`` bounds the encoded state of one key group (None: no bound).

    Raises:
        OperatorDefinitionError: Source and operator do not fit together.
    """
    columns = source.columns
    reserved = (*RESERVED_COLUMNS, RESTORE, SLOT_COLUMN)
    clashes = [c for c in columns if c in reserved]
    if clashes:
        raise OperatorDefinitionError(
            f"pipeline {name!r}: source column(s) {clashes} use names reserved by "
            f"pyspark-abs {list(reserved)}; rename them"
        )
    missing = [k for k in operator.key if k not in columns]
    if missing:
        raise OperatorDefinitionError(
            f"pipeline {name!r}: key column(s) {missing} of operator {operator.name!r} are not "
            f"in the source, which has {columns}"
        )
    state = resolve_struct(operator.state_schema, f"operator {operator.name!r} state_schema")
    state_names = [f.name for f in state.fields]
    overlap = [c for c in state_names if c in operator.key or c in RESERVED_COLUMNS]
    if overlap or not state_names:
        raise OperatorDefinitionError(
            f"operator {operator.name!r}: state_schema must declare at least one column and "
            f"no key or reserved column, got {state_names}"
        )
    repeated = sorted({c for c in state_names if state_names.count(c) > 1})
    if repeated:
        raise OperatorDefinitionError(
            f"operator {operator.name!r}: state column(s) {repeated} are declared twice "
            f"({TIMERS!r} is where timers=True keeps the key's timers); rename them"
        )
    outputs = tuple(
        (out, to_arrow(resolve_struct(schema, f"operator {operator.name!r} output {out!r}")))
        for out, schema in operator.outputs
    )
    state_schema = to_arrow(state, nullable=True)
    if operator.evolution is not None:
        operator.evolution.check(operator.name, operator.key, state_schema)
    event_time = next((f.name for f in source.schema.fields if EVENT_TIME_MARK in f.metadata), None)
    return OperatorPlan(
        name=operator.name,
        key_columns=operator.key,
        input_schema=to_arrow(source.schema),
        state_schema=state_schema,
        outputs=outputs,
        timeout=operator.timeout,
        function=operator.function,
        snapshots=snapshots,
        max_state_bytes=max_state_bytes,
        event_time=event_time,
        ttl_ms=operator.ttl_ms,
        arrow=operator.arrow,
    )
