"""The Arrow form of a vectorized operator: tables in, tables out, checked like frames.

The reference is a plain-Python word count (a dict of counts); the pandas form on the same
epochs must give the same snapshots.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections import Counter
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pyspark_abs import ArrowContext, Clock, KeyGroupResult, TimeoutMode, arrow_operator
from pyspark_abs.errors import OperatorDefinitionError, SchemaMismatchError
from pyspark_abs.operators.key_group import run_key_group
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.schema import castable
from tests.support.inputs import arrow_schema
from tests.support.key_groups import (
    CLOCK,
    EPOCHS,
    LIMIT,
    OUTPUT,
    assert_kept_rows,
    rows,
    run_epochs,
    sort,
    vectorized,
    word_plan,
)


def arrow_count(rows: pa.Table, state: pa.Table, ctx: ArrowContext) -> KeyGroupResult:
    """The word count of ``tests.unit.test_execution.vectorized``, on Arrow tables."""
    seen = rows.group_by("word").aggregate([("word", "count")])
    at: Any = pc.index_in(seen["word"], value_set=state["word"])
    taken: Any = pc.take(state["count"], at)
    held: Any = pc.fill_null(taken, 0)
    counts: Any = pc.add(seen["word_count"], held)
    over: Any = pc.greater(counts, pa.scalar(LIMIT))
    merged = pa.Table.from_arrays([seen["word"], counts], names=["word", "count"])
    kept = merged.filter(pc.invert(over))
    return KeyGroupResult(state=kept, removed=merged.filter(over).select(["word"]), output=kept)


def arrow_plan(function: Any = arrow_count, **fields: Any) -> OperatorPlan:
    return dataclasses.replace(word_plan(function, **fields), arrow=True)


def model(epochs: list[pd.DataFrame]) -> list[dict[str, int]]:
    """The state after each epoch, counted in plain Python: a count above LIMIT is dropped."""
    counts: dict[str, int] = {}
    states = []
    for frame in epochs:
        for word, n in Counter(frame["word"]).items():
            counts[word] = counts.get(word, 0) + n
            if counts[word] > LIMIT:
                del counts[word]
        states.append(dict(counts))
    return states


def test_an_arrow_operator_counts_as_the_model_and_snapshots_as_the_pandas_form() -> None:
    arrow = run_epochs(arrow_plan(), EPOCHS)
    pandas = run_epochs(word_plan(vectorized), EPOCHS)
    for outcome, expected in zip(arrow, model(EPOCHS), strict=True):
        assert {r["word"]: r["count"] for r in outcome.state.to_pylist()} == expected
    for a, b in zip(arrow, pandas, strict=True):
        assert sort(a.changes) == sort(b.changes)
        assert sort(a.outputs[0]) == sort(b.outputs[0])
        assert a.keys_delta == b.keys_delta


def test_the_function_gets_tables_of_the_declared_schemas_and_an_arrow_context() -> None:
    seen: dict[str, Any] = {}

    def look(rows: pa.Table, state: pa.Table, ctx: ArrowContext) -> None:
        seen.update(rows=rows.schema, state=state.schema, ctx=ctx)

    plan = arrow_plan(look, timeout=TimeoutMode.PROCESSING_TIME)
    state = pa.table(
        {"word": ["a", "b"], "count": [1, 2], "_timeout": [500, 5_000]}, schema=plan.blob_schema
    )
    run_key_group(plan, 3, rows("b"), state, CLOCK, 4)
    assert seen["rows"] == plan.input_schema
    assert seen["state"] == plan.blob_schema
    assert isinstance(seen["ctx"], ArrowContext)
    assert seen["ctx"].timed_out.to_pylist() == [{"word": "a"}]
    assert (seen["ctx"].key_group, seen["ctx"].epoch) == (3, 4)


def test_returned_columns_are_cast_to_the_declared_types() -> None:
    def narrow(rows: pa.Table, state: pa.Table, ctx: ArrowContext) -> KeyGroupResult:
        counts = pa.table({"count": pa.array([7], pa.int8()), "word": ["a"]})  # any order
        return KeyGroupResult(state=counts, output=counts)

    outcome = run_key_group(arrow_plan(narrow), 0, rows("a"), _empty(), CLOCK, 0)
    assert outcome.outputs[0].schema == OUTPUT[0][1]
    assert sort(outcome.changes) == [{"word": "a", "count": 7, "_timeout": None, "_deleted": False}]


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (
            KeyGroupResult(output=pa.table({"word": ["a"], "count": ["many"]})),
            "operator 'wc', epoch 0, key group 0: output 'output': column 'count' of type "
            "string cannot be converted to int64",
        ),
        (
            KeyGroupResult(state=pa.table({"word": [1.5], "count": [1]})),
            "operator 'wc', epoch 0, key group 0: returned state: column 'word' of type double "
            "cannot be converted to string: only numbers become numbers",
        ),
        (
            KeyGroupResult(output=pa.table({"word": ["a"], "count": [True]})),
            "output 'output': column 'count' of type bool cannot be converted to int64",
        ),
        (
            KeyGroupResult(state=pa.table({"word": ["a"]})),
            "operator 'wc', epoch 0, key group 0: returned state: missing column(s) ['count']",
        ),
        (
            KeyGroupResult(output=[{"word": "a", "count": 1}]),  # type: ignore[arg-type]
            "must be a DataFrame or a pyarrow.Table, or a dict of them, got list",
        ),
    ],
)
def test_returned_tables_that_do_not_fit_are_refused_by_name(
    returned: KeyGroupResult, message: str
) -> None:
    plan = arrow_plan(lambda rows, state, ctx: returned)
    with pytest.raises(SchemaMismatchError) as raised:
        run_key_group(plan, 0, rows("a"), _empty(), CLOCK, 0)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("source", "target", "cast"),
    [
        (pa.int32(), pa.int64(), True),
        (pa.float32(), pa.decimal128(10, 2), True),
        (pa.null(), pa.string(), True),
        (pa.dictionary(pa.int8(), pa.string()), pa.string(), True),
        (pa.large_string(), pa.string(), True),
        (pa.timestamp("ms"), pa.timestamp("us", "UTC"), True),
        (pa.list_(pa.int32()), pa.large_list(pa.int64()), True),
        (pa.struct([("a", pa.int8()), ("b", pa.bool_())]), pa.struct([("a", pa.int64())]), True),
        (pa.map_(pa.string(), pa.int8()), pa.map_(pa.string(), pa.float64()), True),
        (pa.float64(), pa.string(), False),
        (pa.int64(), pa.bool_(), False),
        (pa.string(), pa.timestamp("us"), False),
        (pa.date32(), pa.timestamp("us"), False),
        (pa.list_(pa.float64()), pa.list_(pa.string()), False),
        (pa.struct([("a", pa.int8())]), pa.struct([("b", pa.int8())]), False),
        (pa.map_(pa.string(), pa.int8()), pa.map_(pa.int8(), pa.int8()), False),
    ],
)
def test_returned_columns_are_cast_only_within_their_kind(
    source: pa.DataType, target: pa.DataType, cast: bool
) -> None:
    assert castable(source, target) is cast


def test_a_nan_stays_nan_in_arrow_outputs_and_state() -> None:
    plan = arrow_plan(
        lambda rows, state, ctx: KeyGroupResult(
            state=pa.table({"word": ["a"], "score": [math.nan]}),
            output=pa.table({"word": ["a"], "score": [math.nan]}),
        ),
        state_schema=arrow_schema(("score", pa.float64())),
        outputs=(("output", arrow_schema(("word", pa.string()), ("score", pa.float64()))),),
    )
    outcome = run_key_group(plan, 0, rows("a"), plan.blob_schema.empty_table(), CLOCK, 0)
    assert math.isnan(outcome.outputs[0]["score"][0].as_py())
    assert math.isnan(outcome.state["score"][0].as_py())


def test_naive_timestamps_returned_are_wall_clock_times_in_the_session_zone() -> None:
    instants = arrow_schema(("word", pa.string()), ("at", pa.timestamp("us", "UTC")))

    def stamp(rows: pa.Table, state: pa.Table, ctx: ArrowContext) -> KeyGroupResult:
        naive = pa.array([dt.datetime(2026, 7, 1, 12, 0)], pa.timestamp("us"))
        return KeyGroupResult(output=pa.table({"word": ["a"], "at": naive}))

    plan = arrow_plan(stamp, outputs=(("output", instants),), time_zone="Europe/Berlin")
    outcome = run_key_group(plan, 0, rows("a"), _empty(), CLOCK, 0)
    assert outcome.outputs[0]["at"][0].as_py() == dt.datetime(2026, 7, 1, 10, 0, tzinfo=dt.UTC)


def test_instants_arrive_tagged_with_the_session_zone_as_in_spark_arrow_functions() -> None:
    """Spark's ``applyInArrow`` tags instants with the session time zone (nested ones too);
    the values stay the same instants, so Arrow's calendar functions work in local time."""
    at = pa.timestamp("us", "UTC")
    nested = pa.struct([("first", at), ("seen", pa.list_(at))])
    seen: dict[str, Any] = {}

    def look(rows: pa.Table, state: pa.Table, ctx: ArrowContext) -> KeyGroupResult:
        seen.update(rows=rows, state=state, keys=ctx.timed_out)
        return KeyGroupResult(state=state.drop_columns(["_timeout"]))

    plan = dataclasses.replace(
        arrow_plan(
            look,
            state_schema=arrow_schema(("visits", nested)),
            timeout=TimeoutMode.PROCESSING_TIME,
            time_zone="Asia/Kolkata",
        ),
        key_columns=("at",),
        input_schema=arrow_schema(("at", at), ("word", pa.string())),
    )
    noon = dt.datetime(2026, 7, 1, 12, 0, tzinfo=dt.UTC)
    visit = {"first": noon, "seen": [noon, None]}
    state = pa.table({"at": [noon], "visits": [visit], "_timeout": [500]}, schema=plan.blob_schema)
    outcome = run_key_group(plan, 0, pd.DataFrame({"at": [], "word": []}), state, CLOCK, 0)
    zoned = pa.timestamp("us", "Asia/Kolkata")
    assert seen["state"].schema.field("at").type == zoned
    assert seen["state"].schema.field("visits").type == pa.struct(
        [("first", zoned), ("seen", pa.list_(zoned))]
    )
    assert seen["keys"].schema.field("at").type == zoned
    assert seen["rows"].schema.field("at").type == zoned
    assert pc.hour(seen["state"]["at"]).to_pylist() == [17]  # 12:00Z is 17:30 in Kolkata
    assert seen["state"]["visits"].to_pylist() == [visit]  # the same instants
    assert outcome.state.schema == plan.blob_schema  # stored in UTC again, the same instants
    unset = ["_timeout"]  # the timeout fired and was not set again
    assert outcome.state.drop_columns(unset).to_pylist() == state.drop_columns(unset).to_pylist()


