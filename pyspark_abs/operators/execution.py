"""Running an operator on one key group in one epoch.

:func:`run_key_group` is the pure part: given the key group's rows, its current state and the
epoch's clocks, it fires expired timeouts, calls the user's function, checks what it
returned, and computes the key group's new state, the changed keys (upserts and tombstones)
and the outputs. :class:`KeyGroupTask` is the thin adapter Spark calls through
``applyInPandasWithState``; it keeps the key group's state as one blob in Spark's state store
and emits the envelope.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pyspark_abs.errors import (
    AbsError,
    InvalidTimeoutError,
    OperatorError,
    SchemaMismatchError,
    StateTooLargeError,
)
from pyspark_abs.operators.contract import (
    Clock,
    KeyGroupContext,
    KeyGroupResult,
    KeyState,
    TimeoutMode,
)
from pyspark_abs.operators.envelope import envelope_frame
from pyspark_abs.operators.keys import (
    BoolArray,
    KeyArray,
    contains,
    key_arrays,
    positions,
    repeated,
)
from pyspark_abs.operators.plan import DecidedReplay, OperatorPlan
from pyspark_abs.operators.schema import (
    DELETED,
    KEY_GROUP,
    RESTORE,
    TIMEOUT,
    check_columns,
    check_names,
    frame_to_arrow,
    instant_columns,
    localize,
)

if TYPE_CHECKING:
    from pyspark.sql.streaming.state import GroupState


@dataclass(frozen=True)
class KeyGroupOutcome:
    """The result of one key group in one epoch.

    Attributes:
        state: The key group's complete new state (blob schema).
        changes: Upserts and tombstones of the keys whose state changed (change schema).
        outputs: Output rows, by output index.
        keys_delta: Keys added minus keys removed.
        next_timeout_ms: The earliest timeout among the key group's keys, if any.
    """

    state: pa.Table
    changes: pa.Table
    outputs: tuple[pa.Table, ...]
    keys_delta: int
    next_timeout_ms: int | None


def run_key_group(
    plan: OperatorPlan,
    key_group: int,
    rows: pd.DataFrame,
    state: pa.Table,
    clock: Clock,
    epoch: int | None,
) -> KeyGroupOutcome:
    """Run the operator on one key group for one epoch.

    Args:
        plan: The operator.
        key_group: The key group.
        rows: The key group's input rows of this epoch (possibly none).
        state: The key group's current state (blob schema).
        clock: The epoch's processing time and watermark.
        epoch: The epoch, for messages and the function's context.

    Raises:
        OperatorError: The function raised, or returned state for a key of another group.
        SchemaMismatchError: The function returned frames that do not fit the schemas.
        InvalidTimeoutError: A returned timeout is not allowed.
    """
    where = f"operator {plan.name!r}, epoch {epoch}, key group {key_group}"
    current = plan.frame(state)
    row_keys = _arrow_keys(rows, plan, where)
    state_keys, input_keys = key_arrays([state, row_keys], plan.key_columns)
    # Which keys the function is called for matters only for keys with a timeout.
    timeouts = has_timeouts(state)
    has_rows = contains(state_keys, input_keys) if timeouts else _no_keys(state)
    fired = _expired(plan, state, has_rows, clock) if timeouts else has_rows

    converted = _Converted(plan.time_zone)
    if plan.vectorized is not None:
        timed_out = (
            plan.frame(state.filter(fired).select(list(plan.key_columns)))
            if fired.any()
            else plan.no_keys.copy(deep=False)
        )
        ctx = KeyGroupContext(
            operator=plan.name, epoch=epoch, key_group=key_group, clock=clock, timed_out=timed_out
        )
        try:
            result = plan.vectorized(rows, current, ctx)
        except AbsError as err:
            raise _located(err, where) from err
        except Exception as err:
            raise OperatorError(f"{where}: the function raised {_describe(err)}") from err
        if result is None:
            result = KeyGroupResult()
        elif not isinstance(result, KeyGroupResult):
            raise SchemaMismatchError(
                f"{where}: the function returned {type(result).__name__}; a vectorized "
                f"operator returns a KeyGroupResult (or None)"
            )
        outputs = _vectorized_outputs(plan, result.output, where, converted)
    else:
        result, outputs = _run_per_key(plan, rows, row_keys, current, fired, clock, where)

    called = has_rows | fired
    return _apply_state(
        plan,
        state,
        row_keys,
        (state_keys, input_keys),
        called,
        result,
        outputs,
        clock,
        where,
        converted,
    )


def _run_per_key(
    plan: OperatorPlan,
    rows: pd.DataFrame,
    row_keys: pa.Table,
    current: pd.DataFrame,
    fired: BoolArray,
    clock: Clock,
    where: str,
) -> tuple[KeyGroupResult, tuple[pa.Table, ...]]:
    """Call a per-key function for every key with rows and every timed-out key."""
    assert plan.per_key is not None
    keys = list(plan.key_columns)
    fields = plan.state_schema.names
    existing: dict[tuple[Any, ...], int] = {
        _norm_key(k): i for i, k in enumerate(current[keys].itertuples(index=False, name=None))
    }
    values: list[dict[str, Any]] = current[fields].to_dict("records")  # type: ignore[assignment]
    timeouts = current[TIMEOUT].tolist()
    upserts: list[dict[str, Any]] = []
    removed: list[tuple[Any, ...]] = []
    collected = [_OutputRows(schema, plan.time_zone) for _, schema in plan.outputs]

    def call(key: tuple[Any, ...], key_rows: pd.DataFrame, timed_out: bool) -> None:
        position = existing.get(key)
        old_timeout = None if position is None else _ms_or_none(timeouts[position])
        handle = KeyState(
            key,
            fields,
            None if position is None else values[position],
            timeout_mode=plan.timeout,
            clock=clock,
            time_zone=plan.time_zone,
            has_timed_out=timed_out,
            timeout_ms=old_timeout,
        )
        assert plan.per_key is not None
        try:
            returned = plan.per_key(key, key_rows, handle)
        except AbsError as err:
            raise _located(err, f"{where}, key {key!r}") from err
        except Exception as err:
            raise OperatorError(
                f"{where}, key {key!r}: the function raised {_describe(err)}"
            ) from err
        _collect_per_key_output(plan, returned, collected, f"{where}, key {key!r}")
        if handle.removed:
            removed.append(key)
        elif handle.exists:
            row = dict(zip(keys, key, strict=True))
            row.update(handle.get())
            row[TIMEOUT] = handle.new_timeout_ms
            upserts.append(row)

    if len(rows):
        groups = plan.frame(row_keys).groupby(keys, sort=False, dropna=False).indices
        for key, at in groups.items():
            key_tuple = key if isinstance(key, tuple) else (key,)
            call(_norm_key(key_tuple), rows.iloc[at], False)
    no_rows = rows.iloc[0:0]
    for key in current.loc[fired, keys].itertuples(index=False, name=None):
        call(_norm_key(key), no_rows, True)

    result = KeyGroupResult(
        state=pd.DataFrame.from_records(upserts, columns=[*keys, *fields, TIMEOUT]),
        removed=pd.DataFrame.from_records(removed, columns=keys),
    )
    outputs = tuple(
        rows_.to_arrow(f"{where}: output {name!r}")
        for rows_, (name, _) in zip(collected, plan.outputs, strict=True)
    )
    return result, outputs


class _OutputRows:
    """Rows a per-key function returned for one output, collected over a key group."""

    def __init__(self, schema: pa.Schema, time_zone: str) -> None:
        self.schema = schema
        self.time_zone = time_zone
        self.frames: list[pd.DataFrame] = []
        self.records: list[Mapping[str, Any]] = []

    def add(self, rows: Any, what: str) -> None:
        """Add what the function returned for one key, checking its columns."""
        if rows is None:
            return
        if isinstance(rows, pd.DataFrame):
            check_columns(rows, self.schema.names, what)
            self.frames.append(rows)
        elif isinstance(rows, Mapping):
            self._add_record(rows, what)
        elif isinstance(rows, Iterable) and not isinstance(rows, (str, bytes)):
            for row in rows:
                if not isinstance(row, Mapping):
                    raise SchemaMismatchError(
                        f"{what}: returned rows must be dicts, got {type(row).__name__}"
                    )
                self._add_record(row, what)
        else:
            raise SchemaMismatchError(
                f"{what}: returned {type(rows).__name__}; return a DataFrame, a dict (one "
                f"row), a list of dicts, or None"
            )

    def _add_record(self, row: Mapping[str, Any], what: str) -> None:
        if len(row) != len(self.schema) or any(name not in row for name in self.schema.names):
            check_names([str(k) for k in row], self.schema.names, what)
        self.records.append(row)

    def to_arrow(self, what: str) -> pa.Table:
        """All collected rows as one table of the output's schema."""
        frames = list(self.frames)
        if self.records:
            frames.append(pd.DataFrame.from_records(self.records, columns=self.schema.names))
        if not frames:
            return self.schema.empty_table()
        frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        return frame_to_arrow(frame, self.schema, what, self.time_zone)


