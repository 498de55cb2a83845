"""Ready event-time window operators: tumbling windows and session windows per key.

Each key keeps its open windows in its state, as parallel arrays (``window_start`` and
``window_end`` in ms since the Unix epoch, one array per aggregate), so snapshots, SQL,
rollback, restore and evolution carry them like any other state, and its ``_timeout`` is
the earliest end. A window is emitted once, when the watermark reaches its end, and then
leaves the state; rows older than the watermark are dropped, as Spark drops late rows. The
work runs over the whole key group at once on flat arrays (see
:mod:`~pyspark_abs.operators.window_arrays`), not key by key.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import NumericType, StructType

from pyspark_abs.errors import OperatorDefinitionError
from pyspark_abs.operators.contract import (
    ArrowContext,
    KeyGroupResult,
    Operator,
    TimeoutMode,
    declare,
)
from pyspark_abs.operators.evolution import StateEvolution
from pyspark_abs.operators.schema import TIMEOUT
from pyspark_abs.operators.window_arrays import (
    ARROW_KINDS,
    Windows,
    cell_lengths,
    cells,
    flatten,
    key_ids,
    merge,
    numbers,
    valid_mask,
)

START, END = "window_start", "window_end"
_AGGREGATE = re.compile(
    r"^\s*(count|sum|min|max)\s*\(\s*(\*|[A-Za-z_][A-Za-z0-9_]*)\s*\)\s*(bigint|long|double)?\s*$"
)


@dataclass(frozen=True)
class Aggregate:
    """One aggregate of a window: ``function(column)`` as ``name`` of type ``kind``."""

    name: str
    function: str
    column: str | None
    kind: str


def parse_aggregates(operator: str, aggregates: Mapping[str, str]) -> tuple[Aggregate, ...]:
    """``{"clicks": "count(*)", "spent": "sum(amount)"}`` as :class:`Aggregate` values.

    ``count`` is a ``bigint``; ``sum``, ``min`` and ``max`` are ``double`` unless the spec
    ends in ``bigint``.

    Raises:
        OperatorDefinitionError: A spec is not one of these forms, or names clash.
    """
    if not isinstance(aggregates, Mapping) or not aggregates:
        raise OperatorDefinitionError(
            f"operator {operator!r}: aggregates= must be a non-empty dict from output column "
            f'to "count(*)", "count(col)", "sum(col)", "min(col)" or "max(col)"'
        )
    parsed = []
    for name, spec in aggregates.items():
        found = _AGGREGATE.match(spec) if isinstance(spec, str) else None
        if not isinstance(name, str) or not name.isidentifier() or found is None:
            raise OperatorDefinitionError(
                f"operator {operator!r}: aggregate {name!r}: {spec!r} is not one of "
                f'"count(*)", "count(col)", "sum(col)", "min(col)", "max(col)" (optionally '
                f'followed by "bigint" or "double")'
            )
        function, column, kind = found.groups()
        if column == "*" and function != "count":
            raise OperatorDefinitionError(
                f"operator {operator!r}: aggregate {name!r}: only count takes *, got {spec!r}"
            )
        kind = "bigint" if function == "count" or kind in ("bigint", "long") else "double"
        parsed.append(Aggregate(name, function, None if column == "*" else column, kind))
    return tuple(parsed)


@dataclass(frozen=True)
class WindowFunction:
    """The key-group function of a window operator.

    Attributes:
        keys: The key columns.
        time: The event-time column (the one the watermark is on).
        length_ms: A tumbling window's size, or a session's gap.
        session: Session windows (else tumbling).
        aggregates: What each window computes.
    """

    keys: tuple[str, ...]
    time: str
    length_ms: int
    session: bool
    aggregates: tuple[Aggregate, ...]

    def __call__(self, rows: pa.Table, state: pa.Table, ctx: ArrowContext) -> KeyGroupResult:
        """Add the rows to their keys' windows, emit those the watermark closed."""
        keys = list(self.keys)
        watermark = ctx.clock.watermark_ms
        row_ids, timed_ids, state_ids = key_ids(keys, rows, ctx.timed_out, state)
        hit = np.isin(state_ids, np.concatenate([row_ids, timed_ids]))
        touched, touched_ids = state.filter(pa.array(hit)), state_ids[hit]
        at, known = _millis(rows[self.time])
        fresh = known if watermark is None else known & (at >= watermark)
        key_rows = _rows_of(keys, touched, rows.filter(pa.array(fresh)))
        windows = self._stored(touched, touched_ids).then(
            self._new(rows, at[fresh], fresh, row_ids[fresh], touched.num_rows)
        )
        merged = merge(windows, [a.function for a in self.aggregates], session=self.session)
        closing = merged.end <= (watermark if watermark is not None else np.iinfo(np.int64).min)
        open_ = merged.take(~closing)
        gone = ~np.isin(touched_ids, open_.ids)
        return KeyGroupResult(
            state=self._state(open_, key_rows),
            removed=touched.filter(pa.array(gone)).select(keys),
            output=self._output(merged.take(closing), key_rows),
        )

    def input_problem(self, schema: StructType, watermark: str | None) -> str | None:
        """What a source with ``schema``, watermarked on ``watermark``, lacks, or None."""
        types = {f.name: f.dataType for f in schema.fields}
        read = [self.time, *(a.column for a in self.aggregates if a.column is not None)]
        missing = [c for c in dict.fromkeys(read) if c not in types]
        if missing:
            return (
                f"the source has no column(s) {missing}, which time= or aggregates= name; it "
                f"has {list(types)}. Name its columns, or add them in the source's transform"
            )
        if watermark is not None and watermark != self.time:
            return (
                f"time={self.time!r}, but the source's watermark is on {watermark!r}; windows "
                f"close by the watermark, so it must be on their time column: "
                f"withWatermark({self.time!r}, <delay>), or time={watermark!r}"
            )
        for agg in self.aggregates:
            kind = types[agg.column] if agg.column is not None else None
            if agg.function != "count" and not isinstance(kind, NumericType):
                return (
                    f"aggregate {agg.name!r} is {agg.function}({agg.column}), but "
                    f"{agg.column!r} is {kind.simpleString() if kind else None}, not a number; "
                    f"cast it in the source's transform, or count it"
                )
        return None

    def _new(
        self,
        rows: pa.Table,
        ms: np.ndarray[Any, Any],
        fresh: np.ndarray[Any, Any],
        ids: np.ndarray[Any, Any],
        first_row: int,
    ) -> Windows:
        """One window per row that is not late (``fresh``), at ``ms``, with its inputs.

        The rows' keys are numbered from ``first_row`` on, after the stored keys.
        """
        start = ms if self.session else ms - ms % self.length_ms
        picked = pa.array(fresh)
        values, valid = [], []
        for agg in self.aggregates:
            if agg.column is None:
                data, ok = np.ones(len(ms), np.int64), np.ones(len(ms), bool)
            elif agg.function == "count":
                data = valid_mask(rows[agg.column].filter(picked)).astype(np.int64)
                ok = np.ones(len(ms), bool)
            else:
                data, ok = numbers(rows[agg.column].filter(picked), agg.kind)
            values.append(data)
            valid.append(ok)
        at = np.arange(first_row, first_row + len(ms))
        return Windows(ids, at, start, start + self.length_ms, tuple(values), tuple(valid))

    def _stored(self, state: pa.Table, ids: np.ndarray[Any, Any]) -> Windows:
        """The open windows of the keys in ``state``, one each.

        An aggregate added by evolution (``added={name: None}``) is null in the windows
        opened before it.
        """
        lengths = cell_lengths(state[START])
        start, end = (numbers(flatten(state[c], lengths), "bigint")[0] for c in (START, END))
        values, valid = [], []
        for agg in self.aggregates:
            data, ok = numbers(flatten(state[agg.name], lengths), agg.kind)
            values.append(data)
            valid.append(ok)
        at = np.repeat(np.arange(state.num_rows), lengths)
        return Windows(np.repeat(ids, lengths), at, start, end, tuple(values), tuple(valid))

    def _state(self, open_: Windows, key_rows: pa.Table) -> pa.Table:
        """One row per key with windows left, as arrays.

        Its ``_timeout`` is the earliest end less one: a timeout fires once the watermark
        is past it, a window closes once the watermark reaches its end.
        """
        starts = open_.key_starts()
        every = np.ones(len(open_), bool)
        columns: dict[str, Any] = {
            START: cells(open_.start, every, starts),
            END: cells(open_.end, every, starts),
        }
        for agg, data, ok in zip(self.aggregates, open_.values, open_.valid, strict=True):
            columns[agg.name] = cells(data, ok, starts)
        ends = np.minimum.reduceat(open_.end, starts) if len(starts) else open_.end
        columns[TIMEOUT] = pa.array(ends - 1, pa.int64())
        return _with_columns(key_rows.take(open_.at[starts]), columns)

    def _output(self, closed: Windows, key_rows: pa.Table) -> pa.Table:
        instant = pa.timestamp("us", "UTC")
        columns: dict[str, Any] = {
            START: pa.array(closed.start * 1000, instant),
            END: pa.array(closed.end * 1000, instant),
        }
        for agg, data, ok in zip(self.aggregates, closed.values, closed.valid, strict=True):
            columns[agg.name] = pa.array(data, type=ARROW_KINDS[agg.kind], mask=~ok)
        return _with_columns(key_rows.take(closed.at), columns)


