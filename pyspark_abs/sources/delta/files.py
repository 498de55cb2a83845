"""Reading a Delta table's data files: their locations, partition values and row slices."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql.datasource import InputPartition

from pyspark_abs.errors import SourceError


def table_location(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and root path of a Delta table's location.

    Raises:
        SourceError: The location cannot be opened.
    """
    try:
        fs, root = pafs.FileSystem.from_uri(uri)
    except (OSError, pa.ArrowException) as err:
        raise SourceError(f"cannot open the Delta table location {uri}: {err}") from None
    return fs, root.rstrip("/")


def file_location(table_uri: str, path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of a data file named by an ``add`` action's (decoded) path.

    Raises:
        SourceError: The table's location cannot be opened.
    """
    if "://" in path:
        fs, absolute = pafs.FileSystem.from_uri(path)
        return fs, absolute
    fs, root = table_location(table_uri)
    return fs, f"{root}/{path}"


def _repeat(value: pa.Scalar[Any], length: int) -> pa.Array[Any]:
    repeat: Any = pa.repeat
    result: pa.Array[Any] = repeat(value, length)
    return result


def partition_array(value: str | None, kind: pa.DataType, length: int) -> pa.Array[Any]:
    """A column of ``length`` copies of a partition value, parsed from the log's string.

    An empty string is null, as in Delta. Timestamps without a zone offset are in UTC.

    Raises:
        ValueError: The value cannot be parsed as ``kind``.
    """
    if value is None or value == "":
        return _repeat(pa.scalar(None, kind), length)
    text = pa.array([value], pa.string())
    try:
        parsed = text.cast(kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        if not isinstance(kind, pa.TimestampType) or kind.tz is None:
            raise ValueError(f"partition value {value!r} is not a {kind}: {err}") from None
        parsed = text.cast(pa.timestamp(kind.unit)).cast(kind)
    return _repeat(parsed[0], length)


@dataclass(frozen=True)
class DeltaFilePartition(InputPartition):
    """Rows ``[start, stop)`` of one data file: one Spark task.

    Attributes:
        table: The table's location.
        version: The version that added the file.
        path: The file's path relative to the table (decoded), or an absolute URI.
        start: First row, within the file.
        stop: End row (exclusive), within the file.
        partition_values: The file's partition values, as the log writes them.
    """

    table: str
    version: int
    path: str
    start: int
    stop: int
    partition_values: tuple[tuple[str, str | None], ...] = field(default=())


def read_slice(part: DeltaFilePartition, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Read a partition's rows as record batches with exactly ``schema``.

    Columns that the file lacks are null; partition columns come from the partition values.

    Raises:
        SourceError: The file cannot be read, has fewer rows than the log says, or a
            column cannot be converted to its type in ``schema``.
    """
    where = f"{part.path} (version {part.version} of Delta table {part.table})"
    partition_values = dict(part.partition_values)
    try:
        fs, location = file_location(part.table, part.path)
        with fs.open_input_file(location) as handle:
            parquet = pq.ParquetFile(handle, coerce_int96_timestamp_unit="us")
            by_lower = {name.lower(): name for name in parquet.schema_arrow.names}
            columns = {
                f.name: by_lower[f.name.lower()]
                for f in schema
                if f.name not in partition_values and f.name.lower() in by_lower
            }
            position = 0
            for group in range(parquet.num_row_groups):
                size = parquet.metadata.row_group(group).num_rows
                low, high = max(position, part.start), min(position + size, part.stop)
                if high > low:
                    rows = parquet.read_row_group(group, columns=list(columns.values()))
                    rows = rows.slice(low - position, high - low)
                    yield from _conform(rows, schema, columns, partition_values, where)
                position += size
                if position >= part.stop:
                    break
    except FileNotFoundError:
        raise SourceError(
            f"data file {where} is missing; it may have been vacuumed. Start a new checkpoint "
            f"from a later version"
        ) from None
    except (OSError, pa.ArrowException) as err:
        raise SourceError(f"cannot read data file {where}: {err}") from None
    if position < part.stop:
        raise SourceError(
            f"data file {where} has {position} rows, but the log says at least {part.stop}"
        )


def read_whole(
    table: str,
    path: str,
    partition_values: tuple[tuple[str, str | None], ...],
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """Every row of one data file, read as :func:`read_slice` reads a slice.

    Raises:
        SourceError: The file cannot be read.
    """
    try:
        fs, location = file_location(table, path)
        with fs.open_input_file(location) as handle:
            rows = int(pq.ParquetFile(handle).metadata.num_rows)
    except (OSError, pa.ArrowException) as err:
        raise SourceError(f"cannot read data file {path} of Delta table {table}: {err}") from None
    yield from read_slice(DeltaFilePartition(table, 0, path, 0, rows, partition_values), schema)


def _conform(
    rows: pa.Table,
    schema: pa.Schema,
    columns: Mapping[str, str],
    partition_values: Mapping[str, str | None],
    where: str,
) -> Iterator[pa.RecordBatch]:
    arrays: list[pa.Array[Any] | pa.ChunkedArray[Any]] = []
    for target in schema:
        try:
            if target.name in partition_values:
                value = partition_values[target.name]
                arrays.append(partition_array(value, target.type, rows.num_rows))
            elif target.name in columns:
                arrays.append(rows.column(columns[target.name]).cast(target.type))
            elif target.nullable:
                arrays.append(_repeat(pa.scalar(None, target.type), rows.num_rows))
            else:
                raise SourceError(f"data file {where} lacks the NOT NULL column {target.name!r}")
        except (ValueError, pa.ArrowException) as err:
            raise SourceError(
                f"data file {where}: column {target.name!r} cannot be read as {target.type}: {err}"
            ) from None
    table = pa.Table.from_arrays(arrays, schema=schema)
    yield from table.to_batches()