def test_a_nan_inside_an_input_array_stays_apart_from_a_null() -> None:
    """PySpark's pandas rows keep them apart inside nested values; so does the Arrow form
    (a top-level float null is NaN there, so both arrive as null: documented)."""
    seen: list[Any] = []

    def look(rows: pa.Table, state: pa.Table, ctx: ArrowContext) -> None:
        seen.extend(rows["scores"].to_pylist())

    plan = dataclasses.replace(
        arrow_plan(look),
        input_schema=arrow_schema(("word", pa.string()), ("scores", pa.list_(pa.float64()))),
    )
    scores = [np.array([math.nan, None, 1.5], dtype=object), None]
    run_key_group(plan, 0, pd.DataFrame({"word": ["a", "b"], "scores": scores}), _empty(), CLOCK, 0)
    assert math.isnan(seen[0][0])
    assert seen[0][1:] == [None, 1.5]
    assert seen[1] is None


@pytest.mark.parametrize(
    "micros",
    [
        pd.Series([1_700_000_000_123_456, -1]),
        pd.Series(pd.array([1_700_000_000_123_456, None], dtype="Int64")),
        pd.Series([1_700_000_000_123_456.0, math.nan]),  # a watermark column
    ],
    ids=["whole", "nullable", "float"],
)
def test_instants_sent_as_microseconds_reach_the_arrow_form_exactly(micros: pd.Series) -> None:
    seen: list[Any] = []

    def look(rows: pa.Table, state: pa.Table, ctx: ArrowContext) -> None:
        seen.append(rows["at"])

    plan = dataclasses.replace(
        arrow_plan(look, time_zone="Europe/Berlin"),
        input_schema=arrow_schema(("word", pa.string()), ("at", pa.timestamp("us", "UTC"))),
    )
    run_key_group(plan, 0, pd.DataFrame({"word": ["a", "b"], "at": micros}), _empty(), CLOCK, 0)
    (column,) = seen
    assert column.type == pa.timestamp("us", "Europe/Berlin")
    expected = [None if pd.isna(m) else int(m) for m in micros]
    assert column.cast(pa.int64()).to_pylist() == expected


