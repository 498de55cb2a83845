"""Several timers per key, for a per-key operator declared with ``timers=True``.

A key's timers live in its state row, in the column ``_timers`` (sorted ms since the Unix
epoch), and its ``_timeout`` is the earliest of them: Spark calls the key's group when that
one passes, and snapshots, rollback, restore, rescaling and migration carry the timers as
they carry any state column. As in Spark's ``transformWithState``, a timer fires once the
clock has reached it (at or after its time), in the same micro-batch as the rows: a key's
due timers arrive with its rows, and a timer the call registers at or before the clock fires
in a call of its own right after it. Then it is gone.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from typing import Any, TypeAlias

import numpy as np
import pandas as pd
from pyspark.sql.types import ArrayType, LongType, StructField, StructType

from pyspark_abs.errors import InvalidTimeoutError, OperatorDefinitionError
from pyspark_abs.operators.contract import Clock, Operator, TimeoutMode
from pyspark_abs.operators.schema import TIMERS, SchemaLike

Millis: TypeAlias = int | np.integer[Any]
"""Milliseconds since the Unix epoch, or a duration in ms: a Python or a NumPy integer."""

TIMERS_FIELD = StructField(TIMERS, ArrayType(LongType()), True)


def with_timers(name: str, state_schema: SchemaLike) -> SchemaLike:
    """``state_schema`` with the ``_timers`` column appended.

    Raises:
        OperatorDefinitionError: The state schema already has a ``_timers`` column.
    """
    if isinstance(state_schema, StructType):
        if TIMERS in state_schema.names:
            raise OperatorDefinitionError(
                f"operator {name!r}: the state column {TIMERS!r} is where timers=True keeps "
                f"the key's timers; rename your column"
            )
        return StructType([*state_schema.fields, TIMERS_FIELD])
    return f"{state_schema}, {TIMERS} array<bigint>"


def check_timers(declared: Operator, state_schema: SchemaLike | None) -> None:
    """Refuse ``timers=True`` where it has no clock or no state to live in.

    Raises:
        OperatorDefinitionError: The operator has a TTL, no timeout clock or no state.
    """
    where = f"operator {declared.name!r}: timers=True"
    if declared.ttl_ms is not None:
        raise OperatorDefinitionError(
            f"{where} cannot be combined with ttl= (a TTL keeps each key's expiry as its "
            f"timer); drop one of them"
        )
    if declared.timeout is TimeoutMode.NONE:
        raise OperatorDefinitionError(
            f"{where} needs a clock: declare timeout='event_time' or 'processing_time'"
        )
    if state_schema is None:  # declare refuses a stateless operator with a timeout first
        raise OperatorDefinitionError(f"{where} needs a state_schema: timers live in state")


def stored_timers(timers: Any, timeout: Any) -> list[int]:
    """A key's timers as stored: its ``_timers``, or its ``_timeout`` alone.

    A key written by a version of the operator without timers has no ``_timers``; its one
    timeout, if any, becomes its one timer.
    """
    if timers is not None and not (isinstance(timers, float) and math.isnan(timers)):
        return sorted({int(t) for t in timers})
    if timeout is None or timeout is pd.NA or (isinstance(timeout, float) and math.isnan(timeout)):
        return []
    return [int(timeout)]


def clock_now(mode: TimeoutMode, clock: Clock) -> int | None:
    """The time timeouts of ``mode`` are compared with: the watermark or processing time."""
    if mode is TimeoutMode.EVENT_TIME:
        return clock.watermark_ms
    return clock.processing_time_ms


def split_due(timers: Iterable[int], now: int | None) -> tuple[list[int], list[int]]:
    """The timers that fire at clock ``now`` (at or before it), and those left pending."""
    ordered = sorted(timers)
    if now is None:
        return [], ordered
    return [t for t in ordered if t <= now], [t for t in ordered if t > now]


def to_epoch_ms(value: Millis | dt.datetime, time_zone: str) -> int:
    """Milliseconds since the Unix epoch of an integer (also NumPy's) or a datetime.

    A naive datetime is a wall-clock time in ``time_zone``.

    Raises:
        InvalidTimeoutError: ``value`` is neither, or a naive datetime that names no single
            instant in ``time_zone`` (a daylight-saving change).
    """
    if isinstance(value, dt.datetime):
        stamp = pd.Timestamp(value)
        if stamp.tzinfo is None:
            try:
                stamp = stamp.tz_localize(time_zone)
            except Exception as err:  # pytz's AmbiguousTimeError and NonExistentTimeError
                raise InvalidTimeoutError(
                    f"the naive datetime {value} names no single instant in the session time "
                    f"zone {time_zone} ({err}); pass an aware datetime"
                ) from None
        return int(stamp.value // 1_000_000)
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidTimeoutError(f"a timeout must be an int (ms) or a datetime, got {value!r}")
    return int(value)


class Timers:
    """One key's timers during a call: those pending, and those that fired for this call."""

    def __init__(self, key: tuple[Any, ...], pending: list[int], fired: list[int]) -> None:
        self._key = key
        self._pending = set(pending)
        self.fired = tuple(fired)

    def register(self, ms: int) -> None:
        """Add a timer at ``ms``; registering one twice keeps one.

        One at or before the clock fires right after the call.
        """
        self._pending.add(ms)

    def delete(self, ms: int) -> None:
        """Drop the timer at ``ms``, if the key has one."""
        self._pending.discard(ms)

    def clear(self) -> None:
        """Drop every pending timer (the key's state is removed)."""
        self._pending.clear()

    def pending(self) -> list[int]:
        """The pending timers, earliest first."""
        return sorted(self._pending)
