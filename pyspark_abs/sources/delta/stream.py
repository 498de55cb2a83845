"""The Spark data source ``pyspark_abs_delta``: PySpark's Python data source API over a Delta log.

:class:`~pyspark_abs.sources.delta.source.DeltaSource` registers it and passes its options; the
stream reader plans micro-batches with :mod:`~pyspark_abs.sources.delta.offsets` and reads
them with :mod:`~pyspark_abs.sources.delta.log`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from pyspark_abs.errors import ConfigError, SourceError
from pyspark_abs.runtime import settle_worker_heap
from pyspark_abs.sources.delta.files import DeltaFilePartition, read_slice
from pyspark_abs.sources.delta.log import ChangeMode, DeltaLog, ReadSchema
from pyspark_abs.sources.delta.offsets import (
    SOURCE_NAME,
    Offset,
    parse_offset_json,
    plan_next,
    plan_slices,
)
from pyspark_abs.sources.readers import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)


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
                None if offset_json is None else Offset.parse(parse_offset_json(offset_json))
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
        self._planned: dict[str, Any] | None = None

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

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        """The end offset of the next micro-batch from ``start``, within ``limit``.

        Spark 4.0 and 4.1 give neither: the micro-batch then reads all that is there after
        the end of the last one planned here (after a restart: after the starting offset).

        Raises:
            SourceError: The next version to read removes data (without
                ``skip_change_commits``), changes the schema, or its log is gone.
        """
        if start is None:
            start, limit = self._planned or self.initialOffset(), ReadAllAvailable()
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
        self._planned = end
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

        settle_worker_heap()
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