def test_an_arrow_operator_may_return_frames_and_a_pandas_one_tables() -> None:
    frames = arrow_plan(
        lambda rows, state, ctx: KeyGroupResult(
            state=pd.DataFrame({"word": ["a"], "count": [1]}),
            output=pd.DataFrame({"word": ["a"], "count": [1]}),
        )
    )
    tables = word_plan(
        lambda rows, state, ctx: KeyGroupResult(
            state=pa.table({"word": ["a"], "count": [1]}),
            output=pa.table({"word": ["a"], "count": [1]}),
        ),
    )
    for plan in (frames, tables):
        outcome = run_key_group(plan, 0, rows("a"), _empty(), CLOCK, 0)
        assert_kept_rows(_empty(), outcome)
        assert outcome.outputs[0].to_pylist() == [{"word": "a", "count": 1}]


def test_an_arrow_declaration_is_checked_like_any_other() -> None:
    def count(rows: pa.Table, state: pa.Table, ctx: ArrowContext) -> None:
        return None

    declared = arrow_operator(key="word", state_schema="count long", output_schema="word string")
    assert declared(count).arrow
    with pytest.raises(OperatorDefinitionError, match="declare exactly one of output_schema="):
        arrow_operator(key="word", state_schema="count long")(count)


def _empty() -> pa.Table:
    return word_plan(None).blob_schema.empty_table()


def test_an_arrow_operator_with_a_ttl_does_not_see_lapsed_keys_and_they_are_tombstoned() -> None:
    plan = arrow_plan(timeout=TimeoutMode.PROCESSING_TIME, event_time="ts", ttl_ms=10_000)
    first = run_key_group(plan, 0, rows("a", "b"), _empty(), Clock(1_000, None), 0)
    assert {r["word"]: r["_timeout"] for r in first.changes.to_pylist()} == {
        "a": 11_000,
        "b": 11_000,
    }
    second = run_key_group(plan, 0, rows("a"), first.state, Clock(12_000, None), 1)
    assert sort(second.changes) == [
        {"word": "a", "count": 1, "_timeout": 22_000, "_deleted": False},  # counted afresh
        {"word": "b", "count": None, "_timeout": None, "_deleted": True},
    ]
