"""Running the operator's key-group function on one key group and checking what it returns."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pyspark_abs.errors import AbsError, OperatorError, SchemaMismatchError, describe
from pyspark_abs.operators.contract import (
    ArrowContext,
    ArrowKeyGroupFunction,
    Clock,
    KeyGroupContext,
    KeyGroupFunction,
    KeyGroupResult,
    Rows,
    place,
)
from pyspark_abs.operators.keys import (
    IntArray,
    KeyArray,
    contains,
    key_arrays,
)
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.schema import (
    check_columns,
    declared_nulls,
    frame_to_arrow,
    in_time_zone,
)
from pyspark_abs.operators.state_diff import (
    Converted,
    KeyGroupOutcome,
    apply_state,
    earliest_timeout,
    expired,
    has_timeouts,
    no_keys,
    tombstones,
)
from pyspark_abs.operators.ttl import event_times_ms, lapsed


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
    return _run(plan, (key_group,), rows, state, clock, epoch)[0]


def run_key_groups(
    plan: OperatorPlan,
    key_groups: Sequence[int],
    sizes: Sequence[int],
    rows: pd.DataFrame,
    row_groups: IntArray,
    state: pa.Table,
    clock: Clock,
    epoch: int | None,
) -> tuple[tuple[pa.Table, ...], list[KeyGroupOutcome]]:
    """Run the operator once on several key groups together, and split what changed.

    One call of the function serves them all; each key group still gets its own state,
    changes and timeout, as if it had been called alone.

    Args:
        plan: The operator.
        key_groups: The key groups, in the order their states are concatenated in ``state``.
        sizes: How many rows of ``state`` each key group's state has.
        rows: Their input rows of this epoch (possibly none).
        row_groups: The key group of each row.
        state: The key groups' current states, one after the other (blob schema).
        clock: The epoch's processing time and watermark.
        epoch: The epoch, for messages and the function's context.

    Returns:
        The call's output tables, and each key group's outcome (without outputs).

    Raises:
        As :func:`run_key_group`.
    """
    outcome, row_keys = _run(plan, key_groups, rows, state, clock, epoch)
    state = state.combine_chunks()
    ends = np.cumsum([0, *sizes])
    columns = list(plan.key_columns)
    known = pa.concat_tables([state.select(columns), row_keys.select(columns)])
    known_groups = np.concatenate([np.repeat(np.asarray(key_groups), sizes), row_groups])
    fresh = outcome.state.slice(int(outcome.kept.sum()))
    known_keys, fresh_keys, changed_keys = key_arrays(
        [known, fresh.select(columns), outcome.changes.select(columns)], columns
    )
    fresh_groups = known_groups[_first_at(fresh_keys, known_keys)]
    changed_groups = known_groups[_first_at(changed_keys, known_keys)]
    outcomes = []
    for at, key_group in enumerate(key_groups):
        start, end = int(ends[at]), int(ends[at + 1])
        kept = outcome.kept[start:end]
        own = state.slice(start, end - start).filter(kept)
        new_state = pa.concat_tables([own, fresh.filter(fresh_groups == key_group)])
        outcomes.append(
            KeyGroupOutcome(
                state=new_state,
                kept=kept,
                changes=outcome.changes.filter(changed_groups == key_group),
                outputs=(),
                keys_delta=new_state.num_rows - (end - start),
                next_timeout_ms=earliest_timeout(new_state),
            )
        )
    return outcome.outputs, outcomes


def _first_at(keys: KeyArray, among: KeyArray) -> IntArray:
    """For each key, the first row of ``among`` holding it (every key is there)."""
    found: Any = pc.index_in(keys, value_set=among)
    return np.asarray(found.to_numpy(zero_copy_only=False), dtype=np.int64)


def _run(
    plan: OperatorPlan,
    key_groups: Sequence[int],
    rows: pd.DataFrame,
    state: pa.Table,
    clock: Clock,
    epoch: int | None,
) -> tuple[KeyGroupOutcome, pa.Table]:
    """:func:`run_key_group` over one or several key groups; also the rows' keys."""
    where = place(plan.name, epoch, key_groups)
    key_group = key_groups[0]
    # Arrow gathers rows from a chunked column by concatenating its chunks first, on every
    # gather: one chunk here (a chain read or a rebuild gives several) saves each a copy.
    state = state.combine_chunks()
    gone = lapsed(plan, state, clock)
    expired_state = state.filter(gone) if gone.any() else None
    if expired_state is not None:
        state = state.filter(~gone)  # the function no longer sees expired keys
    table = _arrow_rows(rows, plan, where) if plan.arrow else None
    if table is None:
        row_keys = _arrow_keys(rows, plan, where)
    else:
        row_keys = table.select(list(plan.key_columns)).cast(plan.key_schema)
    state_keys, input_keys = key_arrays([state, row_keys], plan.key_columns)
    # Which keys the function is called for matters only for keys with a timeout.
    timeouts = has_timeouts(state)
    has_rows = contains(state_keys, input_keys) if timeouts else no_keys(state)
    fired = expired(plan, state, has_rows, clock) if timeouts else has_rows
    timed_out = state.filter(fired).select(list(plan.key_columns)) if fired.any() else None
    call = (plan.name, epoch, key_group, clock)
    several = tuple(key_groups) if len(key_groups) > 1 else ()
    declared = tuple((name, tuple(schema.names)) for name, schema in plan.outputs)
    run: Callable[[], object]
    if table is not None:
        keys = plan.key_schema.empty_table() if timed_out is None else timed_out
        zone = plan.time_zone
        arrow_fn = cast("ArrowKeyGroupFunction", plan.function)
        arrow_ctx = ArrowContext(*call, in_time_zone(keys, zone), zone, declared, several)
        run = partial(arrow_fn, in_time_zone(table, zone), in_time_zone(state, zone), arrow_ctx)
    else:
        frame = plan.no_keys.copy(deep=False) if timed_out is None else plan.frame(timed_out)
        pandas_fn = cast("KeyGroupFunction", plan.function)
        ctx = KeyGroupContext(*call, frame, plan.time_zone, declared, several)
        run = partial(pandas_fn, rows, plan.frame(state), ctx)
    try:
        result = run()
    except AbsError as err:
        located = err.at(where)
        if located is err:
            raise
        raise located from err
    except Exception as err:
        raise OperatorError(f"{where}: the function raised {describe(err)}") from err
    if result is None:
        result = KeyGroupResult()
    elif not isinstance(result, KeyGroupResult):
        raise SchemaMismatchError(
            f"{where}: the function returned {type(result).__name__}; a vectorized "
            f"operator returns a KeyGroupResult (or None)"
        )
    converted = Converted(plan.time_zone)
    outputs = _outputs(plan, result.output, where, converted)

    called = has_rows | fired
    outcome = apply_state(
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
        event_times_ms(plan, rows),
    )
    if expired_state is None:
        return outcome, row_keys
    kept = np.zeros(len(gone), dtype=bool)
    kept[~gone] = outcome.kept
    return _with_expired(plan, replace(outcome, kept=kept), expired_state), row_keys


