"""A Delta table read as a replayable stream, with PySpark's Python data source API.

The stream reads the rows that the table's commits append, version after version. An offset
``{"source": "pyspark_abs_delta", "version": v, "index": i}`` means that every row before
row ``i`` of version ``v`` has been read (a ``"tag"`` names the stream when a query reads
several), where the rows of a version are those of its
``add`` actions with ``dataChange=true``, in the order of ``_delta_log/<v:020d>.json``,
concatenated. Offsets depend only on the table's log, so a range of offsets always reads
the same rows.

The module has three layers:

* pure offset planning (:func:`plan_next`, :func:`plan_slices`) over per-version row
  counts, without I/O;
* the Delta log and file access (:class:`DeltaLog`, :func:`read_slice`) with pyarrow;
* the Spark data source (:class:`DeltaSource`, registered as ``pyspark_abs_delta``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from pyspark_abs.errors import ConfigError, SourceError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SOURCE_NAME = "pyspark_abs_delta"
"""The data source's short name, and the ``source`` tag of its offsets."""

_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")
_COLUMN_MAPPING = "delta.columnMapping.mode"

ChangeMode = Literal["fail", "skip", "read"]
"""What the stream does with a commit that removes data: stop, skip it, or read its adds."""


# Offsets and planning: pure functions over per-version row counts.


@dataclass(frozen=True, order=True)
class Offset:
    """A position in the stream: every row before row ``index`` of ``version`` is read.

    Attributes:
        version: A table version.
        index: A row index within the rows that ``version`` appends.
        tag: The stream's tag, if it has one; not part of the position.
    """

    version: int
    index: int
    tag: str | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The offset as Spark stores it in the checkpoint's offset log."""
        value: dict[str, Any] = {
            "source": SOURCE_NAME,
            "version": self.version,
            "index": self.index,
        }
        if self.tag is not None:
            value["tag"] = self.tag
        return value

    @classmethod
    def parse(cls, value: object) -> Offset:
        """Read an offset written by :meth:`to_dict`.

        Raises:
            ValueError: ``value`` is not an offset of this source.
        """
        if not isinstance(value, Mapping) or value.get("source") != SOURCE_NAME:
            raise ValueError(f"{value!r} is not an offset of the {SOURCE_NAME} source")
        if set(value) - {"tag"} != {"source", "version", "index"}:
            raise ValueError(
                f"offset {dict(value)!r} must have exactly the keys source, version and index, "
                f"and optionally tag"
            )
        version, index, tag = value["version"], value["index"], value.get("tag")
        for name, number in (("version", version), ("index", index)):
            if not isinstance(number, int) or isinstance(number, bool) or number < 0:
                raise ValueError(f"offset {dict(value)!r}: {name} must be an integer >= 0")
        if tag is not None and not isinstance(tag, str):
            raise ValueError(f"offset {dict(value)!r}: tag must be a string")
        return cls(version, index, tag)


@dataclass(frozen=True)
class VersionRows:
    """The rows a table version appends, as the stream sees them.

    Attributes:
        version: The table version.
        files: Row counts of the version's data files, in log order.
        blocked: Why the stream cannot read this version, or None if it can.
    """

    version: int
    files: tuple[int, ...] = ()
    blocked: str | None = None


@dataclass(frozen=True)
class RowSlice:
    """Rows ``[start, stop)`` of one data file of one version.

    Attributes:
        version: The table version.
        file: The file's position among the version's data files.
        start: First row, within the file.
        stop: End row (exclusive), within the file.
    """

    version: int
    file: int
    start: int
    stop: int


@dataclass(frozen=True)
class Planned:
    """The end offset of the next micro-batch.

    Attributes:
        end: The end offset; equal to the start offset when nothing can be read.
        blocked: Set when planning stopped at a version the stream cannot read: the reason.
    """

    end: Offset
    blocked: str | None = None


def _contiguous(versions: Iterable[VersionRows], first: int) -> Iterator[VersionRows]:
    expected = first
    for entry in versions:
        if entry.version != expected:
            raise ValueError(f"expected version {expected}, got version {entry.version}")
        expected += 1
        yield entry


