"""The state diff of one key group: what the operator changed, as upserts and tombstones."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pyspark_abs.errors import (
    InvalidTimeoutError,
    OperatorError,
    SchemaMismatchError,
)
from pyspark_abs.operators.contract import (
    Clock,
    KeyGroupResult,
    Rows,
    TimeoutMode,
)
from pyspark_abs.operators.keys import (
    BoolArray,
    IntArray,
    KeyArray,
    contains,
    key_arrays,
    positions,
    repeated,
)
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.schema import (
    DELETED,
    TIMEOUT,
    check_columns,
    frame_to_arrow,
    table_to_arrow,
)
from pyspark_abs.operators.ttl import due, expiries


@dataclass(frozen=True)
class KeyGroupOutcome:
    """The result of one key group in one epoch.

    Attributes:
        state: The key group's complete new state (blob schema): the rows of the state it
            started from that ``kept`` selects, in their order, then new rows.
        kept: Which rows of the state the key group started from it kept unchanged.
        changes: Upserts and tombstones of the keys whose state changed (change schema).
        outputs: Output rows, by output index.
        keys_delta: Keys added minus keys removed.
        next_timeout_ms: The earliest timeout among the key group's keys, if any.
    """

    state: pa.Table
    kept: BoolArray
    changes: pa.Table
    outputs: tuple[pa.Table, ...]
    keys_delta: int
    next_timeout_ms: int | None


class Converted:
    """Frames a function returned, converted to Arrow once even when returned twice.

    A vectorized operator often returns one frame as both new state and output (say, the
    new counts); when the schemas agree, the second conversion is free.
    """

    def __init__(self, time_zone: str) -> None:
        self.time_zone = time_zone
        self._done: dict[int, tuple[pd.DataFrame, pa.Schema, bool | None, pa.Table]] = {}

    def __call__(
        self, frame: Rows, schema: pa.Schema, what: str, *, nan_is_null: bool = True
    ) -> pa.Table:
        """``frame_to_arrow(frame, schema, what, time_zone)``, reusing an earlier conversion.

        A ``pyarrow.Table`` is cast (:func:`table_to_arrow`), its values as they are.
        """
        if isinstance(frame, pa.Table):
            return table_to_arrow(frame, schema, what, self.time_zone)
        nan_rule = nan_is_null if _holds_floats(schema) else None
        done = self._done.get(id(frame))
        if done is not None and done[0] is frame and done[1:3] == (schema, nan_rule):
            return done[3]
        table = frame_to_arrow(frame, schema, what, self.time_zone, nan_is_null=nan_is_null)
        self._done[id(frame)] = (frame, schema, nan_rule, table)
        return table


@functools.lru_cache(maxsize=256)
def _holds_floats(schema: pa.Schema) -> bool:
    """Whether a float can sit anywhere in ``schema`` (only there does a NaN rule matter)."""

    def floats(kind: pa.DataType) -> bool:
        if pa.types.is_floating(kind):
            return True
        if isinstance(kind, pa.ListType | pa.LargeListType | pa.FixedSizeListType):
            return floats(kind.value_type)
        if isinstance(kind, pa.MapType):
            return floats(kind.key_type) or floats(kind.item_type)
        if isinstance(kind, pa.StructType):
            return any(floats(field.type) for field in kind)
        return False

    return any(floats(field.type) for field in schema)


def apply_state(
    plan: OperatorPlan,
    state: pa.Table,
    row_keys: pa.Table,
    keys: tuple[KeyArray, KeyArray],
    called: BoolArray,
    result: KeyGroupResult,
    outputs: tuple[pa.Table, ...],
    clock: Clock,
    where: str,
    converted: Converted,
    row_times_ms: IntArray | None = None,
) -> KeyGroupOutcome:
    """Check the returned state, diff it against the current state, and build the outcome.

    Args:
        plan: The operator.
        state: The key group's state before the call.
        row_keys: Key columns of the call's input rows.
        keys: Keys of ``state`` and ``row_keys`` (see :func:`key_arrays`).
        called: For each key in ``state``, whether the function was called for it.
        result: What the function returned.
        outputs: The call's output tables.
        clock: The epoch's clocks.
        where: Operator, epoch and key group, for messages.
        converted: Converts returned frames to Arrow.
        row_times_ms: Event time of each input row, for an event-time TTL.
    """
    columns = plan.key_columns
    upserts = _upsert_table(plan, result.state, where, converted)
    removed = _removed_table(plan, result.removed, where)
    state_keys, input_keys, up_keys, rm_keys = _joint_keys(
        plan, state, row_keys, keys, [upserts, removed]
    )
    twice = repeated(up_keys)
    if twice.any():
        raise SchemaMismatchError(
            f"{where}: returned state holds key(s) {_few(upserts, twice, columns)} more than once"
        )
    both = contains(up_keys, rm_keys)
    if both.any():
        raise SchemaMismatchError(
            f"{where}: key(s) {_few(upserts, both, columns)} are both updated and removed; do "
            f"one or the other"
        )
    found = positions(up_keys, state_keys)
    gone_at = positions(rm_keys, state_keys)
    for table, keys_, at in ((upserts, up_keys, found), (removed, rm_keys, gone_at)):
        foreign = at < 0
        if foreign.any():
            foreign[foreign] = ~contains(keys_.filter(foreign), input_keys)
        if foreign.any():
            raise OperatorError(
                f"{where}: returned state for key(s) {_few(table, foreign, columns)} that have "
                f"neither rows nor state in this key group; an operator may only change keys "
                f"it was called for"
            )
    _check_timeouts(plan, upserts, clock, where)
    if plan.ttl_ms is not None and upserts.num_rows:
        expiry = expiries(plan, up_keys, input_keys, row_times_ms, clock)
        upserts = upserts.set_column(upserts.schema.get_field_index(TIMEOUT), TIMEOUT, expiry)

    # Keys the function was called for keep no timeout unless it set one again (a TTL's
    # expiry stays until the next write).
    reset = (
        called
        & ~contains(state_keys, up_keys)
        & ~contains(state_keys, rm_keys)
        & np.asarray(pc.is_valid(state[TIMEOUT]).to_numpy(zero_copy_only=False), dtype=bool)
        if has_timeouts(state) and plan.ttl_ms is None
        else no_keys(state)
    )
    if reset.any():
        carried = state.filter(reset)
        carried = carried.set_column(
            carried.schema.get_field_index(TIMEOUT),
            TIMEOUT,
            pa.nulls(carried.num_rows, pa.int64()),
        )
        upserts = pa.concat_tables([upserts, carried])
        found = np.concatenate([found, np.flatnonzero(reset)])

    existing = found >= 0
    changed = ~existing
    if existing.any():
        values = [*plan.state_schema.names, TIMEOUT]
        before = state.select(values).take(found[existing])
        after = upserts.select(values).filter(existing)
        changed[existing] = ~_rows_equal(before, after)
    gone = gone_at >= 0

    keep = np.ones(state.num_rows, dtype=bool)
    keep[found[existing & changed]] = False
    keep[gone_at[gone]] = False
    written = upserts.filter(changed)
    new_state = pa.concat_tables([state.filter(keep), written])

    changes = written.append_column(DELETED, pa.array(np.zeros(written.num_rows, bool)))
    if gone.any():
        changes = pa.concat_tables([changes, tombstones(plan, removed.filter(gone))])
    return KeyGroupOutcome(
        state=new_state,
        kept=keep,
        changes=changes,
        outputs=outputs,
        keys_delta=int((~existing).sum()) - int(gone.sum()),
        next_timeout_ms=earliest_timeout(new_state),
    )


def apply_changes(plan: OperatorPlan, state: pa.Table, changes: pa.Table) -> pa.Table:
    """A key group's state (blob schema) after one epoch's changes (change schema)."""
    return apply_changes_keeping(plan, state, changes)[0]


def apply_changes_keeping(
    plan: OperatorPlan, state: pa.Table, changes: pa.Table
) -> tuple[pa.Table, BoolArray]:
    """:func:`apply_changes`, and which rows of ``state`` the result begins with."""
    if not changes.num_rows:
        return state, np.ones(state.num_rows, dtype=bool)
    state_keys, changed_keys = key_arrays([state, changes], plan.key_columns)
    kept = ~contains(state_keys, changed_keys)
    deleted = np.asarray(changes[DELETED].to_numpy(zero_copy_only=False), dtype=object)
    live = changes.filter(pa.array(deleted != True))  # noqa: E712 (null counts as live)
    written = live.select(plan.blob_schema.names).cast(plan.blob_schema)
    return pa.concat_tables([state.filter(kept), written]), kept


def earliest_timeout(state: pa.Table) -> int | None:
    """The earliest ``_timeout`` of a key group's state, if any key has one."""
    earliest: int | None = pc.min(state[TIMEOUT]).as_py() if has_timeouts(state) else None
    return earliest


