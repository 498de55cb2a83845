"""The per-key form of an operator: ``fn(key, rows, state) -> rows``, adapted to a key group.

:func:`operator` declares it; :class:`PerKeyAdapter` is the key-group function it produces,
which calls ``fn`` once for every key with rows in the epoch and every key whose timeout
fired, each with its :class:`KeyState`.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeAlias

import numpy as np
import pandas as pd

from pyspark_abs.errors import (
    AbsError,
    InvalidTimeoutError,
    OperatorError,
    SchemaMismatchError,
    StateNotSetError,
    describe,
)
from pyspark_abs.operators.contract import (
    Clock,
    KeyGroupContext,
    KeyGroupResult,
    Operator,
    TimeoutMode,
    declare,
)
from pyspark_abs.operators.evolution import StateEvolution
from pyspark_abs.operators.outputs import OutputRows, collect
from pyspark_abs.operators.schema import STATELESS_COLUMN, TIMEOUT, TIMERS, SchemaLike
from pyspark_abs.operators.timers import (
    Millis,
    Timers,
    check_timers,
    clock_now,
    split_due,
    stored_timers,
    to_epoch_ms,
    with_timers,
)

PerKeyFunction: TypeAlias = "Callable[[tuple[Any, ...], pd.DataFrame, KeyState], Any]"


class KeyState:
    """The state of one key, given to a per-key operator function.

    It mirrors Spark's ``GroupState``: read it with :attr:`exists` and :meth:`get`, change
    it with :meth:`update` or :meth:`remove`, and set a timeout with
    :meth:`set_timeout_duration` or :meth:`set_timeout_timestamp`. As in Spark, a key's
    timeout is cleared every time the function is called for it, unless set again.

    An operator declared with ``timers=True`` keeps several timers per key instead, as
    Spark's ``transformWithState`` does: :meth:`register_timer`, :meth:`delete_timer`,
    :meth:`list_timers`, and :attr:`expired_timers` for those that fired for this call. A
    timer stays until it fires or is deleted, and :meth:`remove` deletes them all.
    """

    def __init__(
        self,
        key: tuple[Any, ...],
        fields: Sequence[str],
        value: dict[str, Any] | None,
        *,
        timeout_mode: TimeoutMode,
        clock: Clock,
        time_zone: str,
        has_timed_out: bool,
        timeout_ms: int | None,
        timers: Timers | None = None,
    ) -> None:
        self._key = key
        self._fields = tuple(fields)
        self._value = value
        self._timeout_mode = timeout_mode
        self._clock = clock
        self._time_zone = time_zone
        self._has_timed_out = has_timed_out
        self._old_timeout_ms = timeout_ms
        self.new_timeout_ms: int | None = None
        self.timers = timers
        self.removed = False
        self.updated = False

    @property
    def exists(self) -> bool:
        """Whether the key has state."""
        return self._value is not None

    def get(self, default: Any = ...) -> Any:
        """The key's state as a dict of state columns.

        Args:
            default: Returned when the key has no state. Without it, a missing state raises.

        Raises:
            StateNotSetError: The key has no state and no default was given.
        """
        if self._value is None:
            if default is ...:
                raise StateNotSetError(
                    f"key {self._key!r} has no state; check state.exists or call state.get(default)"
                )
            return default
        return dict(self._value)

    def update(self, value: Mapping[str, Any] | Sequence[Any]) -> None:
        """Set the key's state.

        Args:
            value: A dict with every state column, or a tuple in state-schema order.

        Raises:
            SchemaMismatchError: The value does not have the state columns.
            OperatorError: The operator was declared without state.
        """
        if self._fields == (STATELESS_COLUMN,):
            raise OperatorError(
                f"state.update for key {self._key!r}: the operator was declared without "
                f"state_schema; declare the state it keeps"
            )
        if isinstance(value, Mapping):
            missing = [f for f in self._fields if f not in value]
            extra = [k for k in value if k not in self._fields]
            if missing or extra:
                raise SchemaMismatchError(
                    f"state.update for key {self._key!r}: missing {missing}, unexpected "
                    f"{extra}; the state columns are {list(self._fields)}"
                )
            new = {f: value[f] for f in self._fields}
        elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            if len(value) != len(self._fields):
                raise SchemaMismatchError(
                    f"state.update for key {self._key!r}: got {len(value)} value(s) for "
                    f"the {len(self._fields)} state columns {list(self._fields)}"
                )
            new = dict(zip(self._fields, value, strict=True))
        else:
            raise SchemaMismatchError(
                f"state.update for key {self._key!r}: expected a dict or a tuple, got "
                f"{type(value).__name__}"
            )
        self._value = new
        self.updated = True
        self.removed = False

    def remove(self) -> None:
        """Remove the key's state (written to the snapshot as a tombstone)."""
        self._value = None
        self.removed = True
        self.updated = False
        self.new_timeout_ms = None
        if self.timers is not None:
            self.timers.clear()

    @property
    def has_timed_out(self) -> bool:
        """Whether this call is the key's timeout firing (it then gets no rows)."""
        return self._has_timed_out

    @property
    def timeout_ms(self) -> int | None:
        """The timeout the key had before this call, in ms since the Unix epoch."""
        return self._old_timeout_ms

    @property
    def current_processing_time_ms(self) -> int:
        """The micro-batch's processing time in ms since the Unix epoch."""
        return self._clock.processing_time_ms

    @property
    def current_watermark_ms(self) -> int | None:
        """The event-time watermark in ms since the Unix epoch, or None without one."""
        return self._clock.watermark_ms

    def set_timeout_duration(self, duration_ms: Millis) -> None:
        """Time the key out when processing time passes now plus ``duration_ms``.

        Raises:
            InvalidTimeoutError: The operator does not use processing-time timeouts, or the
                duration is not positive.
        """
        self._no_timers("set_timeout_duration")
        if self._timeout_mode is not TimeoutMode.PROCESSING_TIME:
            raise InvalidTimeoutError(
                f"set_timeout_duration for key {self._key!r} needs an operator declared "
                f"with timeout='processing_time' (it has {self._timeout_mode.value!r})"
            )
        whole = isinstance(duration_ms, int | np.integer) and not isinstance(duration_ms, bool)
        if not whole or duration_ms <= 0:
            raise InvalidTimeoutError(
                f"set_timeout_duration for key {self._key!r}: duration must be a positive "
                f"number of milliseconds, got {duration_ms!r}"
            )
        self.new_timeout_ms = self._clock.processing_time_ms + int(duration_ms)

    def set_timeout_timestamp(self, timestamp: Millis | dt.datetime) -> None:
        """Time the key out when the watermark passes ``timestamp``.

        Args:
            timestamp: Milliseconds since the Unix epoch, or a datetime: aware, or naive for
                a wall-clock time in the session time zone (as the input's datetimes are).

        Raises:
            InvalidTimeoutError: The operator does not use event-time timeouts, or the
                timestamp is older than the current watermark, or a naive datetime names
                no single instant in the session time zone.
        """
        self._no_timers("set_timeout_timestamp")
        if self._timeout_mode is not TimeoutMode.EVENT_TIME:
            raise InvalidTimeoutError(
                f"set_timeout_timestamp for key {self._key!r} needs an operator declared "
                f"with timeout='event_time' (it has {self._timeout_mode.value!r})"
            )
        ms = to_epoch_ms(timestamp, self._time_zone)
        watermark = self._clock.watermark_ms
        if watermark is not None and ms < watermark:
            raise InvalidTimeoutError(
                f"set_timeout_timestamp for key {self._key!r}: {ms} is older than the "
                f"current watermark {watermark}; the timeout would never fire"
            )
        self.new_timeout_ms = ms

    def register_timer(self, timestamp: Millis | dt.datetime) -> None:
        """Add a timer that fires once the operator's clock passes ``timestamp``.

        The clock is the watermark (``timeout="event_time"``) or the micro-batch's
        processing time (``"processing_time"``). A key with timers must have state.

        Args:
            timestamp: Milliseconds since the Unix epoch, or a datetime (naive: a wall-clock
                time in the session time zone).

        Raises:
            InvalidTimeoutError: The operator was declared without ``timers=True``, or the
                time is before the clock.
        """
        timers = self._timers("register_timer")
        timers.register(to_epoch_ms(timestamp, self._time_zone), self._now())

    def delete_timer(self, timestamp: Millis | dt.datetime) -> None:
        """Delete the key's timer at ``timestamp`` (nothing happens if it has none there)."""
        self._timers("delete_timer").delete(to_epoch_ms(timestamp, self._time_zone))

    def list_timers(self) -> list[int]:
        """The key's pending timers, earliest first, in ms since the Unix epoch."""
        return self._timers("list_timers").pending()

    @property
    def expired_timers(self) -> tuple[int, ...]:
        """The timers that fired for this call, earliest first (they are no longer listed)."""
        return self._timers("expired_timers").fired

    def _timers(self, call: str) -> Timers:
        if self.timers is None:
            raise InvalidTimeoutError(
                f"{call} for key {self._key!r} needs an operator declared with timers=True "
                f"and a timeout clock (timeout='event_time' or 'processing_time')"
            )
        return self.timers

    def _no_timers(self, call: str) -> None:
        if self.timers is not None:
            raise InvalidTimeoutError(
                f"{call} for key {self._key!r}: the operator was declared with timers=True; "
                f"use state.register_timer and state.delete_timer"
            )

    def _now(self) -> int | None:
        return clock_now(self._timeout_mode, self._clock)


