"""No value changes on its way through pandas: nulls are None (state) or pd.NA (columns),
integers never pass through float, and one key's nulls leave another key's values alone.

The reference is plain Python values; the functions under test are the conversions at the
operator's edges and a per-key operator run on one key group.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import Row

from pyspark_abs.operators.contract import Clock, TimeoutMode
from pyspark_abs.operators.key_group import run_key_group
from pyspark_abs.operators.key_state import KeyState
from pyspark_abs.operators.per_key import PerKeyAdapter
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.schema import NULL_MASK_PREFIX, exact_columns, to_frame
from tests.support.inputs import arrow_schema

BIG = 2**60 + 1
STATE = arrow_schema(("n", pa.int64()), ("d", pa.float64()), ("b", pa.bool_()))


def test_a_column_with_nulls_becomes_nullable_and_keeps_every_integer() -> None:
    table = pa.table(
        {
            "n": pa.array([BIG, None], pa.int64()),
            "d": pa.array([math.nan, None], pa.float64()),
            "b": pa.array([True, None]),
            "whole": pa.array([BIG, 3], pa.int64()),
        }
    )
    frame = to_frame(table)
    assert [str(t) for t in frame.dtypes] == ["Int64", "Float64", "boolean", "int64"]
    assert frame["n"].tolist()[0] == BIG
    assert frame["n"].isna().tolist() == [False, True]
    assert math.isnan(frame["d"].iloc[0])
    assert frame["d"].iloc[1] is pd.NA
    assert frame["whole"].tolist() == [BIG, 3]


def test_columns_without_nulls_are_what_arrow_gives_and_a_function_may_change_them() -> None:
    table = pa.table(
        {
            "n": pa.array([BIG, 2], pa.int64()),
            "i": pa.array([7, 8], pa.int32()),
            "f": pa.array([math.nan, 1.5], pa.float32()),
            "b": pa.array([True, False]),
            "u": pa.array([1, 2], pa.uint16()),
            "s": pa.array(["x", None]),
            "none": pa.array([None, None], pa.int64()),
        }
    )
    table = pa.concat_tables([table.slice(0, 1), table.slice(1)])  # two chunks, as a chain read
    frame = to_frame(table)
    arrow = table.drop_columns(["none"]).to_pandas()
    pd.testing.assert_frame_equal(frame.drop(columns=["none"]), arrow, check_exact=True)
    assert str(frame["none"].dtype) == "Int64"
    frame.loc[0, "n"] = 1  # the state frame belongs to the function, which may write to it
    frame.loc[0, "i"] = 1
    assert table.column("n").to_pylist() == [BIG, 2]
    assert table.column("i").to_pylist() == [7, 8]


def test_masked_input_columns_are_whole_again_and_the_masks_dropped() -> None:
    rows = pd.DataFrame(
        {
            "n": np.array([BIG, 0], dtype=np.int64),
            NULL_MASK_PREFIX + "n": [False, True],
            "i": np.array([7, 8], dtype=np.int32),
            NULL_MASK_PREFIX + "i": [False, False],
            "s": ["x", None],
        }
    )
    exact = exact_columns(rows)
    assert list(exact.columns) == ["n", "i", "s"]
    assert str(exact["n"].dtype) == "Int64"
    assert str(exact["i"].dtype) == "int32"
    assert exact["n"].iloc[0] == BIG
    assert exact["n"].iloc[1] is pd.NA


def _plan(function: Any, state_schema: pa.Schema = STATE) -> OperatorPlan:
    return OperatorPlan(
        name="probe",
        key_columns=("k",),
        input_schema=arrow_schema(("k", pa.string()), ("v", pa.int64())),
        state_schema=state_schema,
        outputs=(("output", arrow_schema(("k", pa.string()), ("v", pa.int64()))),),
        timeout=TimeoutMode.NONE,
        function=PerKeyAdapter(function, ("k",), TimeoutMode.NONE),
    )


def test_one_keys_nulls_leave_another_keys_state_and_outputs_exact() -> None:
    seen: dict[str, dict[str, Any]] = {}
    new: dict[str, dict[str, Any]] = {
        "big": {"n": BIG + 2, "d": math.nan, "b": False},
        "nul": {"n": None, "d": None, "b": None},
    }

    def probe(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
        seen[key[0]] = state.get()
        state.update(new[key[0]])
        return {"k": key[0], "v": rows["v"].iloc[0]}

    plan = _plan(probe)
    stored: list[dict[str, Any]] = [
        {"k": "big", "n": BIG, "d": math.nan, "b": True, "_timeout": None},
        {"k": "nul", "n": None, "d": None, "b": None, "_timeout": None},
    ]
    state = pa.Table.from_pylist(stored, schema=plan.blob_schema)
    rows = pd.DataFrame({"k": ["big", "nul"], "v": pd.array([BIG, None], dtype="Int64")})
    outcome = run_key_group(plan, 0, rows, state, Clock(0, None), 1)

    assert seen["nul"] == {"n": None, "d": None, "b": None}
    assert seen["big"]["n"] == BIG
    assert type(seen["big"]["n"]) is int
    assert math.isnan(seen["big"]["d"])
    assert seen["big"]["b"] is True
    written = {r["k"]: r for r in outcome.state.to_pylist()}
    assert written["big"]["n"] == BIG + 2
    assert math.isnan(written["big"]["d"])
    assert written["nul"] == {"k": "nul", "n": None, "d": None, "b": None, "_timeout": None}
    assert sorted(outcome.outputs[0].to_pylist(), key=lambda r: r["k"]) == [
        {"k": "big", "v": BIG},
        {"k": "nul", "v": None},
    ]


NESTED = arrow_schema(
    ("a", pa.list_(pa.int64())),
    ("m", pa.map_(pa.string(), pa.float64())),
    ("s", pa.struct([("x", pa.int64()), ("y", pa.list_(pa.float64()))])),
)


def test_nested_state_is_exact_at_every_depth_in_spark_groupstate_forms() -> None:
    """Arrays are lists, maps dicts, structs Rows (as Spark's GroupState gives them); a null
    inside one key's array leaves another key's integers whole; a NaN inside stays NaN."""
    seen: dict[str, dict[str, Any]] = {}

    def probe(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
        old = seen[key[0]] = state.get()
        if key[0] == "big":
            state.update({"a": [*old["a"], BIG], "m": {**old["m"], "n": None}, "s": old["s"]})
        else:
            state.update(old)  # written back as read: Rows, dicts and lists
        return None

    stored: list[dict[str, Any]] = [
        {"k": "big", "a": [BIG, 5], "m": [("k", math.nan)], "s": {"x": BIG, "y": [math.nan, 1.0]}},
        {"k": "nul", "a": [1, None], "m": [("j", None)], "s": {"x": None, "y": None}},
    ]
    plan = _plan(probe, NESTED)
    state = pa.Table.from_pylist([{**r, "_timeout": None} for r in stored], schema=plan.blob_schema)
    rows = pd.DataFrame({"k": ["big", "nul"], "v": [1, 2]})
    outcome = run_key_group(plan, 0, rows, state, Clock(0, None), 1)

    assert seen["big"]["a"] == [BIG, 5]
    assert [type(v) for v in seen["big"]["a"]] == [int, int]
    assert list(seen["big"]["m"]) == ["k"]
    assert math.isnan(seen["big"]["m"]["k"])
    assert isinstance(seen["big"]["s"], Row)
    assert seen["big"]["s"].x == BIG
    assert math.isnan(seen["big"]["s"]["y"][0])
    assert seen["nul"] == {"a": [1, None], "m": {"j": None}, "s": Row(x=None, y=None)}
    written = {r["k"]: r for r in outcome.state.to_pylist()}
    assert written["big"]["a"] == [BIG, 5, BIG]
    assert written["big"]["m"][1] == ("n", None)
    assert math.isnan(written["big"]["m"][0][1])
    assert math.isnan(written["big"]["s"]["y"][0])
    assert written["big"]["s"]["x"] == BIG
    assert outcome.changes.column("k").to_pylist() == ["big"]  # "nul" is as it was


def test_nested_values_go_out_in_every_form_spark_takes() -> None:
    """A struct as a Row (by name), a tuple (by position) or a dict; an array as a list or a
    NumPy array; a map as a dict or pairs: in state and in outputs alike."""
    forms: dict[str, dict[str, Any]] = {
        "row": {"a": np.array([BIG, 1]), "m": {"k": 1.5}, "s": Row(y=[2.5], x=BIG)},
        "tuple": {"a": (BIG, None), "m": [("k", None)], "s": (BIG, [math.nan])},
        "dict": {"a": [], "m": {}, "s": {"x": None, "y": None}},
    }
    struct = pa.struct([("x", pa.int64()), ("y", pa.list_(pa.float64()))])
    output = arrow_schema(("k", pa.string()), ("s", struct))

    def probe(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
        state.update(forms[key[0]])
        return {"k": key[0], "s": forms[key[0]]["s"]}

    plan = replace(_plan(probe, NESTED), outputs=(("output", output),))
    state = pa.Table.from_pylist([], schema=plan.blob_schema)
    rows = pd.DataFrame({"k": list(forms), "v": [1, 2, 3]})
    outcome = run_key_group(plan, 0, rows, state, Clock(0, None), 1)

    written = {r["k"]: r for r in outcome.state.to_pylist()}
    assert written["row"]["a"] == [BIG, 1]
    assert written["row"]["s"] == {"x": BIG, "y": [2.5]}
    assert written["tuple"]["a"] == [BIG, None]
    assert written["tuple"]["m"] == [("k", None)]
    assert written["tuple"]["s"]["x"] == BIG
    assert math.isnan(written["tuple"]["s"]["y"][0])  # kept in state
    assert written["dict"]["s"] == {"x": None, "y": None}
    out = {r["k"]: r["s"] for r in outcome.outputs[0].to_pylist()}
    assert out == {
        "row": {"x": BIG, "y": [2.5]},
        "tuple": {"x": BIG, "y": [None]},  # a NaN in an output is null, as in Spark
        "dict": {"x": None, "y": None},
    }