def _millis(column: Any) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Event times in ms since the Unix epoch (0 where null), and which are not null."""
    micros: Any = column.cast(pa.timestamp("us", "UTC")).cast(pa.int64())
    known = valid_mask(micros)
    return np.asarray(pc.fill_null(micros, 0).to_numpy(), dtype=np.int64) // 1000, known


def _rows_of(keys: Sequence[str], *tables: pa.Table) -> pa.Table:
    """The key columns of the tables' rows one after the other, numbered from 0."""
    return pa.table(
        {
            key: pa.concat_arrays([t[key].combine_chunks() for t in tables]).cast(
                tables[0].schema.field(key).type
            )
            for key in keys
        }
    )


def _with_columns(table: pa.Table, columns: Mapping[str, Any]) -> pa.Table:
    for name, column in columns.items():
        table = table.append_column(name, column)
    return table


def tumbling_window(
    *,
    key: Mapping[str, str],
    time: str,
    size: dt.timedelta,
    aggregates: Mapping[str, str],
    name: str,
    evolution: StateEvolution | None = None,
) -> Operator:
    """A ready operator: fixed, non-overlapping event-time windows per key.

    Each row falls in the window ``[start, start + size)`` that holds its ``time`` (windows
    start at multiples of ``size`` since the Unix epoch). A window is emitted once, when the
    watermark reaches its end, as the key columns, ``window_start``, ``window_end`` and the
    aggregates. The source needs ``withWatermark`` on ``time``.

    Args:
        key: Key columns and their types, e.g. ``{"user": "string"}``.
        time: The event-time column.
        size: The window length.
        aggregates: Output column to ``"count(*)"``, ``"count(col)"``, ``"sum(col)"``,
            ``"min(col)"`` or ``"max(col)"``; sums, minima and maxima are doubles unless
            followed by ``bigint``.
        name: The operator's name (it names the state table).
        evolution: How the state of an earlier version becomes this one's: an aggregate
            added with ``StateEvolution(added={"spent": None})`` is null for what the
            windows open at the change saw before it; ``dropped=[...]`` removes one.

    Raises:
        OperatorDefinitionError: An argument is not of these forms.
    """
    return _window(key, time, size, aggregates, name, evolution, session=False)


