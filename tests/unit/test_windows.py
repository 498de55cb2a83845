"""Tumbling and session windows, without Spark: random schedules against a plain model.

The model keeps each key's open windows as Python dicts and applies the rules the user
guide states; it reuses nothing of the project.
"""

from __future__ import annotations

import datetime as dt
import random
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

from pyspark_abs import OperatorDefinitionError, session_window, tumbling_window
from pyspark_abs.operators.contract import Clock, Operator
from pyspark_abs.operators.key_group import run_key_group
from pyspark_abs.operators.plan import OperatorPlan
from tests.support.inputs import arrow_schema
from tests.support.windows_model import Model

SIZE_MS, GAP_MS = 1_000, 700
AGGREGATES = {
    "n": "count(*)",
    "seen": "count(amount)",
    "spent": "sum(amount)",
    "top": "max(amount)",
}
INPUT = arrow_schema(
    ("user", pa.string()), ("ts", pa.timestamp("us", "UTC")), ("amount", pa.float64())
)
LISTS = ("window_start", "window_end", "n", "seen", "spent", "top")
TYPES: tuple[pa.DataType, ...] = (pa.int64(),) * 4 + (pa.float64(),) * 2
OUT = arrow_schema(
    ("user", pa.string()),
    ("window_start", pa.timestamp("us", "UTC")),
    ("window_end", pa.timestamp("us", "UTC")),
    *zip(LISTS[2:], TYPES[2:], strict=True),
)


def plan(op: Operator) -> OperatorPlan:
    return OperatorPlan(
        name=op.name,
        key_columns=op.key,
        input_schema=INPUT,
        state_schema=pa.schema(
            [pa.field(c, pa.list_(t)) for c, t in zip(LISTS, TYPES, strict=True)]
        ),
        outputs=(("output", OUT),),
        timeout=op.timeout,
        function=op.function,
        event_time="ts",
    )


def ms(stamp: Any) -> int:
    return int(pd.Timestamp(stamp).value // 1_000_000)


@pytest.mark.parametrize("session", [False, True], ids=["tumbling", "session"])
@pytest.mark.parametrize("seed", range(20))
def test_random_schedules_emit_each_window_once_as_the_model_does(seed: int, session: bool) -> None:
    key, one_ms = {"user": "string"}, dt.timedelta(milliseconds=1)
    op = (
        session_window(key=key, time="ts", gap=GAP_MS * one_ms, aggregates=AGGREGATES, name="w")
        if session
        else tumbling_window(
            key=key, time="ts", size=SIZE_MS * one_ms, aggregates=AGGREGATES, name="w"
        )
    )
    runner = plan(op)
    rng = random.Random(seed)
    state = runner.blob_schema.empty_table()
    model = Model(session, GAP_MS if session else SIZE_MS)
    watermark: int | None = None
    newest = 0
    for epoch in range(10):
        events = [
            (
                rng.choice(["a", "b", None]),
                (watermark or 0) + rng.randrange(-300, 2_000),
                rng.choice([None, 1.0, 2.0, 5.0]),
            )
            for _ in range(rng.randrange(0, 6))
        ]
        frame = pd.DataFrame(
            {
                "user": pd.Series([u for u, _, _ in events], dtype=object),
                "ts": pd.to_datetime([t for _, t, _ in events], unit="ms", utc=True),
                "amount": pd.Series([a for _, _, a in events], dtype="float64"),
            }
        )
        outcome = run_key_group(runner, 0, frame, state, Clock(0, watermark), epoch)
        expected = model.epoch(events, watermark)
        got = [
            (
                r["user"],
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
        stored = sorted((tuple(r.values()) for r in outcome.state.to_pylist()), key=str)
        assert stored == model.state(), f"seed {seed}, epoch {epoch}"
        state = outcome.state
        newest = max([newest, *(t for _, t, _ in events)])
        watermark = newest - rng.choice([0, 200, 900])


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