def has_timeouts(state: pa.Table) -> bool:
    """Whether any key of a key group's state (or of its changes) has a ``_timeout``."""
    return state[TIMEOUT].null_count < state.num_rows


def no_keys(state: pa.Table) -> BoolArray:
    """A mask selecting no row of ``state``."""
    return np.zeros(state.num_rows, dtype=bool)


def _joint_keys(
    plan: OperatorPlan,
    state: pa.Table,
    row_keys: pa.Table,
    keys: tuple[KeyArray, KeyArray],
    returned: list[pa.Table],
) -> list[KeyArray]:
    """Keys of the state, the input rows and the returned tables, comparable with each other.

    ``keys`` are those of ``state`` and ``row_keys``. Keys of one column compare as they
    are; keys of several columns are coded again, jointly over all the tables (see
    :func:`key_arrays`).
    """
    if len(plan.key_columns) == 1:
        return [*keys, *key_arrays(returned, plan.key_columns)]
    return key_arrays([state, row_keys, *returned], plan.key_columns)


def _upsert_table(
    plan: OperatorPlan, frame: Rows | None, where: str, converted: Converted
) -> pa.Table:
    if frame is None:
        return plan.blob_schema.empty_table()
    if plan.stateless and len(frame):
        raise OperatorError(
            f"{where}: returned state, but the operator was declared without state_schema; "
            f"declare the state it keeps, or return no state"
        )
    what = f"{where}: returned state"
    check_columns(frame, plan.upsert_schema.names, what, optional=[TIMEOUT])
    # a NaN set as a state value stays NaN (as in Spark's GroupState); see frame_to_arrow
    names = frame.column_names if isinstance(frame, pa.Table) else frame.columns
    if TIMEOUT in names:
        return converted(frame, plan.blob_schema, what, nan_is_null=False)
    table = converted(frame, plan.upsert_schema, what, nan_is_null=False)
    return table.append_column(plan.blob_schema.field(TIMEOUT), pa.nulls(len(frame), pa.int64()))


