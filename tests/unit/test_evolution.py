"""State schema evolution rules, without Spark: widening, comparison, and column rules."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

from pyspark_abs.errors import OperatorDefinitionError, SchemaMismatchError
from pyspark_abs.operators.evolution import (
    Change,
    StateEvolution,
    compare_state,
    evolve_rows,
    widens,
)
from pyspark_abs.operators.schema import STATELESS_COLUMN
from tests.support.inputs import arrow_schema

KEY = pa.schema([("user", pa.string())])
V1 = arrow_schema(("total", pa.int32()), ("n", pa.int32()), ("first", pa.string()))
V2 = arrow_schema(("total", pa.int64()), ("count", pa.int64()), ("mean", pa.float64()))
V2_RULES = StateEvolution(
    renamed={"n": "count"}, dropped=["first"], added={"mean": lambda s: s["total"] / s["n"]}
)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (pa.int8(), pa.int16(), True),
        (pa.int32(), pa.int64(), True),
        (pa.int64(), pa.int32(), False),
        (pa.int32(), pa.int32(), False),
        (pa.uint8(), pa.int16(), False),
        (pa.float32(), pa.float64(), True),
        (pa.float64(), pa.float32(), False),
        (pa.int32(), pa.float64(), True),
        (pa.int64(), pa.float64(), False),
        (pa.decimal128(10, 2), pa.decimal128(12, 2), True),
        (pa.decimal128(10, 2), pa.decimal128(12, 4), True),
        (pa.decimal128(10, 2), pa.decimal128(11, 4), False),
        (pa.decimal128(10, 2), pa.decimal128(12, 1), False),
        (pa.string(), pa.int64(), False),
    ],
)
def test_a_widening_loses_no_value(old: pa.DataType, new: pa.DataType, expected: bool) -> None:
    assert widens(old, new) is expected


def test_renames_drops_widenings_and_added_columns_are_classified() -> None:
    comparison = compare_state(KEY, V1, KEY, V2, V2_RULES)
    assert comparison.compatible
    assert comparison.differs
    assert {(c.column, c.change, c.source) for c in comparison.changes} == {
        ("total", Change.WIDENED, "total"),
        ("count", Change.WIDENED, "n"),
        ("mean", Change.ADDED, None),
        ("first", Change.DROPPED, None),
    }
    # count is renamed and widened at once: int -> bigint
    count = next(c for c in comparison.changes if c.column == "count")
    assert count.detail == "from 'n', int -> bigint"


def test_a_migrated_root_needs_nothing_more_although_the_rules_stay_declared() -> None:
    comparison = compare_state(KEY, V2, KEY, V2, V2_RULES)
    assert comparison.compatible
    assert not comparison.differs
    assert comparison.summary() == ""


def test_every_refused_difference_names_the_option_that_allows_it() -> None:
    declared = arrow_schema(("total", pa.string()), ("x", pa.float64()))
    comparison = compare_state(KEY, V1, KEY, declared, None)
    assert not comparison.compatible
    assert [(c.column, c.fix is not None) for c in comparison.refused] == [
        ("total", True),
        ("x", True),
        ("n", True),
        ("first", True),
    ]
    summary = comparison.summary()
    assert "StateEvolution(migrate=" in summary
    assert "StateEvolution(added={'x':" in summary
    assert "StateEvolution(dropped=['n'])" in summary


def test_migrate_covers_any_state_change_but_no_key_change() -> None:
    anything = StateEvolution(migrate=lambda frame: frame)
    declared = pa.schema([("total", pa.string())])
    assert compare_state(KEY, V1, KEY, declared, anything).compatible
    rekeyed = compare_state(KEY, V1, pa.schema([("account", pa.string())]), V1, anything)
    assert not rekeyed.compatible
    assert "write_state" in rekeyed.summary()
    retyped = compare_state(KEY, V1, pa.schema([("user", pa.int64())]), V1, None)
    assert "key column 'user' is stored as string, declared bigint" in retyped.summary()


def test_the_column_rules_rewrite_rows_and_keep_the_bookkeeping_columns() -> None:
    rows = pa.table(
        {
            "user": ["ann", "bob"],
            "total": pa.array([7, 6], pa.int32()),
            "n": pa.array([2, 3], pa.int32()),
            "first": ["a", "b"],
            "_timeout": pa.array([None, 5], pa.int64()),
        }
    )
    comparison = compare_state(KEY, V1, KEY, V2, V2_RULES)
    evolved = evolve_rows(rows, ["user"], comparison, V2, V2_RULES, "spend")
    assert evolved.column_names == ["user", "total", "count", "mean", "_timeout"]
    assert evolved.schema.field("total").type == pa.int64()
    assert evolved.to_pylist() == [
        {"user": "ann", "total": 7, "count": 2, "mean": 3.5, "_timeout": None},
        {"user": "bob", "total": 6, "count": 3, "mean": 2.0, "_timeout": 5},
    ]


def test_a_constant_value_fills_a_new_column_and_a_bad_one_is_refused() -> None:
    rows = pa.table({"user": ["ann"], "total": pa.array([1], pa.int32())})
    old = pa.schema([("total", pa.int32())])
    new = arrow_schema(("total", pa.int32()), ("tier", pa.string()))
    rules = StateEvolution(added={"tier": "basic"})
    evolved = evolve_rows(
        rows, ["user"], compare_state(KEY, old, KEY, new, rules), new, rules, "op"
    )
    assert evolved.column("tier").to_pylist() == ["basic"]

    bad = StateEvolution(added={"tier": lambda s: pd.Series(["a", "b"])})
    with pytest.raises(SchemaMismatchError, match=r"new state column 'tier'.*2 values for 1 rows"):
        evolve_rows(rows, ["user"], compare_state(KEY, old, KEY, new, bad), new, bad, "op")

    failing = StateEvolution(added={"tier": lambda s: s["missing"]})
    with pytest.raises(SchemaMismatchError, match=r"computing new state column 'tier' failed"):
        evolve_rows(rows, ["user"], compare_state(KEY, old, KEY, new, failing), new, failing, "op")


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        (StateEvolution(added={"nope": 1}), "added column 'nope' is not a declared state column"),
        (StateEvolution(renamed={"a": "nope"}), "'nope' is not a declared state column"),
        (StateEvolution(dropped=["total"]), "dropped column 'total' is a declared state column"),
        (StateEvolution(dropped="first"), "dropped= must be a list"),
        (
            StateEvolution(migrate=lambda f: f, dropped=["first"]),
            "migrate= rewrites the whole state",
        ),
        (StateEvolution(renamed={"user": "total"}), "key column 'user' cannot be evolved"),
    ],
)
def test_rules_that_contradict_the_declaration_are_refused(
    rules: StateEvolution, message: str
) -> None:
    with pytest.raises(OperatorDefinitionError, match=message):
        rules.check("spend", ("user",), V2)


STATELESS = pa.schema([(STATELESS_COLUMN, pa.bool_())])


def test_an_operator_that_becomes_stateful_needs_no_rules() -> None:
    comparison = compare_state(KEY, STATELESS, KEY, V1, None)
    assert comparison.compatible
    assert {(c.column, c.change) for c in comparison.changes} == {
        ("total", Change.ADDED),
        ("n", Change.ADDED),
        ("first", Change.ADDED),
        (STATELESS_COLUMN, Change.DROPPED),
    }
    empty = pa.table(
        {"user": pa.array([], pa.string()), STATELESS_COLUMN: pa.array([], pa.bool_())}
    )
    evolved = evolve_rows(empty, ["user"], comparison, V1, StateEvolution(), "op")
    assert evolved.schema == pa.schema([*KEY, *V1])


def test_an_operator_that_becomes_stateless_drops_its_columns_only_when_told() -> None:
    refused = compare_state(KEY, V1, KEY, STATELESS, None)
    assert [c.column for c in refused.refused] == ["total", "n", "first"]
    told = compare_state(KEY, V1, KEY, STATELESS, StateEvolution(dropped=["total", "n", "first"]))
    assert told.compatible
    assert (STATELESS_COLUMN, Change.ADDED) in {(c.column, c.change) for c in told.changes}
    rows = pa.table({"user": ["ann"], "total": [3], "n": [1], "first": ["x"]})
    dropping = StateEvolution(dropped=["total", "n", "first"])
    assert evolve_rows(rows, ["user"], told, STATELESS, dropping, "op").num_rows == 0


def test_an_added_column_is_computed_from_exact_old_values() -> None:
    """The function of an added column sees the old state with no value changed: a long
    beside a null stays whole (Int64), an array of longs beside a null too (lists)."""
    big = 2**60 + 1
    old = arrow_schema(("total", pa.int64()), ("seen", pa.list_(pa.int64())))
    new = arrow_schema(("total", pa.int64()), ("seen", pa.list_(pa.int64())), ("top", pa.int64()))
    rules = StateEvolution(
        added={"top": lambda s: s["seen"].map(lambda v: max(x for x in v if x is not None))}
    )
    rows = pa.table(
        {
            "user": ["ann", "bob"],
            "total": pa.array([big, None], pa.int64()),
            "seen": pa.array([[big, 1], [None, 2]], pa.list_(pa.int64())),
            "_timeout": pa.array([None, None], pa.int64()),
        }
    )
    comparison = compare_state(KEY, old, KEY, new, rules)
    evolved = evolve_rows(rows, ["user"], comparison, new, rules, "spend")
    assert evolved.column("top").to_pylist() == [big, 2]
    assert evolved.column("total").to_pylist() == [big, None]