def plan_next(
    versions: Iterable[VersionRows],
    start: Offset,
    *,
    max_rows: int | None = None,
    max_files: int | None = None,
) -> Planned:
    """The end offset of a micro-batch that starts at ``start``.

    Versions are consumed lazily, and no further than the limits need: the version after the
    one that exhausts a limit is not read. A file cut by ``max_rows`` counts as one file;
    files without rows to read count for nothing. Versions without rows are skipped.

    Args:
        versions: The versions from ``start.version`` on, in order, up to the last version
            the batch may read.
        start: The batch's start offset.
        max_rows: The most rows the batch may read, or None for no limit.
        max_files: The most files (whole or in part) the batch may read, or None.

    Returns:
        The end offset, and why planning stopped early if it met an unreadable version.

    Raises:
        ValueError: The versions are not contiguous from ``start.version``, a limit is not
            positive, or ``start.index`` is beyond the rows of its version.
    """
    for name, limit in (("max_rows", max_rows), ("max_files", max_files)):
        if limit is not None and limit < 1:
            raise ValueError(f"{name} must be at least 1, got {limit}")
    rows_left, files_left = max_rows, max_files
    end = start
    for entry in _contiguous(versions, start.version):
        if entry.blocked is not None:
            return Planned(end, entry.blocked)
        skip = start.index if entry.version == start.version else 0
        if skip > sum(entry.files):
            raise ValueError(
                f"offset index {skip} is beyond the {sum(entry.files)} rows of version "
                f"{entry.version}"
            )
        position = 0
        for rows in entry.files:
            low, high = max(position, skip), position + rows
            position = high
            if high <= low:
                continue
            if rows_left == 0 or files_left == 0:
                return Planned(Offset(entry.version, low))
            take = high - low if rows_left is None else min(high - low, rows_left)
            if rows_left is not None:
                rows_left -= take
            if files_left is not None:
                files_left -= 1
            if low + take < high:
                return Planned(Offset(entry.version, low + take))
        end = Offset(entry.version + 1, 0)
        if rows_left == 0 or files_left == 0:
            break
    return Planned(end)


def plan_slices(versions: Iterable[VersionRows], start: Offset, end: Offset) -> list[RowSlice]:
    """The file slices holding the rows from ``start`` (inclusive) to ``end`` (exclusive).

    Args:
        versions: The versions from ``start.version`` on, in order, at least up to the last
            version with rows before ``end``.
        start: The batch's start offset.
        end: The batch's end offset.

    Raises:
        ValueError: ``end`` is before ``start``, the versions are not contiguous or stop too
            early, an offset index is beyond the rows of its version, or a version in the
            range cannot be read (the message is the reason).
    """
    if end < start:
        raise ValueError(f"end offset {end} is before start offset {start}")
    last = end.version if end.index > 0 else end.version - 1
    if last < start.version:
        return []
    slices: list[RowSlice] = []
    seen = start.version - 1
    for entry in _contiguous(versions, start.version):
        if entry.version > last:
            break
        seen = entry.version
        if entry.blocked is not None:
            raise ValueError(entry.blocked)
        total = sum(entry.files)
        low = start.index if entry.version == start.version else 0
        high = end.index if entry.version == end.version else total
        if max(low, high) > total:
            raise ValueError(
                f"offset index {max(low, high)} is beyond the {total} rows of version "
                f"{entry.version}"
            )
        position = 0
        for number, rows in enumerate(entry.files):
            first, stop = max(position, low), min(position + rows, high)
            if stop > first:
                slices.append(RowSlice(entry.version, number, first - position, stop - position))
            position += rows
    if seen < last:
        raise ValueError(f"versions stop at {seen}, before version {last} of offset {end}")
    return slices


# The Delta log and data files, through pyarrow.


def _table_location(uri: str) -> tuple[pafs.FileSystem, str]:
    try:
        fs, root = pafs.FileSystem.from_uri(uri)
    except (OSError, pa.ArrowException) as err:
        raise SourceError(f"cannot open the Delta table location {uri}: {err}") from None
    return fs, root.rstrip("/")


