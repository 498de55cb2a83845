"""A Delta table's Arrow schema, and how a declared schema differs from it."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from deltalake import DeltaTable


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
        if name in actual_types and not _same_type(kind, actual_types[name]):
            problems.append(f"column {name!r} is {actual_types[name]}, declared {kind}")
    return problems


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Type equality that ignores field nullability and Arrow's large/view variants."""
    normalize: dict[pa.DataType, pa.DataType] = {
        pa.large_string(): pa.string(),
        pa.string_view(): pa.string(),
        pa.large_binary(): pa.binary(),
        pa.binary_view(): pa.binary(),
    }
    a, b = normalize.get(a, a), normalize.get(b, b)
    if pa.types.is_nested(a) and pa.types.is_nested(b):
        return str(_strip_nullability(a)) == str(_strip_nullability(b))
    return bool(a.equals(b))


def _strip_nullability(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, _strip_nullability(f.type)) for f in kind])
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pa.list_(_strip_nullability(kind.value_type))
    if pa.types.is_map(kind):
        return pa.map_(_strip_nullability(kind.key_type), _strip_nullability(kind.item_type))
    return kind


def arrow_schema(table: DeltaTable) -> pa.Schema:
    """A Delta table's schema as a pyarrow schema."""
    exported: Any = table.schema().to_arrow()
    return pa.schema(exported)