def _collect_per_key_output(
    plan: OperatorPlan, returned: Any, collected: list[_OutputRows], what: str
) -> None:
    if len(plan.outputs) == 1:
        collected[0].add(returned, f"{what}: output {plan.outputs[0][0]!r}")
        return
    if returned is None:
        return
    names = [name for name, _ in plan.outputs]
    if not isinstance(returned, Mapping) or not set(returned) <= set(names):
        raise SchemaMismatchError(
            f"{what}: an operator with several outputs returns a dict from output name "
            f"({names}) to rows, got {_short(returned)}"
        )
    for name, rows in returned.items():
        collected[names.index(name)].add(rows, f"{what}: output {name!r}")


def _vectorized_outputs(
    plan: OperatorPlan,
    output: pd.DataFrame | Mapping[str, pd.DataFrame] | None,
    where: str,
    converted: _Converted,
) -> tuple[pa.Table, ...]:
    names = [name for name, _ in plan.outputs]
    by_name: Mapping[str, pd.DataFrame | None]
    if output is None:
        by_name = {}
    elif isinstance(output, pd.DataFrame):
        if len(names) != 1:
            raise SchemaMismatchError(
                f"{where}: the operator has outputs {names}; return KeyGroupResult(output="
                f"{{name: frame}}) to say which output a frame belongs to"
            )
        by_name = {names[0]: output}
    elif isinstance(output, Mapping):
        unknown = sorted(set(output) - set(names))
        if unknown:
            raise SchemaMismatchError(
                f"{where}: output(s) {unknown} are not declared; the outputs are {names}"
            )
        by_name = output
    else:
        raise SchemaMismatchError(
            f"{where}: KeyGroupResult.output must be a DataFrame or a dict of DataFrames, "
            f"got {type(output).__name__}"
        )
    tables = []
    for name, schema in plan.outputs:
        frame = by_name.get(name)
        if frame is None:
            tables.append(schema.empty_table())
            continue
        what = f"{where}: output {name!r}"
        check_columns(frame, schema.names, what)
        tables.append(converted(frame, schema, what))
    return tuple(tables)