def session_window(
    *,
    key: Mapping[str, str],
    time: str,
    gap: dt.timedelta,
    aggregates: Mapping[str, str],
    name: str,
    evolution: StateEvolution | None = None,
) -> Operator:
    """A ready operator: event-time sessions per key, closed by ``gap`` without events.

    Each row opens ``[time, time + gap)``; windows of a key that overlap are one session.
    A session is emitted once, when the watermark reaches its end (its last event plus
    ``gap``), like :func:`tumbling_window`'s windows.

    Args:
        key: Key columns and their types, e.g. ``{"user": "string"}``.
        time: The event-time column.
        gap: How long a session stays open after its last event.
        aggregates: As for :func:`tumbling_window`.
        name: The operator's name (it names the state table).
        evolution: As for :func:`tumbling_window`.

    Raises:
        OperatorDefinitionError: An argument is not of these forms.
    """
    return _window(key, time, gap, aggregates, name, evolution, session=True)


def _window(
    key: Mapping[str, str],
    time: str,
    length: dt.timedelta,
    aggregates: Mapping[str, str],
    name: str,
    evolution: StateEvolution | None,
    *,
    session: bool,
) -> Operator:
    what = "gap" if session else "size"
    if not isinstance(key, Mapping) or not key:
        raise OperatorDefinitionError(
            f"operator {name!r}: key= must map each key column to its type, e.g. "
            f'{{"user": "string"}} (the output schema needs the types), got {key!r}'
        )
    if not isinstance(length, dt.timedelta) or length < dt.timedelta(milliseconds=1):
        raise OperatorDefinitionError(
            f"operator {name!r}: {what}= must be a datetime.timedelta of at least 1 ms, got "
            f"{length!r}"
        )
    if not isinstance(time, str) or not time or time in key:
        raise OperatorDefinitionError(
            f"operator {name!r}: time= must name the event-time column (not a key), got {time!r}"
        )
    parsed = parse_aggregates(name, aggregates)
    clashes = [a.name for a in parsed if a.name in (*key, START, END)]
    if clashes:
        raise OperatorDefinitionError(
            f"operator {name!r}: aggregate name(s) {clashes} clash with the key columns or "
            f"{START!r}/{END!r}; rename them"
        )
    keys: Sequence[str] = tuple(key)
    function = WindowFunction(
        tuple(keys), time, length // dt.timedelta(milliseconds=1), session, parsed
    )
    key_ddl = ", ".join(f"{k} {t}" for k, t in key.items())
    declared = declare(
        function,
        {
            "key": keys,
            "state_schema": ", ".join(
                [f"{START} array<bigint>", f"{END} array<bigint>"]
                + [f"{a.name} array<{a.kind}>" for a in parsed]
            ),
            "output_schema": ", ".join(
                [key_ddl, f"{START} timestamp", f"{END} timestamp"]
                + [f"{a.name} {a.kind}" for a in parsed]
            ),
            "timeout": TimeoutMode.EVENT_TIME,
            "name": name,
            "evolution": evolution,
        },
        arrow=True,
    )
    return replace(declared, input_problem=function.input_problem)
