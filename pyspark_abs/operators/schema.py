"""Schemas: declared Spark schemas, their Arrow form, and checked pandas-to-Arrow conversion."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import from_arrow_type, to_arrow_schema
from pyspark.sql.types import Row, StructType

from pyspark_abs.errors import OperatorDefinitionError, SchemaMismatchError


def _spark_to_arrow() -> Callable[[StructType], pa.Schema]:
    """PySpark's schema conversion with timestamps in UTC: 4.2 names the zone, 4.0/4.1 a flag."""
    if "timezone" in inspect.signature(to_arrow_schema).parameters:
        return lambda struct: to_arrow_schema(struct, timezone="UTC")
    return lambda struct: to_arrow_schema(struct, timestamp_utc=True)  # type: ignore[call-arg]


_SPARK_TO_ARROW = _spark_to_arrow()

SchemaLike = str | StructType
"""A schema as a DDL string (``"word string, count long"``) or a ``StructType``."""

TIMEOUT = "_timeout"
DELETED = "_deleted"
KEY_GROUP = "_key_group"
EPOCH = "_epoch"
RESERVED_COLUMNS = (KEY_GROUP, EPOCH, DELETED, TIMEOUT)
"""Columns the state table adds to the key and state columns, in table order."""
STATELESS_COLUMN = "_stateless"
"""The one state column of an operator declared without state: it never writes it, so its
state table holds no rows."""
TIMERS = "_timers"
"""The state column of a per-key operator declared with ``timers=True``: the key's timers,
sorted, in ms since the Unix epoch (its ``_timeout`` is the earliest)."""
SLOT_COLUMN = "_abs_slot"
"""Operator input column naming the slot (the carrier's group) of the row's key group."""
RESTORE = "_abs_restore"
"""Operator input column carrying a restored key's state (null on data rows)."""


def resolve_struct(schema: SchemaLike, what: str) -> StructType:
    """Turn a declared schema into a ``StructType``.

    DDL strings are parsed by Spark, so an active session is needed for them.

    Raises:
        OperatorDefinitionError: The schema cannot be parsed or is not a struct.
    """
    if isinstance(schema, StructType):
        return schema
    if not isinstance(schema, str):
        raise OperatorDefinitionError(
            f"{what} must be a DDL string or a StructType, got {type(schema).__name__}"
        )
    try:
        parsed = StructType.fromDDL(schema)
    except Exception as err:
        raise OperatorDefinitionError(
            f"{what} {schema!r} is not a valid DDL schema: {err}"
        ) from err
    if not isinstance(parsed, StructType):
        raise OperatorDefinitionError(f"{what} {schema!r} must be a list of columns")
    return parsed


def to_arrow(struct: StructType, *, nullable: bool = False) -> pa.Schema:
    """The Arrow schema Spark uses for ``struct`` (timestamps as microseconds in UTC).

    Args:
        struct: The Spark schema.
        nullable: Make every top-level field nullable (state columns must hold tombstones).
    """
    schema = _SPARK_TO_ARROW(struct)
    if nullable:
        schema = pa.schema([f.with_nullable(True) for f in schema])
    return schema


def ddl_type(kind: pa.DataType) -> str:
    """An Arrow type as Spark DDL names it (``int``, ``bigint``, ``decimal(10,2)``)."""
    try:
        return str(from_arrow_type(kind).simpleString())
    except TypeError:
        return str(kind)


def check_columns(
    frame: pd.DataFrame | pa.Table,
    expected: Sequence[str],
    what: str,
    optional: Sequence[str] = (),
) -> None:
    """Check that rows (a pandas frame or a ``pyarrow.Table``) have exactly the expected columns.

    The order does not matter.

    Raises:
        SchemaMismatchError: It is neither, or columns are missing, unexpected or
            duplicated.
    """
    if isinstance(frame, pa.Table):
        check_names(frame.column_names, expected, what, optional)
        return
    if not isinstance(frame, pd.DataFrame):
        raise SchemaMismatchError(
            f"{what}: expected a pandas DataFrame or a pyarrow.Table, got {type(frame).__name__}"
        )
    check_names([str(c) for c in frame.columns], expected, what, optional)