def _with_expired(
    plan: OperatorPlan, outcome: KeyGroupOutcome, expired_state: pa.Table
) -> KeyGroupOutcome:
    """``outcome`` with tombstones for the expired keys the function did not write anew."""
    expired_keys = expired_state.select(list(plan.key_columns))
    gone, written = key_arrays([expired_keys, outcome.changes], plan.key_columns)
    removed = expired_keys.filter(~contains(gone, written))
    changes = pa.concat_tables([outcome.changes, tombstones(plan, removed)])
    return replace(outcome, changes=changes, keys_delta=outcome.keys_delta - expired_state.num_rows)


def _outputs(
    plan: OperatorPlan,
    output: Rows | Mapping[str, Rows] | None,
    where: str,
    converted: Converted,
) -> tuple[pa.Table, ...]:
    names = [name for name, _ in plan.outputs]
    by_name: Mapping[str, Rows | None]
    if output is None:
        by_name = {}
    elif isinstance(output, pd.DataFrame | pa.Table):
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
            f"{where}: KeyGroupResult.output must be a DataFrame or a pyarrow.Table, or a dict "
            f"of them, got {type(output).__name__}"
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


def _arrow_rows(rows: pd.DataFrame, plan: OperatorPlan, where: str) -> pa.Table:
    """The input rows as an Arrow function gets them: the source's schema.

    In a float column a null and a NaN both arrive as null: PySpark's pandas form of the
    rows, which the carrier hands over, no longer tells them apart. Inside arrays, maps and
    structs it still does, and so does the function.
    """
    schema = plan.input_schema
    if not len(rows):
        return schema.empty_table()
    what = f"{where}: input rows"
    micros = [
        f for f in schema if f.name in plan.input_instants and rows[f.name].dtype.kind in "iuf"
    ]
    if not micros:
        return frame_to_arrow(rows, schema, what, plan.time_zone, nan_is_null=False)
    # instants as Spark sends them (microseconds since the epoch) become timestamps directly
    others = pa.schema([f for f in schema if f not in micros])
    table = frame_to_arrow(rows, others, what, plan.time_zone, nan_is_null=False)
    for field in micros:
        values = pa.array(rows[field.name], from_pandas=True).cast(pa.int64())
        at = schema.get_field_index(field.name)
        table = table.add_column(at, field, declared_nulls(field, values.cast(field.type), what))
    return table


def _arrow_keys(rows: pd.DataFrame, plan: OperatorPlan, where: str) -> pa.Table:
    """The rows' key columns with the key schema's types, for exact key matching."""
    if not len(rows):
        return plan.key_schema.empty_table()
    return plan.to_arrow(rows, plan.key_schema, f"{where}: input key columns")
