"""The state of one key as a per-key operator function sees it (:class:`KeyState`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pyspark_abs.errors import (
    InvalidTimeoutError,
    OperatorError,
    SchemaMismatchError,
    StateNotSetError,
)
from pyspark_abs.operators.contract import Clock, TimeoutMode
from pyspark_abs.operators.schema import STATELESS_COLUMN
from pyspark_abs.operators.timers import (
    Millis,
    Timers,
    to_epoch_ms,
)


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
        if ms <= 0:
            raise InvalidTimeoutError(
                f"set_timeout_timestamp for key {self._key!r}: {ms} is not after the Unix "
                f"epoch; Spark takes only positive timeout timestamps"
            )
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

        A timer at or before the clock (the current watermark, say) fires in this
        micro-batch, in a call right after this one, as in Spark's ``transformWithState``.

        Raises:
            InvalidTimeoutError: The operator was declared without ``timers=True``.
        """
        self._timers("register_timer").register(to_epoch_ms(timestamp, self._time_zone))

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