def check_names(
    names: Sequence[str], expected: Sequence[str], what: str, optional: Sequence[str] = ()
) -> None:
    """Check that ``names`` are exactly the expected column names (in any order).

    Raises:
        SchemaMismatchError: Names are missing, unexpected or duplicated.
    """
    duplicated = sorted({n for n in names if names.count(n) > 1})
    missing = [c for c in expected if c not in names]
    extra = [c for c in names if c not in expected and c not in optional]
    if duplicated or missing or extra:
        parts = []
        if missing:
            parts.append(f"missing column(s) {missing}")
        if extra:
            parts.append(f"unexpected column(s) {extra}")
        if duplicated:
            parts.append(f"duplicated column(s) {duplicated}")
        raise SchemaMismatchError(
            f"{what}: {'; '.join(parts)}; the declared columns are {list(expected)}"
        )


def instant_columns(schema: pa.Schema) -> tuple[str, ...]:
    """Top-level columns holding instants: Spark ``timestamp`` (not ``timestamp_ntz``)."""
    return tuple(f.name for f in schema if pa.types.is_timestamp(f.type) and f.type.tz)


def in_time_zone(table: pa.Table, time_zone: str) -> pa.Table:
    """``table`` with its instants, nested ones too, tagged with ``time_zone``.

    How Spark's Arrow functions (``applyInArrow``, ``mapInArrow``) hand instants over: the
    values stay microseconds since the Unix epoch, the tag makes Arrow's calendar functions
    (``hour``, ``strftime``) work in the session time zone.
    """
    zoned = _zoned_schema(table.schema, time_zone)
    return table if zoned is None else table.cast(zoned)


@functools.lru_cache(maxsize=256)
def _zoned_schema(schema: pa.Schema, time_zone: str) -> pa.Schema | None:
    """``schema`` with every instant type in ``time_zone``; None when nothing changes."""
    kinds = [_zoned_type(f.type, time_zone) for f in schema]
    if all(k is None for k in kinds):
        return None
    return pa.schema(
        [f if k is None else f.with_type(k) for f, k in zip(schema, kinds, strict=True)],
        metadata=cast(Any, schema.metadata),
    )


def _zoned_type(kind: Any, time_zone: str) -> pa.DataType | None:
    if pa.types.is_timestamp(kind):
        return pa.timestamp(kind.unit, time_zone) if kind.tz and kind.tz != time_zone else None
    if pa.types.is_struct(kind):
        fields = list(kind)
        inner = [_zoned_type(f.type, time_zone) for f in fields]
        if all(k is None for k in inner):
            return None
        return pa.struct(
            [f if k is None else f.with_type(k) for f, k in zip(fields, inner, strict=True)]
        )
    if pa.types.is_map(kind):
        mapped = cast(Any, kind)
        key = _zoned_type(mapped.key_type, time_zone)
        item = _zoned_type(mapped.item_type, time_zone)
        if key is None and item is None:
            return None
        return pa.map_(
            mapped.key_field.with_type(key or mapped.key_type),
            mapped.item_field.with_type(item or mapped.item_type),
        )
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        listed = cast(Any, kind)
        element = _zoned_type(listed.value_type, time_zone)
        if element is None:
            return None
        field = listed.value_field.with_type(element)
        return pa.list_(field) if pa.types.is_list(kind) else pa.large_list(field)
    return None


_NULLABLE_DTYPES: dict[pa.DataType, pd.api.extensions.ExtensionDtype] = {
    pa.int8(): pd.Int8Dtype(),
    pa.int16(): pd.Int16Dtype(),
    pa.int32(): pd.Int32Dtype(),
    pa.int64(): pd.Int64Dtype(),
    pa.bool_(): pd.BooleanDtype(),
    pa.float32(): pd.Float32Dtype(),
    pa.float64(): pd.Float64Dtype(),
}
NULL_MASK_PREFIX = "_abs_null_"
"""Operator input column saying which rows of the integer column after the prefix are null
(the column itself then holds 0), so that integers reach pandas without passing through
float (see :func:`exact_columns`)."""


