"""The operator contract: what a user writes.

An operator is stateful pandas code over keyed rows, in one of two forms that snapshot
identically:

* per key, with :func:`operator`: ``fn(key, rows, state) -> rows``, where ``state`` is a
  :class:`KeyState`, much like Spark's ``GroupState``;
* per key group, with :func:`vectorized_operator`:
  ``fn(rows, state, ctx) -> KeyGroupResult``, over all rows and all state of one key group.

Both are run once per key group and epoch. Only keys whose state changed are written to the
snapshot.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeAlias

import pandas as pd

from pyspark_abs.errors import (
    InvalidTimeoutError,
    OperatorDefinitionError,
    SchemaMismatchError,
    StateNotSetError,
)
from pyspark_abs.operators.schema import RESERVED_COLUMNS, SchemaLike

DEFAULT_OUTPUT = "output"
"""Name of the output of an operator declared with ``output_schema=``."""


class TimeoutMode(str, Enum):
    """Which clock a key's timeout follows."""

    NONE = "none"
    PROCESSING_TIME = "processing_time"
    EVENT_TIME = "event_time"


Rows: TypeAlias = "pd.DataFrame | Mapping[str, Any] | Iterable[Mapping[str, Any]] | None"
"""What a per-key function returns for one output: a frame, one row, rows, or nothing."""

PerKeyFunction: TypeAlias = "Callable[[tuple[Any, ...], pd.DataFrame, KeyState], Any]"
KeyGroupFunction: TypeAlias = (
    "Callable[[pd.DataFrame, pd.DataFrame, KeyGroupContext], KeyGroupResult | None]"
)


@dataclass(frozen=True)
class Clock:
    """The two clocks of an epoch, in milliseconds since the Unix epoch.

    Attributes:
        processing_time_ms: The micro-batch's timestamp; the same when a batch is replayed.
        watermark_ms: The event-time watermark, or None if the query has none.
    """

    processing_time_ms: int
    watermark_ms: int | None


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
        """
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


@dataclass(frozen=True)
class KeyGroupContext:
    """What a vectorized operator function knows about its call.

    Attributes:
        operator: The operator's name.
        epoch: The epoch (micro-batch id) being processed, if known.
        key_group: The key group being processed.
        clock: Processing time and watermark of the epoch.
        timed_out: Key columns of the keys whose timeout fired in this call. They have no
            rows in this call.
    """

    operator: str
    epoch: int | None
    key_group: int
    clock: Clock
    timed_out: pd.DataFrame


@dataclass
class KeyGroupResult:
    """What a vectorized operator function returns for one key group.

    Attributes:
        state: New state of the keys that changed: key columns, state columns and
            optionally ``_timeout`` (ms since the Unix epoch; missing or null means no
            timeout). Keys not listed keep their state. Returning unchanged keys is allowed
            but they are not written to the snapshot.
        removed: Key columns of the keys whose state is removed.
        output: Output rows: a frame for an operator with one output, or a dict from output
            name to frame.
    """

    state: pd.DataFrame | None = None
    removed: pd.DataFrame | None = None
    output: pd.DataFrame | Mapping[str, pd.DataFrame] | None = None


@dataclass(frozen=True)
class Operator:
    """A declared stateful operator, built with :func:`operator` or :func:`vectorized_operator`.

    Attributes:
        name: Operator id; its state table is ``state/<name>`` under the snapshot root.
        key: Key column names in the input rows.
        state_schema: Columns of one key's state.
        outputs: Output names and their schemas, in declaration order.
        timeout: The clock key timeouts follow.
        per_key: The per-key function, for operators built with :func:`operator`.
        vectorized: The key-group function, for operators built with
            :func:`vectorized_operator`.
    """

    name: str
    key: tuple[str, ...]
    state_schema: SchemaLike
    outputs: tuple[tuple[str, SchemaLike], ...]
    timeout: TimeoutMode = TimeoutMode.NONE
    per_key: PerKeyFunction | None = field(default=None, repr=False)
    vectorized: KeyGroupFunction | None = field(default=None, repr=False)

    @property
    def output_names(self) -> tuple[str, ...]:
        """Names of the operator's outputs."""
        return tuple(name for name, _ in self.outputs)