def _removed_table(plan: OperatorPlan, frame: Rows | None, where: str) -> pa.Table:
    if frame is None:
        return plan.key_schema.empty_table()
    what = f"{where}: removed keys"
    check_columns(frame, plan.key_columns, what)
    return plan.to_arrow(frame, plan.key_schema, what)


def tombstones(plan: OperatorPlan, keys: pa.Table) -> pa.Table:
    """Change rows that remove the keys of ``keys``."""
    n = keys.num_rows
    arrays: list[Any] = [keys[k] for k in plan.key_columns]
    arrays += [pa.nulls(n, f.type) for f in plan.state_schema]
    arrays += [pa.nulls(n, pa.int64()), pa.array(np.ones(n, dtype=bool))]
    return pa.Table.from_arrays(arrays, schema=plan.change_schema)


def _check_timeouts(plan: OperatorPlan, upserts: pa.Table, clock: Clock, where: str) -> None:
    if not has_timeouts(upserts):
        return
    set_ = upserts.filter(pc.is_valid(upserts[TIMEOUT]))
    if plan.ttl_ms is not None:
        raise InvalidTimeoutError(
            f"{where}: returned state sets _timeout, but the operator has a ttl, which keeps "
            f"each key's expiry there; return state without _timeout"
        )
    if plan.timeout is TimeoutMode.NONE:
        raise InvalidTimeoutError(
            f"{where}: returned state sets _timeout, but the operator was declared without "
            f"a timeout; declare timeout='processing_time' or 'event_time'"
        )
    earliest = pc.min(set_[TIMEOUT]).as_py()
    if plan.timeout is TimeoutMode.EVENT_TIME:
        if clock.watermark_ms is not None and earliest < clock.watermark_ms:
            raise InvalidTimeoutError(
                f"{where}: a key's _timeout {earliest} is older than the watermark "
                f"{clock.watermark_ms}; event-time timeouts must not be in the past"
            )
    elif earliest <= clock.processing_time_ms:
        raise InvalidTimeoutError(
            f"{where}: a key's _timeout {earliest} is not after the processing time "
            f"{clock.processing_time_ms}; processing-time timeouts must be in the future"
        )