def to_frame(table: pa.Table) -> pd.DataFrame:
    """An Arrow table as pandas, with no value changed.

    A column of integers, booleans or floats that holds nulls becomes pandas' nullable
    dtype of its type (``Int64``, ``boolean``, ``Float64``...): its integers never pass
    through float, and a null stays distinct from NaN. Columns without nulls keep NumPy
    dtypes. An array, map or struct column holds the Python values Spark's ``GroupState``
    gives (an array a list, a map a dict, a struct a ``Row``, at every depth), exact: Arrow's
    own conversion would turn an array of integers into floats wherever any row's array
    holds a null.
    """
    columns: dict[str, Any] = {}
    for field, column in zip(table.schema, table.columns, strict=True):
        kind = field.type
        if pa.types.is_nested(kind):
            values: Iterable[Any] = column.to_pylist()
            convert = _to_spark(kind)
            if convert is not None:
                values = map(convert, values)
            # fromiter: filling an object array from a list probes each Row as a sequence
            columns[field.name] = np.fromiter(values, dtype=object, count=len(column))
        elif kind in _NULLABLE_DTYPES:
            # what Arrow's own conversion gives these columns, without its fixed cost
            if column.null_count:
                columns[field.name] = cast(Any, _NULLABLE_DTYPES[kind]).__from_arrow__(column)
            else:
                values = column.to_numpy()
                columns[field.name] = values if values.flags.writeable else values.copy()
    if len(columns) == table.num_columns:
        return pd.DataFrame(columns, copy=False)
    rest = table.drop_columns(list(columns)).to_pandas(use_threads=False)
    return pd.DataFrame(
        {c: columns[c] if c in columns else rest[c] for c in table.column_names}, copy=False
    )


