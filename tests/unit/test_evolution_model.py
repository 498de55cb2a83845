"""Generative check of the evolution rules against a model that shares no code with them.

Each seed draws a stored state schema and rows, then a random change per column (kept,
widened, renamed, renamed and widened, dropped, narrowed without a rule, dropped without a
rule) and new columns (with or without a value). The model says, in plain Python, which
columns must be refused and what each migrated row must hold.
"""

from __future__ import annotations

import decimal
import random
from typing import Any

import pyarrow as pa
import pytest

from pyspark_abs.operators.evolution import Change, StateEvolution, compare_state, evolve_rows

KEY = pa.schema([pa.field("k", pa.int64())])
# every widening the documentation promises, written out pair by pair
WIDER: dict[str, list[str]] = {
    "int8": ["int16", "int32", "int64", "float64"],
    "int16": ["int32", "int64", "float64"],
    "int32": ["int64", "float64"],
    "int64": [],
    "float32": ["float64"],
    "float64": [],
    "decimal(5,2)": ["decimal(7,2)", "decimal(8,3)"],
    "string": [],
}
NARROWER = {"int16": "int8", "int32": "int16", "int64": "int32", "float64": "float32"}
TYPES: dict[str, pa.DataType] = {
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "decimal(5,2)": pa.decimal128(5, 2),
    "decimal(7,2)": pa.decimal128(7, 2),
    "decimal(8,3)": pa.decimal128(8, 3),
    "string": pa.string(),
}


def value(rng: random.Random, kind: str) -> Any:
    if rng.random() < 0.15:
        return None
    if kind.startswith("int"):
        return rng.randint(-100, 100)
    if kind.startswith("float"):
        return rng.choice([0.5, -1.25, 3.0])
    if kind.startswith("decimal"):
        return decimal.Decimal(rng.randint(-9999, 9999)) / 100
    return rng.choice(["", "x", "ünï"])


def convert(old: Any, kind: str) -> Any:
    if old is None:
        return None
    if kind.startswith("float"):
        return float(old)
    if kind.startswith("decimal"):
        return decimal.Decimal(old).quantize(decimal.Decimal(1).scaleb(-int(kind[-2])))
    return old


@pytest.mark.parametrize("seed", range(60))
def test_random_changes_migrate_or_are_refused_as_the_model_says(seed: int) -> None:
    rng = random.Random(seed)
    old_kinds = {f"c{i}": rng.choice(list(WIDER)) for i in range(rng.randint(1, 5))}
    rows = [
        {"k": i, **{c: value(rng, t) for c, t in old_kinds.items()}}
        for i in range(rng.randint(0, 6))
    ]
    new_kinds: dict[str, str] = {}
    source: dict[str, str] = {}  # new column -> old column
    renamed: dict[str, str] = {}
    dropped: list[str] = []
    refused: set[str] = set()
    for column, kind in old_kinds.items():
        move = rng.choice(["keep", "widen", "rename", "drop", "narrow", "vanish"])
        wider = WIDER[kind]
        if move == "widen" and wider:
            new_kinds[column], source[column] = rng.choice(wider), column
        elif move == "rename":
            name = f"{column}_new"
            new_kinds[name] = rng.choice([kind, *wider])
            source[name], renamed[column] = column, name
        elif move == "drop":
            dropped.append(column)
        elif move == "narrow" and kind in NARROWER:
            new_kinds[column] = NARROWER[kind]
            refused.add(column)
        elif move == "vanish":
            refused.add(column)  # gone from the declaration, not dropped by a rule
        else:
            new_kinds[column], source[column] = kind, column
    added: dict[str, Any] = {}
    for i in range(rng.randint(0, 2)):
        name, kind = f"n{i}", rng.choice(["int64", "string", "float64"])
        new_kinds[name] = kind
        if rng.random() < 0.7:
            added[name] = value(rng, kind)
        else:
            refused.add(name)

    old_schema = pa.schema([pa.field(c, TYPES[t]) for c, t in old_kinds.items()])
    new_schema = pa.schema([pa.field(c, TYPES[t]) for c, t in new_kinds.items()])
    rules = StateEvolution(added=added, renamed=renamed, dropped=dropped)
    comparison = compare_state(KEY, old_schema, KEY, new_schema, rules)
    assert {c.column for c in comparison.refused} == refused
    if refused:
        return
    stored = pa.Table.from_pylist(rows, schema=pa.schema([*KEY, *old_schema]))
    evolved = evolve_rows(stored, ["k"], comparison, new_schema, rules, "op")
    expected = [
        {
            "k": row["k"],
            **{
                c: convert(row[source[c]], t) if c in source else added[c]
                for c, t in new_kinds.items()
            },
        }
        for row in rows
    ]
    assert evolved.schema.names == ["k", *new_kinds]
    assert evolved.to_pylist() == expected
    assert comparison.differs == any(c.change is not Change.KEPT for c in comparison.changes)
