"""A Delta table's Arrow schema, and how a declared schema differs from it."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.schema import Schema

from pyspark_abs.operators.arrow_types import same_type


def schema_differences(declared: pa.Schema, actual: pa.Schema) -> list[str]:
    """Differences in column names and types (nullability is ignored)."""
    problems = []
    declared_types = {f.name: f.type for f in declared}
    actual_types = {f.name: f.type for f in actual}
    missing = [n for n in declared_types if n not in actual_types]
    extra = [n for n in actual_types if n not in declared_types]
    if missing:
        problems.append(f"it lacks column(s) {missing}")
    if extra:
        problems.append(f"it has extra column(s) {extra}")
    for name, kind in declared_types.items():
        if name in actual_types and not same_type(kind, actual_types[name]):
            problems.append(f"column {name!r} is {actual_types[name]}, declared {kind}")
    return problems


def arrow_schema(table: DeltaTable) -> pa.Schema:
    """A Delta table's schema as a pyarrow schema."""
    exported: Any = table.schema().to_arrow()
    return pa.schema(exported)


def delta_schema_json(schema: pa.Schema) -> str:
    """An Arrow schema as a Delta schema in JSON, as Delta's log stores it."""
    return str(Schema.from_arrow(schema).to_json())