def expired(plan: OperatorPlan, state: pa.Table, has_rows: BoolArray, clock: Clock) -> BoolArray:
    """Keys whose timeout fires now: set, below the threshold, and without rows."""
    return due(plan, state, clock) & ~has_rows


def _rows_equal(before: pa.Table, after: pa.Table) -> BoolArray:
    """Row-wise equality of two tables of the same schema; nulls equal nulls, NaN equals NaN."""
    same = np.ones(before.num_rows, dtype=bool)
    for name in before.column_names:
        a = before[name].combine_chunks()
        b = after[name].combine_chunks()
        same &= _column_equal(a, b)
    return same


def _column_equal(a: Any, b: Any) -> BoolArray:
    if a.null_count == len(a) and b.null_count == len(b):
        return np.ones(len(a), dtype=bool)
    kind = a.type
    if (pa.types.is_integer(kind) or pa.types.is_boolean(kind)) and not (
        a.null_count or b.null_count
    ):
        return np.asarray(a.to_numpy(zero_copy_only=False) == b.to_numpy(zero_copy_only=False))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _lists_equal(a, b)
    if pa.types.is_nested(kind) or pa.types.is_dictionary(kind):
        return np.array([x == y for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)])
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    equal = pc.fill_null(pc.equal(a, b), False)
    if pa.types.is_floating(kind):
        equal = pc.or_(equal, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
    return np.asarray(pc.fill_null(pc.or_(equal, both_null), False).to_numpy(zero_copy_only=False))


def _lists_equal(a: Any, b: Any) -> BoolArray:
    """Row-wise equality of two list arrays.

    Two null lists are equal; else both have the same length and equal values by
    :func:`_column_equal` (nulls equal nulls, NaN equals NaN).
    """
    a_null = np.asarray(a.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    b_null = np.asarray(b.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    a_len = np.asarray(pc.fill_null(pc.list_value_length(a), -1).to_numpy(), dtype=np.int64)
    b_len = np.asarray(pc.fill_null(pc.list_value_length(b), -1).to_numpy(), dtype=np.int64)
    both = ~a_null & ~b_null & (a_len == b_len)
    equal: BoolArray = a_null & b_null
    rows = np.flatnonzero(both)
    if len(rows):
        picked = pa.array(rows)
        same = _column_equal(a.take(picked).flatten(), b.take(picked).flatten())
        owner = np.repeat(np.arange(len(rows)), a_len[rows])
        wrong = np.bincount(owner[~same], minlength=len(rows))
        equal[rows] = wrong == 0
    return equal


def _few(table: pa.Table, mask: BoolArray, columns: tuple[str, ...]) -> str:
    """Up to five keys of the masked rows, as tuples."""
    picked = table.filter(mask).select(list(columns))
    keys = list(zip(*(picked.column(c).to_pylist() for c in columns), strict=True))
    more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
    return f"{keys[:5]}{more}"
