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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
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
from pyspark_abs.sources.delta_log import (
    COLUMN_MAPPING,
    ChangeMode,
    DeltaFilePartition,
    DeltaLog,
    ReadSchema,
    read_slice,
)
from pyspark_abs.sources.delta_offsets import (
    SOURCE_NAME,
    Offset,
    plan_next,
    plan_slices,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


# Offsets and planning: pure functions over per-version row counts.


# The Delta log and data files, through pyarrow.


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
        from pyspark_abs.storage.schemas import arrow_schema
        from pyspark_abs.storage.store import normalize_uri

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
        mode = (metadata.configuration or {}).get(COLUMN_MAPPING, "none")
        if mode not in (None, "none"):
            raise SourceError(
                f"Delta table {uri} uses column mapping ({COLUMN_MAPPING}={mode}), which "
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