def _file_location(table_uri: str, path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of a data file named by an ``add`` action's (decoded) path."""
    if "://" in path:
        fs, absolute = pafs.FileSystem.from_uri(path)
        return fs, absolute
    fs, root = _table_location(table_uri)
    return fs, f"{root}/{path}"


@dataclass(frozen=True)
class DataFile:
    """A data file that a version adds.

    Attributes:
        path: The file's path relative to the table (decoded), or an absolute URI.
        rows: Its number of rows.
        partition_values: Its partition values, as the log writes them.
    """

    path: str
    rows: int
    partition_values: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True)
class Version:
    """What the stream reads of one table version.

    Attributes:
        version: The table version.
        files: The data files it appends, in log order (none for skipped change commits).
        blocked: Why the stream cannot read it, or None.
    """

    version: int
    files: tuple[DataFile, ...] = ()
    blocked: str | None = None

    def rows(self) -> VersionRows:
        """The version's row counts, for planning."""
        return VersionRows(self.version, tuple(f.rows for f in self.files), self.blocked)


@dataclass(frozen=True)
class ReadSchema:
    """The schema the stream was started with.

    Attributes:
        struct: The Spark schema of the table.
        partition_columns: The table's partition columns.
        version: The table version the schema was taken from; a later version that changes
            it stops the stream.
    """

    struct: StructType
    partition_columns: tuple[str, ...]
    version: int


