"""State time-to-live: which keys have expired, and the expiry each write of a key sets.

An operator with a TTL keeps each key's expiry in its ``_timeout`` column, so the expiry is
in every snapshot (restore and rollback keep the clocks) and Spark calls an idle key group
again when its earliest key expires. A key whose expiry is before the TTL clock (the
micro-batch's processing time, or the watermark) is removed before the function runs.
Each write sets the expiry to the clock of the write plus the TTL: the processing time, or
for event time the key's newest event in the epoch (never below the watermark).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from pyspark_abs.operators.contract import Clock, TimeoutMode
from pyspark_abs.operators.keys import BoolArray, IntArray, KeyArray, positions
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.schema import TIMEOUT
from pyspark_abs.operators.timers import clock_now


def threshold(plan: OperatorPlan, clock: Clock) -> int | None:
    """The clock ``_timeout`` values are compared with: the watermark or processing time."""
    return clock_now(plan.timeout, clock)


def due(plan: OperatorPlan, state: pa.Table, clock: Clock) -> BoolArray:
    """Keys whose ``_timeout`` the clock of the operator's timeout mode has passed.

    For timers: reached (at or after their time, as in Spark's ``transformWithState``).
    """
    now = threshold(plan, clock)
    if plan.timeout is TimeoutMode.NONE or now is None or not state.num_rows:
        return np.zeros(state.num_rows, dtype=bool)
    timeouts = np.nan_to_num(
        state[TIMEOUT].to_numpy(zero_copy_only=False).astype(float), nan=np.inf
    )
    return np.asarray(timeouts <= now if plan.has_timers else timeouts < now, dtype=bool)


def lapsed(plan: OperatorPlan, state: pa.Table, clock: Clock) -> BoolArray:
    """Keys whose state has expired (none without a TTL)."""
    if plan.ttl_ms is None:
        return np.zeros(state.num_rows, dtype=bool)
    return due(plan, state, clock)


def event_times_ms(plan: OperatorPlan, rows: pd.DataFrame) -> IntArray | None:
    """Each input row's event time in ms, for an event-time TTL (None otherwise)."""
    column = plan.event_time
    if plan.ttl_ms is None or plan.timeout is not TimeoutMode.EVENT_TIME or column is None:
        return None
    if not len(rows):
        return np.zeros(0, dtype=np.int64)
    values = rows[column]
    if values.dtype.kind == "M":
        utc = values.dt.tz_convert("UTC") if values.dt.tz is not None else values
        millis = (utc - pd.Timestamp(0, tz=utc.dt.tz)) / pd.Timedelta(milliseconds=1)
    else:
        millis = values.astype("float64") / 1000  # microseconds
    # a row without an event time counts as the watermark (see expiries)
    return np.asarray(millis.fillna(np.iinfo(np.int64).min // 2).to_numpy(), dtype=np.int64)


def expiries(
    plan: OperatorPlan,
    written: KeyArray,
    input_keys: KeyArray,
    row_times_ms: IntArray | None,
    clock: Clock,
) -> pa.Int64Array:
    """The expiry of each key written in this call.

    Args:
        plan: The operator (with a TTL).
        written: Keys of the written state.
        input_keys: Keys of the call's input rows, comparable with ``written``.
        row_times_ms: Event time of each input row (event-time TTL), else None.
        clock: The epoch's clocks.
    """
    assert plan.ttl_ms is not None
    base = np.full(len(written), threshold(plan, clock) or 0, dtype=np.int64)
    if row_times_ms is not None and len(row_times_ms) and len(written):
        order = np.argsort(-row_times_ms, kind="stable")
        at = positions(written, input_keys.take(pa.array(order)))
        found = at >= 0
        base[found] = np.maximum(base[found], row_times_ms[order][at[found]])
    return pa.array(base + plan.ttl_ms, pa.int64())