def operator(
    *,
    key: str | Sequence[str],
    state_schema: SchemaLike,
    output_schema: SchemaLike | None = None,
    outputs: Mapping[str, SchemaLike] | None = None,
    timeout: TimeoutMode | str = TimeoutMode.NONE,
    name: str | None = None,
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

    Args:
        key: Key column name(s).
        state_schema: Columns of a key's state.
        output_schema: Schema of the single output, named ``"output"``.
        outputs: Several named outputs with their schemas (instead of ``output_schema``).
        timeout: ``"none"``, ``"processing_time"`` or ``"event_time"``.
        name: Operator id; defaults to the function's name.

    Raises:
        OperatorDefinitionError: The declaration is inconsistent.
    """

    def build(fn: PerKeyFunction) -> Operator:
        return _declare(fn, key, state_schema, output_schema, outputs, timeout, name, False)

    return build


def vectorized_operator(
    *,
    key: str | Sequence[str],
    state_schema: SchemaLike,
    output_schema: SchemaLike | None = None,
    outputs: Mapping[str, SchemaLike] | None = None,
    timeout: TimeoutMode | str = TimeoutMode.NONE,
    name: str | None = None,
) -> Callable[[KeyGroupFunction], Operator]:
    """Declare a vectorized operator: ``fn(rows, state, ctx) -> KeyGroupResult``.

    The function gets every row of one key group in this epoch, the current state of every
    key of the group (key columns, state columns and ``_timeout``), and a
    :class:`KeyGroupContext`. It returns a :class:`KeyGroupResult`.

    Example::

        @vectorized_operator(key="word", state_schema="count long",
                             output_schema="word string, count long")
        def word_count(rows, state, ctx):
            counts = rows.groupby("word").size().rename("n").reset_index()
            merged = counts.merge(state, on="word", how="left")
            merged["count"] = merged["count"].fillna(0).astype("int64") + merged["n"]
            new = merged[["word", "count"]]
            return KeyGroupResult(state=new, output=new)

    Args are those of :func:`operator`.

    Raises:
        OperatorDefinitionError: The declaration is inconsistent.
    """

    def build(fn: KeyGroupFunction) -> Operator:
        return _declare(fn, key, state_schema, output_schema, outputs, timeout, name, True)

    return build


def _declare(
    fn: Callable[..., Any],
    key: str | Sequence[str],
    state_schema: SchemaLike,
    output_schema: SchemaLike | None,
    outputs: Mapping[str, SchemaLike] | None,
    timeout: TimeoutMode | str,
    name: str | None,
    vectorized: bool,
) -> Operator:
    op_name = name or getattr(fn, "__name__", "")
    if not callable(fn):
        raise OperatorDefinitionError(f"operator {op_name!r}: expected a function, got {fn!r}")
    if not op_name or not op_name.replace("_", "").replace("-", "").isalnum():
        raise OperatorDefinitionError(
            f"operator name {op_name!r} must be non-empty and use only letters, digits, '_' "
            f"and '-' (it names the state table)"
        )
    keys = (key,) if isinstance(key, str) else tuple(key)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise OperatorDefinitionError(
            f"operator {op_name!r}: key must be a column name or a list of them, got {key!r}"
        )
    if len(set(keys)) != len(keys):
        raise OperatorDefinitionError(f"operator {op_name!r}: key columns repeat in {keys}")
    reserved = [k for k in keys if k in RESERVED_COLUMNS]
    if reserved:
        raise OperatorDefinitionError(
            f"operator {op_name!r}: key column(s) {reserved} use names reserved for the state "
            f"table {list(RESERVED_COLUMNS)}; rename them"
        )
    if (output_schema is None) == (outputs is None):
        raise OperatorDefinitionError(
            f"operator {op_name!r}: declare exactly one of output_schema= (one output) or "
            f"outputs= (several named outputs)"
        )
    declared = (
        ((DEFAULT_OUTPUT, output_schema),)
        if output_schema is not None
        else tuple((outputs or {}).items())
    )
    if not declared:
        raise OperatorDefinitionError(f"operator {op_name!r}: outputs= is empty")
    for out_name, _ in declared:
        if not isinstance(out_name, str) or not out_name:
            raise OperatorDefinitionError(
                f"operator {op_name!r}: output names must be non-empty strings, got {out_name!r}"
            )
    try:
        mode = TimeoutMode(timeout)
    except ValueError:
        raise OperatorDefinitionError(
            f"operator {op_name!r}: timeout must be one of "
            f"{[m.value for m in TimeoutMode]}, got {timeout!r}"
        ) from None
    return Operator(
        name=op_name,
        key=keys,
        state_schema=state_schema,
        outputs=declared,
        timeout=mode,
        per_key=None if vectorized else fn,
        vectorized=fn if vectorized else None,
    )