class DeltaLog:
    """Reads a Delta table's commit files and caches what it parsed.

    Args:
        uri: The table's location (absolute path or URL).
        schema: The schema the stream was started with.
        changes: What to do with a commit that removes data: stop the stream at it
            (``"fail"``), skip it with the files it adds (``"skip"``), or read the files it
            adds (``"read"``).
    """

    def __init__(self, uri: str, schema: ReadSchema, *, changes: ChangeMode = "fail") -> None:
        self.uri = uri
        self.schema = schema
        self.changes = changes
        self._fs, self._root = _table_location(uri)
        self._versions: dict[int, Version] = {}
        self._latest: int | None = None

    @property
    def _log_dir(self) -> str:
        return f"{self._root}/_delta_log"

    def _commit_path(self, version: int) -> str:
        return f"{self._log_dir}/{version:020d}.json"

    def _listed_versions(self) -> list[int]:
        try:
            infos = self._fs.get_file_info(pafs.FileSelector(self._log_dir, allow_not_found=True))
        except (OSError, pa.ArrowException) as err:
            raise SourceError(f"cannot list the log of Delta table {self.uri}: {err}") from None
        return sorted(
            int(match.group(1)) for info in infos if (match := _COMMIT_FILE.match(info.base_name))
        )

    def _exists(self, version: int) -> bool:
        info = self._fs.get_file_info(self._commit_path(version))
        return bool(info.type != pafs.FileType.NotFound)

    def latest_version(self) -> int:
        """The table's latest version, from the log (listed once, then probed forward).

        Raises:
            SourceError: The table has no log.
        """
        if self._latest is None:
            listed = self._listed_versions()
            if not listed:
                raise SourceError(
                    f"no Delta table at {self.uri}: {self._log_dir} holds no commit. Check "
                    f"the path, or create the table before starting the stream"
                )
            self._latest = listed[-1]
        while self._exists(self._latest + 1):
            self._latest += 1
        return self._latest

    def version(self, version: int) -> Version:
        """What the stream reads of ``version`` (parsed once, then cached).

        Raises:
            SourceError: The version's commit file is gone, or cannot be read or parsed.
        """
        cached = self._versions.get(version)
        if cached is None:
            cached = self._versions[version] = self._parse(version, self._read_actions(version))
        return cached

    def versions(self, first: int, last: int) -> Iterator[VersionRows]:
        """The row counts of versions ``first`` to ``last`` (inclusive), parsed lazily."""
        for version in range(first, last + 1):
            yield self.version(version).rows()

    def forget_before(self, version: int) -> None:
        """Drop cached versions before ``version``."""
        for cached in [v for v in self._versions if v < version]:
            del self._versions[cached]

    def _read_actions(self, version: int) -> list[dict[str, Any]]:
        path = self._commit_path(version)
        try:
            with self._fs.open_input_stream(path) as stream:
                text = stream.read().decode("utf-8")
        except FileNotFoundError:
            raise self._missing(version) from None
        except (OSError, pa.ArrowException) as err:
            if not self._exists(version):
                raise self._missing(version) from None
            raise SourceError(
                f"cannot read version {version} of Delta table {self.uri} ({path}): {err}"
            ) from None
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as err:
            raise SourceError(
                f"version {version} of Delta table {self.uri} has an invalid commit file "
                f"{path}: {err}"
            ) from None

    def _missing(self, version: int) -> SourceError:
        listed = self._listed_versions()
        if not listed:
            return SourceError(
                f"no Delta table at {self.uri} any more: its log is gone (wanted version "
                f"{version}). Check the path"
            )
        later = [v for v in listed if v > version]
        hint = (
            f"start a new checkpoint with starting_version={later[0]} or later (the oldest "
            f"commit left in the log)"
            if later
            else "start a new checkpoint with a newer starting_version"
        )
        return SourceError(
            f"the log of version {version} of Delta table {self.uri} is gone "
            f"(_delta_log/{version:020d}.json), probably removed by log cleanup after a "
            f"checkpoint; the stream cannot read that version. To go on, {hint}"
        )

    def _parse(self, version: int, actions: Sequence[Mapping[str, Any]]) -> Version:
        adds: list[Mapping[str, Any]] = []
        removes = 0
        operation = "unknown operation"
        problem: str | None = None
        for action in actions:
            if "add" in action and action["add"].get("dataChange", True):
                adds.append(action["add"])
            elif "remove" in action and action["remove"].get("dataChange", True):
                removes += 1
            elif "commitInfo" in action:
                operation = str(action["commitInfo"].get("operation", operation))
            elif "metaData" in action and problem is None:
                problem = self._metadata_problem(version, action["metaData"])
        if problem is not None:
            return Version(version, blocked=problem)
        if removes and self.changes == "skip":
            return Version(version)
        if removes and self.changes == "fail":
            return Version(
                version,
                blocked=(
                    f"version {version} of Delta table {self.uri} removes data ({operation}, "
                    f"{removes} file(s) removed); the stream reads appends only. Set "
                    f"skip_change_commits=True to ignore commits that remove data (or "
                    f"ignore_changes=True to read the files they add), or start a new "
                    f"checkpoint with starting_version={version + 1}"
                ),
            )
        files: list[DataFile] = []
        for add in adds:
            if add.get("deletionVector"):
                return Version(
                    version,
                    blocked=(
                        f"version {version} of Delta table {self.uri} adds a file with a "
                        f"deletion vector ({add.get('path')}), which this source cannot read"
                    ),
                )
            files.append(self._data_file(version, add))
        return Version(version, tuple(files))

    def _metadata_problem(self, version: int, metadata: Mapping[str, Any]) -> str | None:
        configuration = metadata.get("configuration") or {}
        mode = configuration.get(_COLUMN_MAPPING, "none")
        if mode not in (None, "none"):
            return (
                f"version {version} of Delta table {self.uri} uses column mapping "
                f"({_COLUMN_MAPPING}={mode}), which this source cannot read"
            )
        if version <= self.schema.version:
            return None
        partitions = tuple(metadata.get("partitionColumns") or ())
        try:
            struct = _delta_schema(str(metadata.get("schemaString")))
        except (ValueError, TypeError, pa.ArrowException) as err:
            return (
                f"version {version} of Delta table {self.uri} has a schema this source cannot "
                f"read: {err}"
            )
        if struct == self.schema.struct and partitions == self.schema.partition_columns:
            return None
        return (
            f"the schema of Delta table {self.uri} changed at version {version} after the "
            f"stream started (read as of version {self.schema.version}: "
            f"{self.schema.struct.simpleString()} partitioned by "
            f"{list(self.schema.partition_columns)}; now {struct.simpleString()} partitioned "
            f"by {list(partitions)}). Restart the query with a new checkpoint; pass the last "
            f"offset of this one as starting_offset to go on where it stopped"
        )

    def _data_file(self, version: int, add: Mapping[str, Any]) -> DataFile:
        path = unquote(str(add["path"]))
        values = tuple(sorted((add.get("partitionValues") or {}).items()))
        rows = _num_records(add.get("stats"))
        if rows is None:
            try:
                fs, location = _file_location(self.uri, path)
                with fs.open_input_file(location) as handle:
                    rows = int(pq.ParquetFile(handle).metadata.num_rows)
            except (OSError, pa.ArrowException) as err:
                raise SourceError(
                    f"cannot read the footer of {path}, added by version {version} of Delta "
                    f"table {self.uri}: {err}"
                ) from None
        return DataFile(path, rows, values)