class _Converted:
    """Frames a function returned, converted to Arrow once even when returned twice.

    A vectorized operator often returns one frame as both new state and output (say, the
    new counts); when the schemas agree, the second conversion is free.
    """

    def __init__(self, time_zone: str) -> None:
        self.time_zone = time_zone
        self._done: dict[int, tuple[pd.DataFrame, pa.Schema, pa.Table]] = {}

    def __call__(self, frame: pd.DataFrame, schema: pa.Schema, what: str) -> pa.Table:
        """``frame_to_arrow(frame, schema, what, time_zone)``, reusing an earlier conversion."""
        done = self._done.get(id(frame))
        if done is not None and done[0] is frame and done[1].equals(schema):
            return done[2]
        table = frame_to_arrow(frame, schema, what, self.time_zone)
        self._done[id(frame)] = (frame, schema, table)
        return table


def _apply_state(
    plan: OperatorPlan,
    state: pa.Table,
    row_keys: pa.Table,
    keys: tuple[KeyArray, KeyArray],
    called: BoolArray,
    result: KeyGroupResult,
    outputs: tuple[pa.Table, ...],
    clock: Clock,
    where: str,
    converted: _Converted,
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

    # Keys the function was called for keep no timeout unless it set one again.
    reset = (
        called
        & ~contains(state_keys, up_keys)
        & ~contains(state_keys, rm_keys)
        & np.asarray(pc.is_valid(state[TIMEOUT]).to_numpy(zero_copy_only=False), dtype=bool)
        if has_timeouts(state)
        else _no_keys(state)
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

    tombstones = _tombstones(plan, removed.filter(gone))
    changes = pa.concat_tables(
        [written.append_column(DELETED, pa.array(np.zeros(written.num_rows, bool))), tombstones]
    )
    return KeyGroupOutcome(
        state=new_state,
        changes=changes,
        outputs=outputs,
        keys_delta=int((~existing).sum()) - int(gone.sum()),
        next_timeout_ms=earliest_timeout(new_state),
    )


def encode_state(plan: OperatorPlan, state: pa.Table, key_group: int, epoch: int | None) -> bytes:
    """Encode a key group's state as the blob kept in Spark's state store.

    Raises:
        StateTooLargeError: The state, as Arrow before compression (what a Python worker
            holds in memory), is larger than the plan's ``max_state_bytes``.
    """
    message = plan.state_codec.message(state)
    bound = plan.max_state_bytes
    if bound is not None and message.size > bound:
        raise StateTooLargeError(
            f"operator {plan.name!r}, epoch {epoch}, key group {key_group}: the key group's "
            f"state is {message.size:,} bytes encoded ({state.num_rows:,} keys), above "
            f"max_key_group_state_bytes={bound:,}; the epoch is not committed. Spread the "
            f"keys over more key groups (raise key_groups; on an existing checkpoint roll "
            f"back to the latest epoch first) or raise max_key_group_state_bytes"
        )
    return plan.state_codec.frame(message)


def earliest_timeout(state: pa.Table) -> int | None:
    """The earliest ``_timeout`` of a key group's state, if any key has one."""
    earliest: int | None = pc.min(state[TIMEOUT]).as_py() if has_timeouts(state) else None
    return earliest


def has_timeouts(state: pa.Table) -> bool:
    """Whether any key of a key group's state (or of its changes) has a ``_timeout``."""
    return state[TIMEOUT].null_count < state.num_rows


def _no_keys(state: pa.Table) -> BoolArray:
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
    plan: OperatorPlan, frame: pd.DataFrame | None, where: str, converted: _Converted
) -> pa.Table:
    if frame is None:
        return plan.blob_schema.empty_table()
    what = f"{where}: returned state"
    check_columns(frame, plan.upsert_schema.names, what, optional=[TIMEOUT])
    if TIMEOUT in frame.columns:
        return converted(frame, plan.blob_schema, what)
    table = converted(frame, plan.upsert_schema, what)
    return table.append_column(plan.blob_schema.field(TIMEOUT), pa.nulls(len(frame), pa.int64()))


def _removed_table(plan: OperatorPlan, frame: pd.DataFrame | None, where: str) -> pa.Table:
    if frame is None:
        return plan.key_schema.empty_table()
    what = f"{where}: removed keys"
    check_columns(frame, plan.key_columns, what)
    return plan.to_arrow(frame, plan.key_schema, what)


def _tombstones(plan: OperatorPlan, keys: pa.Table) -> pa.Table:
    n = keys.num_rows
    arrays: list[Any] = [keys[k] for k in plan.key_columns]
    arrays += [pa.nulls(n, f.type) for f in plan.state_schema]
    arrays += [pa.nulls(n, pa.int64()), pa.array(np.ones(n, dtype=bool))]
    return pa.Table.from_arrays(arrays, schema=plan.change_schema)


def _check_timeouts(plan: OperatorPlan, upserts: pa.Table, clock: Clock, where: str) -> None:
    if not has_timeouts(upserts):
        return
    set_ = upserts.filter(pc.is_valid(upserts[TIMEOUT]))
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


def _expired(plan: OperatorPlan, state: pa.Table, has_rows: BoolArray, clock: Clock) -> BoolArray:
    """Keys whose timeout fires now: set, below the threshold, and without rows."""
    none = np.zeros(state.num_rows, dtype=bool)
    if plan.timeout is TimeoutMode.NONE or not state.num_rows:
        return none
    threshold = (
        clock.watermark_ms if plan.timeout is TimeoutMode.EVENT_TIME else clock.processing_time_ms
    )
    if threshold is None:
        return none
    timeouts = state[TIMEOUT].to_numpy()
    due = np.nan_to_num(timeouts, nan=np.inf) < threshold
    return np.asarray(due, dtype=bool) & ~has_rows


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
    if pa.types.is_nested(kind) or pa.types.is_dictionary(kind):
        return np.array([x == y for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)])
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    equal = pc.fill_null(pc.equal(a, b), False)
    if pa.types.is_floating(kind):
        equal = pc.or_(equal, pc.and_(pc.is_nan(a), pc.is_nan(b)))
    return np.asarray(pc.fill_null(pc.or_(equal, both_null), False).to_numpy(zero_copy_only=False))


