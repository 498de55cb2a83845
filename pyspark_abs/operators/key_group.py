"""Running the operator on one key group: the key-group function, or the per-key adapter."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd
import pyarrow as pa

from pyspark_abs.errors import (
    AbsError,
    OperatorError,
    SchemaMismatchError,
)
from pyspark_abs.operators.contract import (
    Clock,
    KeyGroupContext,
    KeyGroupResult,
    KeyState,
)
from pyspark_abs.operators.keys import (
    BoolArray,
    contains,
    key_arrays,
)
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.schema import (
    TIMEOUT,
    check_columns,
    check_names,
    frame_to_arrow,
)
from pyspark_abs.operators.state_diff import (
    Converted,
    KeyGroupOutcome,
    apply_state,
    expired,
    has_timeouts,
    no_keys,
)


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
    has_rows = contains(state_keys, input_keys) if timeouts else no_keys(state)
    fired = expired(plan, state, has_rows, clock) if timeouts else has_rows

    converted = Converted(plan.time_zone)
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
    return apply_state(
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
    converted: Converted,
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