def operator(
    *,
    key: str | Sequence[str],
    state_schema: SchemaLike | None = None,
    output_schema: SchemaLike | None = None,
    outputs: Mapping[str, SchemaLike] | None = None,
    timeout: TimeoutMode | str = TimeoutMode.NONE,
    name: str | None = None,
    evolution: StateEvolution | None = None,
    ttl: dt.timedelta | None = None,
    ttl_clock: TimeoutMode | str = TimeoutMode.PROCESSING_TIME,
    timers: bool = False,
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

    The arguments are those of :func:`~pyspark_abs.operators.contract.vectorized_operator`,
    and ``timers=True``: keep several timers per key (:meth:`KeyState.register_timer`) on
    the clock ``timeout`` names, in the state column ``_timers``, instead of one timeout.

    Raises:
        OperatorDefinitionError: The declaration is inconsistent.
    """

    def build(fn: PerKeyFunction) -> Operator:
        declared = declare(
            fn,  # type: ignore[arg-type]  # checked, then wrapped below
            key=key,
            state_schema=state_schema,
            output_schema=output_schema,
            outputs=outputs,
            timeout=timeout,
            name=name,
            evolution=evolution,
            ttl=ttl,
            ttl_clock=ttl_clock,
        )
        # with a TTL, the timeouts are the expiries: KeyState offers none
        timeouts = TimeoutMode.NONE if declared.ttl_ms is not None else declared.timeout
        adapter = PerKeyAdapter(fn, declared.key, timeouts, timers=timers)
        if timers:
            check_timers(declared, state_schema)
            state = with_timers(declared.name, state_schema)  # type: ignore[arg-type]
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
        values: list[dict[str, Any]] = state[fields].to_dict("records")  # type: ignore[assignment]
        timeouts = state[TIMEOUT].tolist()
        stored = state[TIMERS].tolist() if self.timers else []
        now = clock_now(self.timeout, ctx.clock)
        upserts: list[dict[str, Any]] = []
        removed: list[tuple[Any, ...]] = []
        collected = {name: OutputRows(columns) for name, columns in ctx.outputs}

        def call(key: tuple[Any, ...], key_rows: pd.DataFrame, timed_out: bool) -> None:
            where = f"{ctx.where}, key {key!r}"
            position = existing.get(key)
            timers = None
            if self.timers:
                had = (
                    [] if position is None else stored_timers(stored[position], timeouts[position])
                )
                fired, pending = split_due(had, now)
                timers = Timers(key, pending, fired)
            handle = KeyState(
                key,
                fields,
                None if position is None else values[position],
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
            pending = [] if timers is None else timers.pending()
            if handle.removed:
                removed.append(key)
            elif handle.exists:
                row = dict(zip(keys, key, strict=True))
                row.update(handle.get())
                if timers is not None:
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
        no_rows = rows.iloc[0:0]
        for key in ctx.timed_out[keys].itertuples(index=False, name=None):
            call(_norm_key(key), no_rows, True)

        return KeyGroupResult(
            state=pd.DataFrame.from_records(
                upserts, columns=[*keys, *fields, *timer_columns, TIMEOUT]
            ),
            removed=pd.DataFrame.from_records(removed, columns=keys),
            output={
                name: frame
                for name, rows_ in collected.items()
                if (frame := rows_.frame()) is not None
            },
        )


def _norm_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """Key tuples that compare equal whatever their source: NaN and NA become None."""
    return tuple(None if _is_missing(v) else v for v in key)


def _is_missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _ms_or_none(value: Any) -> int | None:
    return None if _is_missing(value) else int(value)