def _arrow_keys(rows: pd.DataFrame, plan: OperatorPlan, where: str) -> pa.Table:
    """The rows' key columns with the key schema's types, for exact key matching."""
    if not len(rows):
        return plan.key_schema.empty_table()
    return plan.to_arrow(rows, plan.key_schema, f"{where}: input key columns")


def _norm_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """Key tuples that compare equal whatever their source: NaN and NA become None."""
    return tuple(None if _is_missing(v) else v for v in key)


def _is_missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _ms_or_none(value: Any) -> int | None:
    return None if _is_missing(value) else int(value)


def _located(err: AbsError, where: str) -> AbsError:
    """A pyspark-abs error the function raised (e.g. from ``KeyState``), with where it was."""
    return type(err)(f"{where}: {err}")


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}".replace("\n", " ")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _few(table: pa.Table, mask: BoolArray, columns: tuple[str, ...]) -> str:
    """Up to five keys of the masked rows, as tuples."""
    picked = table.filter(mask).select(list(columns))
    keys = list(zip(*(picked.column(c).to_pylist() for c in columns), strict=True))
    more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
    return f"{keys[:5]}{more}"


def current_epoch() -> int | None:
    """The epoch (micro-batch id) of the running Spark task, if it is a streaming task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    value = context.getLocalProperty("streaming.sql.batchId") if context else None
    return int(value) if value is not None else None


class KeyGroupTask:
    """The function Spark's ``applyInPandasWithState`` calls once per key group and epoch."""

    def __init__(self, plan: OperatorPlan) -> None:
        self.plan = plan

    def __call__(
        self, key: tuple[Any, ...], frames: Iterator[pd.DataFrame], group_state: GroupState
    ) -> Iterator[pd.DataFrame]:
        """Run the key group and yield its envelope rows."""
        plan = self.plan
        key_group = int(key[0])
        chunks = [f for f in frames if len(f)]
        if chunks:
            rows = chunks[0] if len(chunks) == 1 else pd.concat(chunks, ignore_index=True)
            rows = plan.without_late_rows(_without(rows, KEY_GROUP))
            inputs = [c for c in plan.input_instants if c in rows.columns]
            rows = localize(rows, inputs, plan.time_zone)
        else:
            rows = plan.frame(plan.input_schema.empty_table())
        restored = None
        if RESTORE in rows.columns:
            restored, rows = _split_restore(plan, rows, key_group, group_state.exists)
        if restored is not None:
            state = restored
        elif group_state.exists:
            state = plan.state_codec.decode(group_state.get[0])
        else:
            state = plan.blob_schema.empty_table()
        clock = Clock(
            group_state.getCurrentProcessingTimeMs(), plan.watermark(_watermark(group_state))
        )
        if restored is not None and not len(rows):
            # Only restore rows: install the key group's state; the function runs on data.
            group_state.update((encode_state(plan, state, key_group, current_epoch()),))
            _set_timeout(plan, group_state, earliest_timeout(state), clock)
            return
        epoch = current_epoch()
        replay = plan.replay_of(epoch)
        if replay is not None:
            yield from _install_decided(plan, replay, key_group, state, group_state, clock)
            return
        outcome = run_key_group(plan, key_group, rows, state, clock, epoch)

        if not outcome.state.num_rows:
            if group_state.exists:
                group_state.remove()
        elif outcome.changes.num_rows or restored is not None:
            group_state.update((encode_state(plan, outcome.state, key_group, epoch),))
        _set_timeout(plan, group_state, outcome.next_timeout_ms, clock)

        changes = None
        if plan.snapshots and outcome.changes.num_rows:
            changes = (outcome.changes, plan.change_codec.encode(outcome.changes))
        outputs = [
            (i, table, plan.output_codecs[i].encode(table))
            for i, table in enumerate(outcome.outputs)
            if table.num_rows
        ]
        if changes is not None or outputs:
            yield envelope_frame(key_group, changes, outcome.keys_delta, outputs)


