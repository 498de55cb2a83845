"""Tumbling and session windows, without Spark: random schedules against a plain model.

The model keeps each key's open windows as Python dicts and applies the rules the user
guide states; it reuses nothing of the project.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.types import (
    DecimalType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pyspark_abs import session_window, tumbling_window
from pyspark_abs.errors import OperatorDefinitionError
from pyspark_abs.operators.contract import Clock, Operator
from pyspark_abs.operators.key_group import run_key_group
from pyspark_abs.operators.plan import OperatorPlan
from tests.support.inputs import arrow_schema
from tests.support.windows_model import Model

SIZE_MS, GAP_MS = 1_000, 700
LISTS = ("window_start", "window_end", "n", "seen", "spent", "top")


@dataclass(frozen=True)
class Shape:
    """The keys and aggregates of one kind of window operator under test."""

    key: dict[str, str]
    key_types: tuple[pa.DataType, ...]
    amount: pa.DataType
    aggregates: dict[str, str]

    def plan(self, op: Operator) -> OperatorPlan:
        keys = tuple(zip(self.key, self.key_types, strict=True))
        amount_type = pa.float64() if self.amount == pa.float64() else pa.int64()
        types = (pa.int64(),) * 4 + (amount_type,) * 2
        return OperatorPlan(
            name=op.name,
            key_columns=op.key,
            input_schema=arrow_schema(
                *keys, ("ts", pa.timestamp("us", "UTC")), ("amount", self.amount)
            ),
            state_schema=pa.schema(
                [pa.field(c, pa.list_(t)) for c, t in zip(LISTS, types, strict=True)]
            ),
            outputs=(
                (
                    "output",
                    arrow_schema(
                        *keys,
                        ("window_start", pa.timestamp("us", "UTC")),
                        ("window_end", pa.timestamp("us", "UTC")),
                        *zip(LISTS[2:], types[2:], strict=True),
                    ),
                ),
            ),
            timeout=op.timeout,
            function=op.function,
            event_time="ts",
            arrow=op.arrow,
        )

    def keys(self, rng: random.Random) -> Any:
        """A random key: one value, or a tuple of one per key column."""
        user = rng.choice(["a", "b", None])
        return user if len(self.key) == 1 else (user, rng.choice([1, 7, None]))


SHAPES = {
    # doubles: sums and maxima of a double column
    "one_key": Shape(
        {"user": "string"},
        (pa.string(),),
        pa.float64(),
        {"n": "count(*)", "seen": "count(amount)", "spent": "sum(amount)", "top": "max(amount)"},
    ),
    # a key of two columns, one of them a number, and bigint sums and maxima
    "two_keys": Shape(
        {"user": "string", "region": "bigint"},
        (pa.string(), pa.int64()),
        pa.int64(),
        {
            "n": "count(*)",
            "seen": "count(amount)",
            "spent": "sum(amount) bigint",
            "top": "max(amount) bigint",
        },
    ),
}


def ms(stamp: Any) -> int:
    return int(pd.Timestamp(stamp).value // 1_000_000)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("session", [False, True], ids=["tumbling", "session"])
@pytest.mark.parametrize("seed", range(20))
def test_random_schedules_emit_each_window_once_as_the_model_does(
    seed: int, session: bool, shape: str
) -> None:
    kind, one_ms = SHAPES[shape], dt.timedelta(milliseconds=1)
    key, aggregates = kind.key, kind.aggregates
    op = (
        session_window(key=key, time="ts", gap=GAP_MS * one_ms, aggregates=aggregates, name="w")
        if session
        else tumbling_window(
            key=key, time="ts", size=SIZE_MS * one_ms, aggregates=aggregates, name="w"
        )
    )
    runner = kind.plan(op)
    rng = random.Random(seed)
    amounts = [None, 1.0, 2.0, 5.0] if kind.amount == pa.float64() else [None, 1, -4, 9]
    state = runner.blob_schema.empty_table()
    model = Model(session, GAP_MS if session else SIZE_MS)
    watermark: int | None = None
    newest = 0
    for epoch in range(10):
        events = [
            (
                kind.keys(rng),
                (watermark or 0) + rng.randrange(-300, 2_000),
                rng.choice(amounts),
            )
            for _ in range(rng.randrange(0, 6))
        ]
        outcome = run_key_group(runner, 0, frame(kind, events), state, Clock(0, watermark), epoch)
        expected = model.epoch(events, watermark)
        width = len(kind.key)
        got = [
            (
                key_of(r, kind),
                ms(r["window_start"]),
                ms(r["window_end"]),
                r["n"],
                r["seen"],
                r["spent"],
                r["top"],
            )
            for r in outcome.outputs[0].to_pylist()
        ]
        assert sorted(got, key=str) == expected, f"seed {seed}, epoch {epoch}"
        stored = sorted(
            ((key_of(r, kind), *list(r.values())[width:]) for r in outcome.state.to_pylist()),
            key=str,
        )
        assert stored == model.state(), f"seed {seed}, epoch {epoch}"
        state = outcome.state
        newest = max([newest, *(t for _, t, _ in events)])
        watermark = newest - rng.choice([0, 200, 900])


def frame(kind: Shape, events: list[tuple[Any, int, Any]]) -> pd.DataFrame:
    """The events as the operator gets them: key columns, ``ts`` and ``amount``."""
    keys = [k if len(kind.key) > 1 else (k,) for k, _, _ in events]
    columns: dict[str, Any] = {
        name: pd.Series([k[i] for k in keys], dtype="Int64" if t == pa.int64() else object)
        for i, (name, t) in enumerate(zip(kind.key, kind.key_types, strict=True))
    }
    columns["ts"] = pd.to_datetime([t for _, t, _ in events], unit="ms", utc=True)
    dtype = "float64" if kind.amount == pa.float64() else "Int64"
    columns["amount"] = pd.Series([a for _, _, a in events], dtype=dtype)
    return pd.DataFrame(columns)


def key_of(row: dict[str, Any], kind: Shape) -> Any:
    """A row's key, as :meth:`Shape.keys` makes them."""
    values = tuple(row[k] for k in kind.key)
    return values[0] if len(values) == 1 else values


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"aggregates": {"n": "avg(x)"}}, r"'avg\(x\)' is not one of"),
        ({"aggregates": {"n": "sum(*)"}}, r"only count takes \*"),
        ({"aggregates": {}}, "non-empty dict"),
        ({"aggregates": {"user": "count(*)"}}, r"clash with the key columns"),
        ({"key": "user"}, "must map each key column to its type"),
        ({"size": dt.timedelta(0)}, r"size= must be a datetime.timedelta of at least 1 ms"),
        ({"time": "user"}, "must name the event-time column"),
    ],
)
def test_bad_window_declarations_say_what_to_fix(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {
        "key": {"user": "string"},
        "time": "ts",
        "size": dt.timedelta(minutes=5),
        "aggregates": {"n": "count(*)"},
        "name": "w",
        **kwargs,
    }
    with pytest.raises(OperatorDefinitionError, match=message):
        tumbling_window(**args)


def test_a_source_that_does_not_fit_the_windows_is_described() -> None:
    op = session_window(
        key={"user": "string"},
        time="ts",
        gap=dt.timedelta(minutes=30),
        aggregates={"n": "count(*)", "paid": "count(amount)", "spent": "sum(amount)"},
        name="visits",
    )
    assert op.input_problem is not None
    fits = StructType(
        [
            StructField("user", StringType()),
            StructField("ts", TimestampType()),
            StructField("amount", DecimalType(10, 2)),
        ]
    )
    assert op.input_problem(fits, "ts") is None
    lacking = StructType([StructField("user", StringType()), StructField("when", TimestampType())])
    problem = op.input_problem(lacking, "when")
    assert problem is not None
    assert "no column(s) ['ts', 'amount']" in problem
    assert "it has ['user', 'when']" in problem
    other = op.input_problem(StructType([*fits.fields, StructField("at", TimestampType())]), "at")
    assert other is not None
    assert "watermark is on 'at'" in other
    assert "withWatermark('ts'" in other
    text = StructType([*fits.fields[:2], StructField("amount", StringType())])
    problem = op.input_problem(text, "ts")
    assert problem is not None
    assert "'spent' is sum(amount), but 'amount' is string, not a number" in problem
    counted = tumbling_window(
        key={"user": "string"},
        time="ts",
        size=dt.timedelta(minutes=5),
        aggregates={"paid": "count(amount)"},
        name="w",
    )
    assert counted.input_problem is not None
    assert counted.input_problem(text, "ts") is None  # any column can be counted
