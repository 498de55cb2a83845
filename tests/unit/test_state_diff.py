"""Which keys' state a call changed, for list state: random states against plain Python.

A key whose returned state differs from its stored state in any way (a value, a null, a
NaN, a length, a null list) must be written as a change, or the snapshot loses it; a key
returned as it was need not be. The reference compares Python lists and reuses nothing of
the project.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from pyspark_abs.operators.contract import Clock, KeyGroupContext, KeyGroupResult, TimeoutMode
from pyspark_abs.operators.key_group import run_key_group
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.state_diff import Converted
from tests.support.inputs import arrow_schema

COLUMNS = {
    "score": pa.float64(),
    "floats": pa.list_(pa.float64()),
    "ints": pa.list_(pa.int64()),
    "nested": pa.list_(pa.list_(pa.int64())),
}


def same(a: Any, b: Any) -> bool:
    """Equal as the state diff means it: nulls equal nulls, NaN equals NaN."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def value(rng: random.Random, column: str) -> Any:
    if column == "floats":
        return rng.choice([None, 0.5, -1.0, math.nan, 3.0])
    if column == "ints":
        return rng.choice([None, 0, 1, -7, 2**40])
    return rng.choice([None, [], [1], [1, None], [2, 3]])


def cell(rng: random.Random, column: str) -> Any:
    if column == "score":
        return value(rng, "floats")
    if rng.random() < 0.15:
        return None
    return [value(rng, column) for _ in range(rng.randrange(0, 4))]


def changed(rng: random.Random, column: str, old: Any) -> Any:
    """``old``, or a copy of it with one thing changed (possibly to an equal value)."""
    if old is None or column == "score" or rng.random() < 0.2:
        return old if rng.random() < 0.5 else cell(rng, column)
    new = list(old)
    how = rng.choice(["same", "set", "append", "drop", "empty"])
    if how == "set" and new:
        new[rng.randrange(len(new))] = value(rng, column)
    elif how == "append":
        new.append(value(rng, column))
    elif how == "drop" and new:
        new.pop()
    elif how == "empty":
        new = []
    return new


@pytest.mark.parametrize("seed", range(30))
def test_a_key_is_written_exactly_when_its_list_state_changed(seed: int) -> None:
    rng = random.Random(seed)
    keys = list(range(rng.randrange(1, 40)))
    stored = {k: {c: cell(rng, c) for c in COLUMNS} for k in keys}
    returned = {k: {c: changed(rng, c, stored[k][c]) for c in COLUMNS} for k in keys}

    def function(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> Any:
        # Python lists, not NumPy arrays: pandas would turn a null in a float list into NaN
        columns = {c: pd.Series([returned[k][c] for k in keys], dtype=object) for c in COLUMNS}
        return KeyGroupResult(state=pd.DataFrame({"k": keys, **columns}))

    plan = OperatorPlan(
        name="lists",
        key_columns=("k",),
        input_schema=pa.schema([pa.field("k", pa.int64())]),
        state_schema=pa.schema([pa.field(c, t) for c, t in COLUMNS.items()]),
        outputs=(),
        timeout=TimeoutMode.NONE,
        function=function,
    )
    state = pa.Table.from_pylist(
        [{"k": k, **stored[k], "_timeout": None} for k in keys], schema=plan.blob_schema
    )
    rows = pd.DataFrame({"k": pd.Series(keys, dtype="int64")})
    outcome = run_key_group(plan, 0, rows, state, Clock(0, None), 1)

    expected = sorted(
        k for k in keys if not all(same(stored[k][c], returned[k][c]) for c in COLUMNS)
    )
    written = outcome.changes.column("k").to_pylist()
    assert sorted(written, key=lambda k: -1 if k is None else k) == expected
    assert [not w for w in outcome.kept.tolist()] == [k in expected for k in keys]


def test_a_frame_returned_as_state_and_output_is_converted_once_unless_its_nans_differ() -> None:
    convert = Converted("UTC")
    counts = pd.DataFrame({"k": ["a"], "n": [1], "tags": [["x"]]})
    whole = arrow_schema(("k", pa.string()), ("n", pa.int64()), ("tags", pa.list_(pa.string())))
    as_output = convert(counts, whole, "output")
    assert convert(counts, whole, "state", nan_is_null=False) is as_output

    scores = pd.DataFrame({"k": ["a"], "score": pd.Series([math.nan], dtype=object)})
    floats = arrow_schema(("k", pa.string()), ("score", pa.float64()))
    output = convert(scores, floats, "output")
    state = convert(scores, floats, "state", nan_is_null=False)
    assert output.column("score").null_count == 1  # a NaN output is null, as in Spark
    assert state.column("score").null_count == 0  # a NaN state value stays NaN
    assert math.isnan(state.column("score")[0].as_py())