def _install_decided(
    plan: OperatorPlan,
    replay: DecidedReplay,
    key_group: int,
    state: pa.Table,
    group_state: GroupState,
    clock: Clock,
) -> Iterator[pd.DataFrame]:
    """Give the key group the state its decided epoch committed, not a recomputed one.

    Yields one envelope row naming the key group when it had decided changes, so that the
    coordinator can tell every changed key group was reached.
    """
    changes = decided_changes(plan, replay, key_group)
    installed = apply_changes(plan, state, changes)
    if installed.num_rows:
        group_state.update((encode_state(plan, installed, key_group, replay.epoch),))
    elif group_state.exists:
        group_state.remove()
    _set_timeout(plan, group_state, earliest_timeout(installed), clock)
    if changes.num_rows:
        yield envelope_frame(key_group, (changes, b""), 0, [])


_DECIDED: dict[tuple[str, ...], pa.Table] = {}
"""The state changes of the decided epoch being replayed, read once per Python worker."""


def decided_changes(plan: OperatorPlan, replay: DecidedReplay, key_group: int) -> pa.Table:
    """The state changes ``replay``'s epoch decided for ``key_group`` (change schema).

    Raises:
        OperatorError: The epoch's files cannot be read (e.g. vacuumed).
    """
    changes = _DECIDED.get(replay.files)
    if changes is None:
        columns = [*plan.change_schema.names, KEY_GROUP]
        try:
            changes = (
                pq.read_table(list(replay.files), columns=columns)
                if replay.files
                else plan.change_schema.append(pa.field(KEY_GROUP, pa.int32())).empty_table()
            )
        except (OSError, pa.ArrowException) as err:
            raise OperatorError(
                f"operator {plan.name!r}: Spark replays epoch {replay.epoch}, which is already "
                f"decided, but its state changes cannot be read ({err}). Roll back to the "
                f"newest intact snapshot with pyspark_abs.rollback and start again"
            ) from err
        _DECIDED.clear()
        _DECIDED[replay.files] = changes
    mine = pc.equal(changes[KEY_GROUP], pa.scalar(key_group, pa.int32()))
    return changes.filter(mine).select(plan.change_schema.names).cast(plan.change_schema)