def _num_records(stats: object) -> int | None:
    if not isinstance(stats, str) or not stats:
        return None
    try:
        value = json.loads(stats).get("numRecords")
    except (json.JSONDecodeError, AttributeError):
        return None
    return value if isinstance(value, int) and value >= 0 else None


def _delta_schema(schema_json: str) -> StructType:
    """The Spark schema of a Delta ``schemaString``, converted as the stream converts it."""
    from deltalake import Schema

    from pyspark_abs.operators.schema import to_spark

    exported: Any = Schema.from_json(schema_json).to_arrow()
    return to_spark(pa.schema(exported))


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
        fs, location = _file_location(part.table, part.path)
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


# The Spark data source.


@dataclass(frozen=True)
class _Settings:
    """The data source's options, parsed."""

    path: str
    schema: ReadSchema
    max_rows: int | None
    max_files: int | None
    starting_version: int
    ending_version: int | None
    changes: ChangeMode
    starting_offset: Offset | None
    tag: str | None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> _Settings:
        def text(name: str) -> str | None:
            value = options.get(name.lower())
            return None if value is None or value == "" else str(value)

        def number(name: str, minimum: int) -> int | None:
            value = text(name)
            if value is None:
                return None
            try:
                parsed = int(value)
            except ValueError:
                parsed = minimum - 1
            if parsed < minimum:
                raise ConfigError(
                    f"{SOURCE_NAME} option {name} must be an integer >= {minimum}, got {value!r}"
                )
            return parsed

        path = text("path")
        schema_json = text("schema")
        if path is None or schema_json is None:
            raise ConfigError(
                f"{SOURCE_NAME} needs the options path and schema; load it with "
                f"pyspark_abs.sources.DeltaSource(...).load(spark)"
            )

        def flag(name: str) -> bool:
            value = (text(name) or "false").lower()
            if value not in ("true", "false"):
                raise ConfigError(f"{SOURCE_NAME} option {name} must be true or false")
            return value == "true"

        skip, ignore = flag("skipChangeCommits"), flag("ignoreChanges")
        if skip and ignore:
            raise ConfigError(f"{SOURCE_NAME}: give skipChangeCommits or ignoreChanges, not both")
        offset_json = text("startingOffset")
        return cls(
            path=path,
            schema=ReadSchema(
                StructType.fromJson(json.loads(schema_json)),
                tuple(json.loads(text("partitionColumns") or "[]")),
                number("schemaVersion", 0) or 0,
            ),
            max_rows=number("maxRowsPerTrigger", 1),
            max_files=number("maxFilesPerTrigger", 1),
            starting_version=number("startingVersion", 0) or 0,
            ending_version=number("endingVersion", 0),
            changes="skip" if skip else "read" if ignore else "fail",
            starting_offset=(
                None if offset_json is None else Offset.parse(DeltaSource.offset_of(offset_json))
            ),
            tag=text("tag"),
        )


class DeltaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark's stream reader over a Delta table.

    One instance lives in the driver's Python process for the whole query (offsets and
    partitions); copies of it read partitions on executors. The log is opened lazily, so the
    copies never touch it.

    Args:
        settings: The parsed options.
        schema: The Spark schema of the stream.
    """

    def __init__(self, settings: _Settings, schema: StructType) -> None:
        self._settings = settings
        self._schema = schema
        self._log: DeltaLog | None = None
        self._pinned: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_log"] = None
        return state

    @property
    def log(self) -> DeltaLog:
        """The table's log (opened on first use)."""
        if self._log is None:
            self._log = DeltaLog(
                self._settings.path,
                self._settings.schema,
                changes=self._settings.changes,
            )
        return self._log

    def initialOffset(self) -> dict[str, Any]:
        """Right after ``starting_offset`` if given, else the start of ``starting_version``."""
        start = self._settings.starting_offset or Offset(self._settings.starting_version, 0)
        return replace(start, tag=self._settings.tag).to_dict()

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows`` or ``ReadMaxFiles`` from the options, else ``ReadAllAvailable``."""
        if self._settings.max_rows is not None:
            return ReadMaxRows(self._settings.max_rows)
        if self._settings.max_files is not None:
            return ReadMaxFiles(self._settings.max_files)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Pin the table's current latest version: ``availableNow`` reads no further."""
        self._pinned = self.log.latest_version()

    def _last_version(self) -> int:
        last = self._pinned if self._pinned is not None else self.log.latest_version()
        if self._settings.ending_version is not None:
            last = min(last, self._settings.ending_version)
        return last

    def _offset(self, value: object, what: str) -> Offset:
        try:
            return Offset.parse(value)
        except ValueError as err:
            raise SourceError(
                f"the {what} offset of the stream over Delta table {self._settings.path} is "
                f"not this source's: {err}. Was the checkpoint written by another query?"
            ) from None

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The end offset of the next micro-batch from ``start``, within ``limit``.

        Raises:
            SourceError: The next version to read removes data (without
                ``skip_change_commits``), changes the schema, or its log is gone.
        """
        begin = self._offset(start, "start")
        if isinstance(limit, ReadMaxRows):
            max_rows, max_files = limit.max_rows, None
        elif isinstance(limit, ReadMaxFiles):
            max_rows, max_files = None, limit.max_files
        elif isinstance(limit, ReadAllAvailable):
            max_rows = max_files = None
        else:
            raise SourceError(
                f"the stream over Delta table {self._settings.path} does not support the read "
                f"limit {limit!r}"
            )
        versions = self.log.versions(begin.version, self._last_version())
        try:
            planned = plan_next(versions, begin, max_rows=max_rows, max_files=max_files)
        except ValueError as err:
            raise SourceError(
                f"cannot plan the stream over Delta table {self._settings.path} from offset "
                f"{start}: {err}. Was the checkpoint written for another table?"
            ) from None
        if planned.blocked is not None and planned.end == begin:
            raise SourceError(planned.blocked)
        return replace(planned.end, tag=self._settings.tag).to_dict()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        """One partition per file slice between the offsets: the same ones every time."""
        begin, finish = self._offset(start, "start"), self._offset(end, "end")
        last = finish.version if finish.index > 0 else finish.version - 1
        versions = self.log.versions(begin.version, last)
        try:
            slices = plan_slices(versions, begin, finish)
        except ValueError as err:
            raise SourceError(
                f"cannot read the stream over Delta table {self._settings.path} from offset "
                f"{start} to {end}: {err}"
            ) from None
        parts: list[InputPartition] = []
        for piece in slices:
            data = self.log.version(piece.version).files[piece.file]
            parts.append(
                DeltaFilePartition(
                    self._settings.path,
                    piece.version,
                    data.path,
                    piece.start,
                    piece.stop,
                    data.partition_values,
                )
            )
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The partition's rows as record batches with the stream's Arrow schema."""
        from pyspark_abs.operators.schema import to_arrow

        if not isinstance(partition, DeltaFilePartition):
            raise SourceError(f"unexpected partition {partition!r} for {SOURCE_NAME}")
        return read_slice(partition, to_arrow(self._schema))

    def commit(self, end: dict[str, Any]) -> None:
        """Forget the parsed versions before ``end``: Spark will not ask for them again."""
        if self._log is not None:
            self._log.forget_before(self._offset(end, "committed").version)


