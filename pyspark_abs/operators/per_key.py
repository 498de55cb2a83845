"""The per-key form of an operator: ``fn(key, rows, state) -> rows``, adapted to a key group.

:func:`operator` declares it; :class:`PerKeyAdapter` is the key-group function it produces,
which calls ``fn`` once for every key with rows in the epoch and every key whose timeout
fired, each with its :class:`KeyState`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeAlias, Unpack

import pandas as pd

from pyspark_abs.errors import (
    AbsError,
    InvalidTimeoutError,
    OperatorError,
    describe,
)
from pyspark_abs.operators.contract import (
    KeyGroupContext,
    KeyGroupResult,
    Operator,
    OperatorOptions,
    TimeoutMode,
    declare,
)
from pyspark_abs.operators.key_state import KeyState
from pyspark_abs.operators.outputs import OutputRows, collect
from pyspark_abs.operators.schema import (
    TIMEOUT,
    TIMERS,
    object_frame,
    python_value,
)
from pyspark_abs.operators.timers import (
    Timers,
    check_timers,
    clock_now,
    split_due,
    stored_timers,
    with_timers,
)

PerKeyFunction: TypeAlias = "Callable[[tuple[Any, ...], pd.DataFrame, KeyState], Any]"


def operator(
    *, timers: bool = False, **options: Unpack[OperatorOptions]
) -> Callable[[PerKeyFunction], Operator]:
    """Declare a per-key operator: ``fn(key, rows, state)``.

    The function gets the key as a tuple, the key's rows of this epoch as a pandas frame,
    and its :class:`KeyState`. It returns the key's output rows (a frame, a dict for one
    row, a list of dicts, or None); for an operator with several ``outputs``, a dict from
    output name to such rows.

    Example::

        @operator(key="word", state_schema="count long",
                  output_schema="word string, count long")
        def word_count(key, rows, state):
            count = state.get({"count": 0})["count"] + len(rows)
            state.update({"count": count})
            return {"word": key[0], "count": count}

    The arguments are those of :func:`~pyspark_abs.operators.contract.vectorized_operator`
    (see :class:`~pyspark_abs.operators.contract.OperatorOptions`), and ``timers=True``: keep
    several timers per key (:meth:`KeyState.register_timer`) on
    the clock ``timeout`` names, in the state column ``_timers``, instead of one timeout.

    Raises:
        OperatorDefinitionError: The declaration is inconsistent.
    """

    def build(fn: PerKeyFunction) -> Operator:
        declared = declare(fn, options)  # checked, then wrapped below
        # with a TTL, the timeouts are the expiries: KeyState offers none
        timeouts = TimeoutMode.NONE if declared.ttl_ms is not None else declared.timeout
        adapter = PerKeyAdapter(fn, declared.key, timeouts, timers=timers)
        if timers:
            check_timers(declared, options.get("state_schema"))
            state = with_timers(declared.name, options.get("state_schema"))  # type: ignore[arg-type]
            return replace(declared, state_schema=state, function=adapter)
        return replace(declared, function=adapter)

    return build


class PerKeyAdapter:
    """The key-group function of an operator declared per key.

    Attributes:
        function: The per-key function.
        key: The key columns.
        timeout: The clock key timeouts (or timers) follow.
        timers: Whether each key keeps several timers in ``_timers``.
    """

    def __init__(
        self,
        function: PerKeyFunction,
        key: tuple[str, ...],
        timeout: TimeoutMode,
        *,
        timers: bool = False,
    ) -> None:
        self.function = function
        self.key = key
        self.timeout = timeout
        self.timers = timers

    def __call__(
        self, rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext
    ) -> KeyGroupResult:
        """Call the per-key function for every key with rows and every timed-out key."""
        keys = list(self.key)
        timer_columns = [TIMERS] if self.timers else []
        fields = [
            c for c in state.columns if c not in self.key and c not in (TIMEOUT, *timer_columns)
        ]
        existing: dict[tuple[Any, ...], int] = {
            _norm_key(k): i for i, k in enumerate(state[keys].itertuples(index=False, name=None))
        }
        values = [
            {str(f): python_value(v) for f, v in value.items()}
            for value in state[fields].to_dict("records")
        ]
        timeouts = state[TIMEOUT].tolist()
        stored = state[TIMERS].tolist() if self.timers else []
        now = clock_now(self.timeout, ctx.clock)
        upserts: list[dict[str, Any]] = []
        removed: list[tuple[Any, ...]] = []
        collected = {name: OutputRows(columns) for name, columns in ctx.outputs}
        no_rows = rows.iloc[0:0]

        def call(key: tuple[Any, ...], key_rows: pd.DataFrame, timed_out: bool) -> None:
            where = f"{ctx.where}, key {key!r}"
            position = existing.get(key)
            value = None if position is None else values[position]
            fired: list[int] = []
            pending: list[int] = []
            if self.timers and position is not None:
                fired, pending = split_due(stored_timers(stored[position], timeouts[position]), now)
            written = False
            for _ in range(_TIMER_CALLS):
                timers = Timers(key, pending, fired) if self.timers else None
                handle = KeyState(
                    key,
                    fields,
                    value,
                    timeout_mode=self.timeout,
                    clock=ctx.clock,
                    time_zone=ctx.time_zone,
                    has_timed_out=timed_out,
                    timeout_ms=None if position is None else _ms_or_none(timeouts[position]),
                    timers=timers,
                )
                try:
                    returned = self.function(key, key_rows, handle)
                except AbsError as err:
                    raise err.at(where) from err
                except Exception as err:
                    raise OperatorError(f"{where}: the function raised {describe(err)}") from err
                collect(returned, collected, where)
                value = handle.get() if handle.exists else None
                written = written or handle.updated
                # timers the call registered at or before the clock fire right after it
                fired, pending = split_due([] if timers is None else timers.pending(), now)
                if not fired:
                    break
                key_rows, timed_out = no_rows, True
            else:
                raise InvalidTimeoutError(
                    f"{where}: the function registered timers at or before the clock ({now} "
                    f"ms) in each of {_TIMER_CALLS} calls in a row; register later times"
                )
            if handle.removed:
                removed.append(key)
            elif value is not None and (
                written or self.timers or handle.new_timeout_ms is not None
            ):
                # a key only read keeps its row: a TTL's expiry restarts on a write alone, and
                # a timeout not set again is cleared by the call (see apply_state)
                row = dict(zip(keys, key, strict=True))
                row.update(value)
                if self.timers:
                    row[TIMERS] = pending
                row[TIMEOUT] = pending[0] if pending else handle.new_timeout_ms
                upserts.append(row)
            elif pending:
                raise InvalidTimeoutError(
                    f"{where}: the function registered timers {pending} for a key without "
                    f"state; call state.update(...) so they have a row to live in"
                )

        if len(rows):
            groups = rows.groupby(keys, sort=False, dropna=False).indices
            for key, at in groups.items():
                call(_norm_key(key if isinstance(key, tuple) else (key,)), rows.iloc[at], False)
        for key in ctx.timed_out[keys].itertuples(index=False, name=None):
            call(_norm_key(key), no_rows, True)

        return KeyGroupResult(
            state=object_frame(upserts, [*keys, *fields, *timer_columns, TIMEOUT]),
            removed=object_frame([dict(zip(keys, k, strict=True)) for k in removed], keys),
            output={
                name: frame
                for name, rows_ in collected.items()
                if (frame := rows_.frame()) is not None
            },
        )


_TIMER_CALLS = 100
"""The most calls of one key in one micro-batch: its rows, then its timers due at once."""


def _norm_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """Key tuples that compare equal whatever their source: NaN and NA become None."""
    return tuple(None if _is_missing(v) else v for v in key)


def _is_missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _ms_or_none(value: Any) -> int | None:
    return None if _is_missing(value) else int(value)