def apply_changes(plan: OperatorPlan, state: pa.Table, changes: pa.Table) -> pa.Table:
    """A key group's state (blob schema) after one epoch's changes (change schema)."""
    if not changes.num_rows:
        return state
    state_keys, changed_keys = key_arrays([state, changes], plan.key_columns)
    kept = state.filter(~contains(state_keys, changed_keys))
    deleted = np.asarray(changes[DELETED].to_numpy(zero_copy_only=False), dtype=object)
    live = changes.filter(pa.array(deleted != True))  # noqa: E712 (null counts as live)
    return pa.concat_tables([kept, live.select(plan.blob_schema.names).cast(plan.blob_schema)])


def _without(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """``frame`` without ``column``, sharing the other columns (``drop`` copies them)."""
    return pd.DataFrame({c: frame[c] for c in frame.columns if c != column}, copy=False)


def _split_restore(
    plan: OperatorPlan, rows: pd.DataFrame, key_group: int, has_state: bool
) -> tuple[pa.Table | None, pd.DataFrame]:
    """Separate restore rows (a restored key's state) from data rows."""
    is_restore = rows[RESTORE].notna().to_numpy()
    data = rows[~is_restore].drop(columns=[RESTORE]).reset_index(drop=True)
    if not is_restore.any():
        return None, data
    if has_state:
        raise AbsError(
            f"operator {plan.name!r}, epoch {current_epoch()}, key group {key_group}: restore "
            f"rows arrived for a key group that already has state; restore epochs are applied "
            f"only in the first micro-batch of a new checkpoint"
        )
    picked = rows[is_restore]
    values = pd.DataFrame(picked[RESTORE].tolist(), index=picked.index)
    values = localize(values, instant_columns(plan.state_schema), plan.time_zone)
    frame = pd.concat([picked[list(plan.key_columns)], values], axis=1)
    return plan.to_arrow(frame, plan.blob_schema, f"restored state of key group {key_group}"), data


def _set_timeout(
    plan: OperatorPlan, group_state: GroupState, timeout_ms: int | None, clock: Clock
) -> None:
    """Ask Spark to call the key group again when its earliest timeout is due."""
    if timeout_ms is None:
        return
    if plan.timeout is TimeoutMode.EVENT_TIME:
        group_state.setTimeoutTimestamp(timeout_ms)
    elif plan.timeout is TimeoutMode.PROCESSING_TIME:
        group_state.setTimeoutDuration(max(1, timeout_ms - clock.processing_time_ms))


def _watermark(group_state: GroupState) -> int | None:
    try:
        return int(group_state.getCurrentWatermarkMs())
    except Exception:
        return None