class DeltaDataSource(DataSource):
    """The ``pyspark_abs_delta`` data source; created by :meth:`DeltaSource.load`."""

    @classmethod
    def name(cls) -> str:
        """The short name to pass to ``readStream.format``."""
        return SOURCE_NAME

    def schema(self) -> StructType:
        """The table's schema as :meth:`DeltaSource.load` read it from the Delta log."""
        return _Settings.parse(self.options).schema.struct

    def streamReader(self, schema: StructType) -> DeltaStreamReader:
        """A stream reader over the table."""
        return DeltaStreamReader(_Settings.parse(self.options), schema)


def _check_limit(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ConfigError(f"DeltaSource: {name} must be a positive integer or None, got {value!r}")


def _check_version(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ConfigError(f"DeltaSource: {name} must be an integer >= 0 or None, got {value!r}")


@dataclass(frozen=True)
class DeltaSource:
    """A Delta table read as a replayable stream.

    Offsets are (table version, row index within that version's appended rows): see the
    module's documentation. The source reads the files that commits add; a commit that
    removes data (delete, update, overwrite) stops the stream unless ``skip_change_commits``
    or ``ignore_changes``.

    Attributes:
        path: The table's location: a local path or a URL.
        max_rows_per_trigger: The most rows per micro-batch; a file may be split.
        max_files_per_trigger: The most files per micro-batch.
        starting_version: The first version whose appended files are read (default 0: the
            whole history of an append-only table).
        ending_version: The last version read (inclusive); None follows the table forever.
        skip_change_commits: Ignore commits that remove data, and the files they add (as
            Delta's ``skipChangeCommits``).
        ignore_changes: Read the files that commits removing data add, as Delta's
            ``ignoreChanges``: rows such a commit rewrites come again, and removed rows are
            not retracted.
        tag: A name written into the stream's offsets, so that the offsets of a query
            reading several streams say which is which (pyspark-abs tags the loop head of a
            back-edge with the edge's id).

    Raises:
        ConfigError: A limit is not positive, both limits are given, a version is negative,
            ``ending_version`` is before ``starting_version``, or both
            ``skip_change_commits`` and ``ignore_changes`` are set.
    """

    path: str
    max_rows_per_trigger: int | None = None
    max_files_per_trigger: int | None = None
    starting_version: int | None = None
    ending_version: int | None = None
    skip_change_commits: bool = False
    ignore_changes: bool = False
    tag: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path.strip():
            raise ConfigError(f"DeltaSource: path must be a non-empty string, got {self.path!r}")
        _check_limit("max_rows_per_trigger", self.max_rows_per_trigger)
        _check_limit("max_files_per_trigger", self.max_files_per_trigger)
        if self.max_rows_per_trigger is not None and self.max_files_per_trigger is not None:
            raise ConfigError(
                f"DeltaSource({self.path}): give max_rows_per_trigger or "
                f"max_files_per_trigger, not both"
            )
        _check_version("starting_version", self.starting_version)
        _check_version("ending_version", self.ending_version)
        if self.ending_version is not None and self.ending_version < (self.starting_version or 0):
            raise ConfigError(
                f"DeltaSource({self.path}): ending_version {self.ending_version} is before "
                f"starting_version {self.starting_version or 0}"
            )
        for name, value in (
            ("skip_change_commits", self.skip_change_commits),
            ("ignore_changes", self.ignore_changes),
        ):
            if not isinstance(value, bool):
                raise ConfigError(f"DeltaSource: {name} must be a bool, got {value!r}")
        if self.skip_change_commits and self.ignore_changes:
            raise ConfigError(
                f"DeltaSource({self.path}): give skip_change_commits or ignore_changes, not both"
            )
        if self.tag is not None and (not isinstance(self.tag, str) or not self.tag):
            raise ConfigError(f"DeltaSource: tag must be a non-empty string, got {self.tag!r}")

    def load(
        self, spark: SparkSession, starting_offset: Mapping[str, Any] | None = None
    ) -> DataFrame:
        """A streaming DataFrame of the table.

        The schema is the table's latest schema, read from the Delta log now.

        Args:
            spark: The session.
            starting_offset: An offset of this source as Spark wrote it to a checkpoint's
                offset log (see :meth:`offset_of`). A query on a *new* checkpoint starts
                right after it, and it takes precedence over ``starting_version``; a query
                restarted on an existing checkpoint resumes at that checkpoint's offsets.

        Raises:
            SourceError: There is no Delta table at ``path``, or this source cannot read it.
            ConfigError: ``starting_version`` is beyond the table's latest version, or
                ``starting_offset`` is not an offset of this source or lies beyond the table.
        """
        options = self._options(starting_offset)
        spark.dataSource.register(DeltaDataSource)
        return spark.readStream.format(SOURCE_NAME).options(**options).load()

    def _options(self, starting_offset: Mapping[str, Any] | None = None) -> dict[str, str]:
        """The data source's options, read from the table's log now (see :meth:`load`)."""
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError, TableNotFoundError

        from pyspark_abs.operators.schema import to_spark
        from pyspark_abs.storage.store import arrow_schema, normalize_uri

        uri = normalize_uri(self.path)
        try:
            table = DeltaTable(uri)
        except TableNotFoundError:
            raise SourceError(
                f"no Delta table at {uri}. Check the path, or create the table before "
                f"starting the stream"
            ) from None
        except (DeltaError, OSError) as err:
            raise SourceError(f"cannot open the Delta table at {uri}: {err}") from None
        latest = int(table.version())
        metadata = table.metadata()
        mode = (metadata.configuration or {}).get(_COLUMN_MAPPING, "none")
        if mode not in (None, "none"):
            raise SourceError(
                f"Delta table {uri} uses column mapping ({_COLUMN_MAPPING}={mode}), which "
                f"this source cannot read"
            )
        if self.starting_version is not None and self.starting_version > latest:
            raise ConfigError(
                f"DeltaSource({uri}): starting_version {self.starting_version} is beyond the "
                f"table's latest version {latest}"
            )
        offset: Offset | None = None
        if starting_offset is not None:
            try:
                offset = Offset.parse(starting_offset)
            except ValueError as err:
                raise ConfigError(f"DeltaSource({uri}): bad starting_offset: {err}") from None
            if offset.version > latest + 1:
                raise ConfigError(
                    f"DeltaSource({uri}): starting_offset {offset.to_dict()} is beyond the "
                    f"table's latest version {latest}; was it taken from another table?"
                )
        try:
            struct = to_spark(arrow_schema(table))
        except (TypeError, ValueError, pa.ArrowException) as err:
            raise SourceError(
                f"the schema of Delta table {uri} has types Spark cannot read: {err}"
            ) from None
        options = {
            "path": uri,
            "schema": struct.json(),
            "schemaVersion": str(latest),
            "partitionColumns": json.dumps(list(metadata.partition_columns)),
            "skipChangeCommits": str(self.skip_change_commits).lower(),
            "ignoreChanges": str(self.ignore_changes).lower(),
        }
        for name, value in (
            ("maxRowsPerTrigger", self.max_rows_per_trigger),
            ("maxFilesPerTrigger", self.max_files_per_trigger),
            ("startingVersion", self.starting_version),
            ("endingVersion", self.ending_version),
            ("tag", self.tag),
        ):
            if value is not None:
                options[name] = str(value)
        if offset is not None:
            options["startingOffset"] = json.dumps(offset.to_dict())
        return options

    def rewound(self, spark: SparkSession, offset_json: str) -> DataFrame:
        """The stream starting right after a recorded offset (see :meth:`offset_of`)."""
        return self.load(spark, starting_offset=self.offset_of(offset_json))

    @staticmethod
    def offset_of(offset_json: str) -> dict[str, Any]:
        """Parse one offset of this source, as Spark wrote it to a checkpoint's offset log.

        Args:
            offset_json: The JSON text, e.g. line 2 of ``<checkpoint>/offsets/<batch>`` for
                a query's first source.

        Returns:
            The offset as a dict, to pass as ``starting_offset`` to :meth:`load`.

        Raises:
            ConfigError: The text is not JSON, or not an offset of this source.
        """
        try:
            value = json.loads(offset_json)
        except (json.JSONDecodeError, TypeError) as err:
            raise ConfigError(f"{offset_json!r} is not an offset: {err}") from None
        try:
            return Offset.parse(value).to_dict()
        except ValueError as err:
            raise ConfigError(str(err)) from None
