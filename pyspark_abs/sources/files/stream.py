"""Spark's Python data source over a directory of files, registered as ``pyspark_abs_files``.

The reading order, offsets and file reading are in :mod:`.offsets`; this module only plans
Spark's micro-batches with them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from pyspark_abs.errors import ConfigError, SourceError
from pyspark_abs.runtime import settle_worker_heap
from pyspark_abs.sources.files.offsets import (
    FORMATS,
    NOTHING,
    SOURCE_NAME,
    FileOffset,
    Format,
    Landed,
    list_files,
    next_files,
    read_file,
)
from pyspark_abs.sources.readers import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)


@dataclass(frozen=True)
class _FilePartition(InputPartition):
    path: str


@dataclass(frozen=True)
class FileSettings:
    """What one :class:`~pyspark_abs.sources.files.offsets.FileSource` stream reads, as options."""

    directory: str
    format: Format
    schema: StructType
    header: bool
    max_files: int | None
    starting_offset: FileOffset

    def to_options(self) -> dict[str, str]:
        """The settings as the data source's string options."""
        return {
            "directory": self.directory,
            "format": self.format,
            "schema": self.schema.json(),
            "header": json.dumps(self.header),
            "max_files": json.dumps(self.max_files),
            "starting_offset": json.dumps(self.starting_offset.to_dict()),
        }

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> FileSettings:
        """The settings from the data source's options (see :meth:`to_options`)."""
        fmt = options["format"]
        if fmt not in FORMATS:
            raise ConfigError(f"{SOURCE_NAME}: format must be one of {FORMATS}, got {fmt!r}")
        schema = StructType.fromJson(json.loads(options["schema"]))
        return cls(
            directory=options["directory"],
            format=fmt,
            schema=schema,
            header=bool(json.loads(options["header"])),
            max_files=json.loads(options["max_files"]),
            starting_offset=FileOffset.parse(json.loads(options["starting_offset"])),
        )


class FileStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark's stream reader over a directory (one partition per file)."""

    def __init__(self, settings: FileSettings) -> None:
        self._settings = settings
        self._pinned: Landed | None = None
        self._planned = settings.starting_offset

    def initialOffset(self) -> dict[str, Any]:
        """Right after the starting offset (the beginning unless restored)."""
        return self._settings.starting_offset.to_dict()

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxFiles`` with ``max_files_per_trigger``, else ``ReadAllAvailable``."""
        if self._settings.max_files is not None:
            return ReadMaxFiles(self._settings.max_files)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Pin the listing: ``availableNow`` reads no file that lands after this."""
        files = list_files(self._settings.directory)
        self._pinned = max(files) if files else NOTHING

    def _offset(self, value: object, what: str) -> FileOffset:
        try:
            return FileOffset.parse(value)
        except ValueError as err:
            raise SourceError(
                f"the {what} offset of the stream over {self._settings.directory} is not this "
                f"source's: {err}. Was the checkpoint written by another query?"
            ) from None

    def _ahead(self, start: FileOffset, max_files: int | None) -> list[Landed]:
        try:
            return next_files(
                list_files(self._settings.directory),
                start,
                max_files=max_files,
                until=self._pinned,
            )
        except ValueError as err:
            raise SourceError(
                f"the stream over {self._settings.directory} cannot go on: {err}. Files must "
                f"land with increasing modification times; move the late files away (or "
                f"into a new directory read by another stream)"
            ) from None

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        """The offset after the next files, within ``limit``.

        Spark 4.0 and 4.1 give neither: the offset is then after every file that has landed
        since the end of the last micro-batch planned here (after a restart: since the
        stream's starting offset).
        """
        begin = self._planned if start is None else self._offset(start, "start")
        max_files = limit.max_files if isinstance(limit, ReadMaxFiles) else None
        ahead = self._ahead(begin, max_files)
        if not ahead:
            return begin.to_dict()
        return FileOffset(begin.files + len(ahead), ahead[-1]).to_dict()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        """One partition per file between the offsets: the same files every time."""
        begin, finish = self._offset(start, "start"), self._offset(end, "end")
        self._planned = finish
        count = finish.files - begin.files
        files = self._ahead(begin, None) if count > 0 else []
        files = [f for f in files if finish.last is not None and f <= finish.last]
        if len(files) != count:
            raise SourceError(
                f"the stream over {self._settings.directory} lost files between offsets "
                f"{start} and {end}: {count} were planned, {len(files)} are there"
            )
        directory = self._settings.directory.rstrip("/")
        return [_FilePartition(f"{directory}/{f.name}") for f in files]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The file's rows as record batches with the stream's Arrow schema."""
        from pyspark_abs.operators.schema import to_arrow

        settle_worker_heap()
        if not isinstance(partition, _FilePartition):
            raise SourceError(f"unexpected partition {partition!r} for {SOURCE_NAME}")
        schema = to_arrow(self._settings.schema, nullable=True)
        table = read_file(
            partition.path, self._settings.format, schema, header=self._settings.header
        )
        return iter(table.to_batches())


class FileDataSource(DataSource):
    """The ``pyspark_abs_files`` data source; created by :meth:`FileSource.load`."""

    @classmethod
    def name(cls) -> str:
        """The short name to pass to ``readStream.format``."""
        return SOURCE_NAME

    def schema(self) -> StructType:
        """The schema given to the :class:`FileSource`."""
        return FileSettings.parse(self.options).schema

    def streamReader(self, schema: StructType) -> FileStreamReader:
        """A stream reader over the directory."""
        return FileStreamReader(FileSettings.parse(self.options))