def exact_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows from Spark's pandas conversion with each masked integer column made whole again.

    Spark hands a nullable integer column with nulls to pandas as float (2**60 + 1 becomes
    2**60); the plan therefore sends such a column with its nulls as 0 beside a mask column
    (:data:`NULL_MASK_PREFIX`). Here the column becomes pandas' nullable integer dtype where
    the mask has a null, and stays int64 where it has none; the mask columns are dropped.
    """
    masks = [c for c in frame.columns if c.startswith(NULL_MASK_PREFIX)]
    if not masks:
        return frame
    changed: dict[str, pd.Series] = {}
    for mask in masks:
        name = mask[len(NULL_MASK_PREFIX) :]
        nulls = frame[mask].to_numpy(dtype=bool)
        if nulls.any():
            values = pd.arrays.IntegerArray(frame[name].to_numpy(), nulls)
            changed[name] = pd.Series(values, index=frame.index, name=name)
    return pd.DataFrame(
        {c: changed.get(c, frame[c]) for c in frame.columns if c not in masks}, copy=False
    )


def object_frame(records: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    """Rows of Python values as a frame of object columns.

    No dtype is inferred, so one row's None never turns another row's integer into a float.
    """
    return pd.DataFrame(
        {c: pd.Series([r[c] for r in records], dtype=object) for c in columns}, copy=False
    )


def python_value(value: Any) -> Any:
    """A pandas cell as a function sees it in a state dict: None for any kind of null."""
    return None if value is None or value is pd.NA or value is pd.NaT else value


def localize(frame: pd.DataFrame, columns: Sequence[str], time_zone: str) -> pd.DataFrame:
    """``frame`` with ``columns`` as datetimes aware of ``time_zone``.

    The columns hold microseconds since the Unix epoch (how instants reach the operator from
    Spark, which would hand them over as naive local times: ambiguous once a year) or aware
    datetimes (state read from Arrow).
    """
    changed = {}
    for name in columns:
        column = frame[name]
        if column.dtype == np.int64:  # no nulls: a view, a third of pd.to_datetime's cost
            stamps = pd.DatetimeIndex(column.to_numpy().view("M8[us]")).as_unit("ns")
            aware = stamps.tz_localize("UTC").tz_convert(time_zone)
            changed[name] = pd.Series(aware, index=column.index, name=name, copy=False)
            continue
        if not isinstance(column.dtype, pd.DatetimeTZDtype):
            # nanoseconds, as Spark's own pandas conversion gives instants, also when nullable
            column = pd.to_datetime(column, unit="us", utc=True).dt.as_unit("ns")
        changed[name] = column.dt.tz_convert(time_zone)
    if not changed:
        return frame
    # shares the other columns (assign would copy them)
    return pd.DataFrame({c: changed.get(c, frame[c]) for c in frame.columns}, copy=False)


def _instants(column: pd.Series, time_zone: str, what: str) -> pd.Series:
    """Datetimes of a column declared ``timestamp``, made aware.

    Naive ones are wall-clock times in ``time_zone`` (the session time zone), as in Spark's
    own pandas functions.
    """
    if column.dtype == object:
        try:
            column = pd.to_datetime(column, utc=bool(column.map(_aware).any()))
        except (ValueError, TypeError) as err:
            raise SchemaMismatchError(
                f"{what}: column {column.name!r} holds values that are not datetimes: {err}"
            ) from None
    if column.dtype.kind != "M" or isinstance(column.dtype, pd.DatetimeTZDtype):
        return column
    try:
        aware: pd.Series = column.dt.tz_localize(time_zone)
    except Exception as err:  # pytz's AmbiguousTimeError and NonExistentTimeError
        raise SchemaMismatchError(
            f"{what}: column {column.name!r} holds naive datetimes, which are read as "
            f"wall-clock times in the session time zone {time_zone}, and one of them names "
            f"no single instant there ({err}: a daylight-saving change). Return "
            f"time-zone-aware datetimes, such as the input's own"
        ) from None
    return aware


def _aware(value: object) -> bool:
    return getattr(value, "tzinfo", None) is not None


def frame_to_arrow(
    frame: pd.DataFrame,
    schema: pa.Schema,
    what: str,
    time_zone: str = "UTC",
    *,
    nan_is_null: bool = True,
) -> pa.Table:
    """Convert a pandas frame to ``schema``, column by column, with a precise error.

    The frame must already have every column of ``schema`` (see :func:`check_columns`);
    other columns are ignored. Naive datetimes in a ``timestamp`` column are wall-clock
    times in ``time_zone``. A NaN in a float column is null (pandas' convention, and
    Spark's for the frames a pandas function returns), except in an object column of
    Python values converted with ``nan_is_null=False``: there only None, ``pd.NA`` and
    ``pd.NaT`` are null, as in Spark's ``GroupState``.

    Raises:
        SchemaMismatchError: A column cannot be converted to its declared type, or holds
            nulls where the schema does not allow them, or naive datetimes that do not name
            one instant in ``time_zone``.
    """
    arrays = []
    for field in schema:
        column = frame[field.name]
        if pa.types.is_timestamp(field.type) and field.type.tz:
            column = _instants(column, time_zone, what)
        # NumPy columns convert the same but several times faster without pandas in between.
        numpy = isinstance(column.dtype, np.dtype) and column.dtype.kind in "biuf"
        try:
            if not nan_is_null and column.dtype == object and pa.types.is_floating(field.type):
                values = [python_value(v) for v in column]
                array = pa.array(values, type=field.type, from_pandas=False)
            elif column.dtype == object and pa.types.is_nested(field.type):
                array = _nested_array(column, field.type, nan_is_null)
            else:
                array = pa.array(
                    column.to_numpy() if numpy else column, type=field.type, from_pandas=True
                )
        except (
            pa.ArrowInvalid,
            pa.ArrowTypeError,
            pa.ArrowNotImplementedError,
            TypeError,
            ValueError,
            OverflowError,
        ) as err:
            raise SchemaMismatchError(
                f"{what}: column {field.name!r} cannot be converted to {field.type} "
                f"(pandas dtype {column.dtype}): {err}"
            ) from None
        arrays.append(declared_nulls(field, array, what))
    return pa.Table.from_arrays(arrays, schema=schema)


def table_to_arrow(
    table: pa.Table, schema: pa.Schema, what: str, time_zone: str = "UTC"
) -> pa.Table:
    """A ``pyarrow.Table`` a function returned, as ``schema``, with a precise error.

    The table must already have every column of ``schema`` (see :func:`check_names`); other
    columns are ignored. Each column is cast to its declared type where it has another
    of the same kind (an int32 column to ``bigint``; a float column to ``string`` fails, as
    in the pandas form, where Arrow would write the numbers as text), values unchanged:
    a NaN stays NaN. Naive timestamps in a ``timestamp`` column are wall-clock times in
    ``time_zone``, as in :func:`frame_to_arrow`.

    Raises:
        SchemaMismatchError: A column cannot be cast to its declared type, or holds nulls
            where the schema does not allow them, or naive timestamps that do not name one
            instant in ``time_zone``.
    """
    arrays = []
    for field in schema:
        column = table.column(field.name)
        kind = column.type
        instants = pa.types.is_timestamp(field.type) and field.type.tz
        if instants and pa.types.is_timestamp(kind) and not kind.tz:
            column = _assume_zone(column, time_zone, f"{what}: column {field.name!r}")
        if column.type != field.type and not castable(column.type, field.type):
            raise SchemaMismatchError(
                f"{what}: column {field.name!r} of type {kind} cannot be converted to "
                f"{field.type}: only numbers become numbers, strings strings, and so on; "
                f"convert the column in the function"
            )
        try:
            if column.type != field.type:
                column = column.cast(field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as err:
            raise SchemaMismatchError(
                f"{what}: column {field.name!r} of type {kind} cannot be converted to "
                f"{field.type}: {err}"
            ) from None
        arrays.append(declared_nulls(field, column, what))
    return pa.Table.from_arrays(arrays, schema=schema)


_KINDS: tuple[tuple[Callable[[Any], bool], str], ...] = (
    (pa.types.is_integer, "number"),
    (pa.types.is_floating, "number"),
    (pa.types.is_decimal, "number"),
    (pa.types.is_boolean, "bool"),
    (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "string"),
    (
        lambda t: (
            pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
        ),
        "binary",
    ),
    (pa.types.is_timestamp, "timestamp"),
    (pa.types.is_date, "date"),
    (pa.types.is_time, "time"),
    (pa.types.is_duration, "duration"),
    (
        lambda t: (
            pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
        ),
        "list",
    ),
    (pa.types.is_map, "map"),
    (pa.types.is_struct, "struct"),
)


def _kind(kind: Any) -> str | None:
    if pa.types.is_dictionary(kind):
        return _kind(kind.value_type)
    return next((name for test, name in _KINDS if test(kind)), None)


def castable(source: Any, target: Any) -> bool:
    """Whether the Arrow form casts a returned column of type ``source`` to ``target``.

    Only within one kind (numbers, strings, binary, timestamps, ...), nested types element
    by element: Arrow itself would also turn numbers into text or integers into booleans.
    """
    if pa.types.is_null(source):
        return True
    kind = _kind(source)
    if kind is None or kind != _kind(target):
        return False
    if pa.types.is_dictionary(source):
        return castable(source.value_type, target)
    if kind == "list":
        return castable(source.value_type, target.value_type)
    if kind == "map":
        return castable(source.key_type, target.key_type) and castable(
            source.item_type, target.item_type
        )
    if kind == "struct":
        fields = {f.name: f.type for f in source}
        return all(f.name in fields and castable(fields[f.name], f.type) for f in target)
    return True


def declared_nulls(field: pa.Field[Any], column: Any, what: str) -> Any:
    """``column``, refused if it holds nulls where ``field`` is NOT NULL."""
    if not field.nullable and column.null_count:
        raise SchemaMismatchError(
            f"{what}: column {field.name!r} is declared NOT NULL but holds "
            f"{column.null_count} null value(s)"
        )
    return column


def _assume_zone(column: Any, time_zone: str, what: str) -> Any:
    """Naive timestamps as wall-clock times in ``time_zone``."""
    try:
        return pc.assume_timezone(column, time_zone)
    except pa.ArrowInvalid as err:
        problem = str(err).split("\n", 1)[0]
        raise SchemaMismatchError(
            f"{what} holds naive timestamps, which are read as wall-clock times in the session "
            f"time zone {time_zone}, and one of them names no single instant there ({problem}: "
            f"a daylight-saving change). Return time-zone-aware timestamps, such as the input's "
            f"own"
        ) from None


def _nested_array(column: pd.Series, kind: pa.DataType, nan_is_null: bool) -> pa.Array[Any]:
    """Nested Python values as Arrow, in any form Spark's pandas functions take.

    A struct may be a ``Row``, a dict or a tuple; an array any sequence; a map a dict or
    pairs.

    With ``nan_is_null=False`` a NaN inside is kept, as in Spark's ``GroupState``; values
    Arrow takes only with pandas' conventions (NumPy arrays of floats standing for integers)
    are then converted with them, their NaN null.
    """
    convert = _to_arrow(kind) or python_value  # Arrow takes arrays and maps in every form
    values = [convert(v) for v in column]
    if nan_is_null:
        return pa.array(values, type=kind, from_pandas=True)
    try:
        return pa.array(values, type=kind, from_pandas=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        return pa.array(values, type=kind, from_pandas=True)


Convert = Callable[[Any], Any]


def _is_list(kind: pa.DataType) -> bool:
    return (
        pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    )


@functools.lru_cache(maxsize=256)
def _to_spark(kind: pa.DataType) -> Convert | None:
    """How a nested value ``to_pylist`` gives becomes the one Spark's ``GroupState`` gives.

    A map becomes a dict and a struct a ``Row``; None where the value already is one.
    """
    if pa.types.is_map(kind):
        item = _to_spark(kind.item_type)
        if item is None:
            return lambda v: None if v is None else dict(v)
        return lambda v: None if v is None else {k: item(x) for k, x in v}
    if _is_list(kind):
        element = _to_spark(cast("pa.ListType[Any]", kind).value_type)
        if element is None:
            return None
        return lambda v: None if v is None else [element(x) for x in v]
    if pa.types.is_struct(kind):
        names = [f.name for f in kind]
        fields = [(f.name, _to_spark(f.type)) for f in kind]
        row = Row(*names)
        return lambda v: (
            None if v is None else row(*(v[n] if c is None else c(v[n]) for n, c in fields))
        )
    return None


@functools.lru_cache(maxsize=256)
def _to_arrow(kind: pa.DataType) -> Convert | None:
    """How a nested value in any form Spark's pandas functions take becomes one Arrow takes.

    A struct becomes a dict by field name (a ``Row`` by its names, a tuple by position);
    None where Arrow takes every form of ``kind`` as it is.
    """
    if pa.types.is_map(kind):
        item = _to_arrow(kind.item_type)
        if item is None:
            return None

        def pairs(v: Any) -> Any:
            v = python_value(v)
            if v is None:
                return None
            return [(k, item(x)) for k, x in (v.items() if isinstance(v, Mapping) else v)]

        return pairs
    if _is_list(kind):
        element = _to_arrow(cast("pa.ListType[Any]", kind).value_type)
        if element is None:
            return None

        def elements(v: Any) -> Any:
            v = python_value(v)
            return v if v is None or isinstance(v, (str, bytes)) else [element(x) for x in v]

        return elements
    if pa.types.is_struct(kind):
        names = [f.name for f in kind]
        fields = [(f.name, _to_arrow(f.type) or python_value) for f in kind]

        def struct(v: Any) -> Any:
            v = python_value(v)
            if isinstance(v, Row):
                v = v.asDict()
            elif isinstance(v, tuple):
                v = dict(zip(names, v, strict=False))
            if not isinstance(v, Mapping):
                return v  # None, or a value Arrow names the problem of
            return {n: c(v.get(n)) for n, c in fields}

        return struct
    return None
