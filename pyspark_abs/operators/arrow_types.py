"""Arrow type equality and the Spark schema of an Arrow schema, without pandas.

Equality ignores nullability and Arrow's large and view variants. Spark's Python data
source processes (reading channels and manifests through the store) use it: they need not
load pandas.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType


def to_spark(schema: pa.Schema) -> StructType:
    """The Spark schema of an Arrow schema."""
    return from_arrow_schema(schema)


def same_type(a: pa.DataType, b: pa.DataType) -> bool:
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
