"""The per-key form of an operator: ``fn(key, rows, state) -> rows``, adapted to a key group.

:func:`operator` declares it; :class:`PerKeyAdapter` is the key-group function it produces,
which calls ``fn`` once for every key with rows in the epoch and every key whose timeout
fired, each with its :class:`KeyState`.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeAlias

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
from pyspark_abs.operators.schema import (
    STATELESS_COLUMN,
    TIMEOUT,
    SchemaLike,
    check_columns,
    check_names,
)

Rows: TypeAlias = "pd.DataFrame | Mapping[str, Any] | Iterable[Mapping[str, Any]] | None"
"""What a per-key function returns for one output: a frame, one row, rows, or nothing."""

PerKeyFunction: TypeAlias = "Callable[[tuple[Any, ...], pd.DataFrame, KeyState], Any]"


class KeyState:
    """The state of one key, given to a per-key operator function.

    It mirrors Spark's ``GroupState``: read it with :attr:`exists` and :meth:`get`, change
    it with :meth:`update` or :meth:`remove`, and set a timeout with
    :meth:`set_timeout_duration` or :meth:`set_timeout_timestamp`. As in Spark, a key's
    timeout is cleared every time the function is called for it, unless set again.
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

    def set_timeout_duration(self, duration_ms: int) -> None:
        """Time the key out when processing time passes now plus ``duration_ms``.

        Raises:
            InvalidTimeoutError: The operator does not use processing-time timeouts, or the
                duration is not positive.
        """
        if self._timeout_mode is not TimeoutMode.PROCESSING_TIME:
            raise InvalidTimeoutError(
                f"set_timeout_duration for key {self._key!r} needs an operator declared "
                f"with timeout='processing_time' (it has {self._timeout_mode.value!r})"
            )
        if isinstance(duration_ms, bool) or not isinstance(duration_ms, int) or duration_ms <= 0:
            raise InvalidTimeoutError(
                f"set_timeout_duration for key {self._key!r}: duration must be a positive "
                f"number of milliseconds, got {duration_ms!r}"
            )
        self.new_timeout_ms = self._clock.processing_time_ms + duration_ms

    def set_timeout_timestamp(self, timestamp: int | dt.datetime) -> None:
        """Time the key out when the watermark passes ``timestamp``.

        Args:
            timestamp: Milliseconds since the Unix epoch, or a datetime: aware, or naive for
                a wall-clock time in the session time zone (as the input's datetimes are).

        Raises:
            InvalidTimeoutError: The operator does not use event-time timeouts, or the
                timestamp is older than the current watermark, or a naive datetime names
                no single instant in the session time zone.
        """
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


def to_epoch_ms(value: int | dt.datetime, time_zone: str) -> int:
    """Milliseconds since the Unix epoch of an int or a datetime.

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
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTimeoutError(f"a timeout must be an int (ms) or a datetime, got {value!r}")
    return value


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

    Args are those of :func:`~pyspark_abs.operators.contract.vectorized_operator`.

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
        return replace(declared, function=PerKeyAdapter(fn, declared.key, timeouts))

    return build


class PerKeyAdapter:
    """The key-group function of an operator declared per key.

    Attributes:
        function: The per-key function.
        key: The key columns.
        timeout: The clock key timeouts follow.
    """

    def __init__(
        self, function: PerKeyFunction, key: tuple[str, ...], timeout: TimeoutMode
    ) -> None:
        self.function = function
        self.key = key
        self.timeout = timeout

    def __call__(
        self, rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext
    ) -> KeyGroupResult:
        """Call the per-key function for every key with rows and every timed-out key."""
        keys = list(self.key)
        fields = [c for c in state.columns if c not in self.key and c != TIMEOUT]
        existing: dict[tuple[Any, ...], int] = {
            _norm_key(k): i for i, k in enumerate(state[keys].itertuples(index=False, name=None))
        }
        values: list[dict[str, Any]] = state[fields].to_dict("records")  # type: ignore[assignment]
        timeouts = state[TIMEOUT].tolist()
        upserts: list[dict[str, Any]] = []
        removed: list[tuple[Any, ...]] = []
        collected = {name: _OutputRows(columns) for name, columns in ctx.outputs}

        def call(key: tuple[Any, ...], key_rows: pd.DataFrame, timed_out: bool) -> None:
            where = f"{ctx.where}, key {key!r}"
            position = existing.get(key)
            handle = KeyState(
                key,
                fields,
                None if position is None else values[position],
                timeout_mode=self.timeout,
                clock=ctx.clock,
                time_zone=ctx.time_zone,
                has_timed_out=timed_out,
                timeout_ms=None if position is None else _ms_or_none(timeouts[position]),
            )
            try:
                returned = self.function(key, key_rows, handle)
            except AbsError as err:
                raise err.at(where) from err
            except Exception as err:
                raise OperatorError(f"{where}: the function raised {describe(err)}") from err
            _collect(returned, collected, where)
            if handle.removed:
                removed.append(key)
            elif handle.exists:
                row = dict(zip(keys, key, strict=True))
                row.update(handle.get())
                row[TIMEOUT] = handle.new_timeout_ms
                upserts.append(row)

        if len(rows):
            groups = rows.groupby(keys, sort=False, dropna=False).indices
            for key, at in groups.items():
                call(_norm_key(key if isinstance(key, tuple) else (key,)), rows.iloc[at], False)
        no_rows = rows.iloc[0:0]
        for key in ctx.timed_out[keys].itertuples(index=False, name=None):
            call(_norm_key(key), no_rows, True)

        return KeyGroupResult(
            state=pd.DataFrame.from_records(upserts, columns=[*keys, *fields, TIMEOUT]),
            removed=pd.DataFrame.from_records(removed, columns=keys),
            output={
                name: frame
                for name, rows_ in collected.items()
                if (frame := rows_.frame()) is not None
            },
        )


class _OutputRows:
    """Rows a per-key function returned for one output, collected over a key group."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = list(columns)
        self.frames: list[pd.DataFrame] = []
        self.records: list[Mapping[str, Any]] = []

    def add(self, rows: Any, what: str) -> None:
        """Add what the function returned for one key, checking its columns."""
        if rows is None:
            return
        if isinstance(rows, pd.DataFrame):
            check_columns(rows, self.columns, what)
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
        if len(row) != len(self.columns) or any(name not in row for name in self.columns):
            check_names([str(k) for k in row], self.columns, what)
        self.records.append(row)

    def frame(self) -> pd.DataFrame | None:
        """All collected rows as one frame, or None if there are none."""
        frames = list(self.frames)
        if self.records:
            frames.append(pd.DataFrame.from_records(self.records, columns=self.columns))
        if not frames:
            return None
        return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def _collect(returned: Any, collected: dict[str, _OutputRows], where: str) -> None:
    """File what the function returned for one key under its outputs."""
    if len(collected) == 1:
        ((name, rows),) = collected.items()
        rows.add(returned, f"{where}: output {name!r}")
        return
    if returned is None:
        return
    names = list(collected)
    if not isinstance(returned, Mapping) or not set(returned) <= set(names):
        raise SchemaMismatchError(
            f"{where}: an operator with several outputs returns a dict from output name "
            f"({names}) to rows, got {_short(returned)}"
        )
    for name, rows in returned.items():
        collected[name].add(rows, f"{where}: output {name!r}")


def _norm_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """Key tuples that compare equal whatever their source: NaN and NA become None."""
    return tuple(None if _is_missing(v) else v for v in key)


def _is_missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _ms_or_none(value: Any) -> int | None:
    return None if _is_missing(value) else int(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
