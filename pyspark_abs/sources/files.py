"""A directory of files read as a replayable stream, with PySpark's Python data source API.

Spark's own file source cannot start at a given offset, so a snapshot read from it cannot
be continued. This one can: files are read in a stable order, by modification time and then
name, and an offset ``{"source": "pyspark_abs_files", "files": n, "mtime_ns": t, "name": f}``
means that the first ``n`` files in that order have been read, the last of them ``f``,
modified at ``t``. A restore starts the stream right after the files of the snapshot's
epoch; files landing later are read as they arrive.

A file that lands with a modification time before the newest file already read cannot be
placed in the order. Every listing counts the files up to the offset; when there are more
than the offset says, the stream stops with a :class:`~pyspark_abs.SourceError` naming them
instead of skipping them. (Files deleted after they were read are fine.)

The module has three layers: pure planning (:func:`next_files`) over a listing, the files
themselves (:func:`list_files`, :func:`read_file`) with pyarrow, and the Spark data source
(:class:`FileSource`, registered as ``pyspark_abs_files``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.fs as pafs
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from pyspark_abs.errors import ConfigError, SourceError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SOURCE_NAME = "pyspark_abs_files"
Format = Literal["json", "csv", "text", "parquet"]
FORMATS: tuple[Format, ...] = ("json", "csv", "text", "parquet")
TEXT_SCHEMA = pa.schema([pa.field("value", pa.string())])


@dataclass(frozen=True, order=True)
class Landed:
    """A file in the directory, ordered as the stream reads: modification time, then name."""

    mtime_ns: int
    name: str


@dataclass(frozen=True)
class FileOffset:
    """The first ``files`` files in reading order have been read, the last being ``last``."""

    files: int
    last: Landed | None

    def to_dict(self) -> dict[str, Any]:
        """The offset as Spark stores it in the checkpoint's offset log."""
        last = self.last if self.last is not None else NOTHING
        return {
            "source": SOURCE_NAME,
            "files": self.files,
            "mtime_ns": last.mtime_ns,
            "name": last.name,
        }

    @classmethod
    def parse(cls, value: object) -> FileOffset:
        """Read an offset written by :meth:`to_dict`.

        Raises:
            ValueError: ``value`` is not an offset of this source.
        """
        if not isinstance(value, Mapping) or value.get("source") != SOURCE_NAME:
            raise ValueError(f"{value!r} is not an offset of the {SOURCE_NAME} source")
        if set(value) != {"source", "files", "mtime_ns", "name"}:
            raise ValueError(
                f"offset {dict(value)!r} must have exactly the keys source, files, mtime_ns, name"
            )
        files, mtime_ns, name = value["files"], value["mtime_ns"], value["name"]
        if not isinstance(files, int) or isinstance(files, bool) or files < 0:
            raise ValueError(f"offset {dict(value)!r}: files must be an integer >= 0")
        if not isinstance(mtime_ns, int) or isinstance(mtime_ns, bool) or not isinstance(name, str):
            raise ValueError(f"offset {dict(value)!r}: mtime_ns and name must be int and str")
        return cls(files, Landed(mtime_ns, name) if files else None)


START = FileOffset(0, None)
NOTHING = Landed(-1, "")
"""Sorts before every file: ``until=NOTHING`` takes none."""


def next_files(
    listing: Sequence[Landed],
    start: FileOffset,
    *,
    max_files: int | None = None,
    until: Landed | None = None,
) -> list[Landed]:
    """The files the micro-batch after ``start`` reads, in order.

    Args:
        listing: The directory's files, in any order.
        start: What has been read.
        max_files: The most files to take (None: all).
        until: Take no file after this one (``availableNow`` pins the listing).

    Raises:
        ValueError: More files sort before the offset than the offset has read: they
            landed late, with an older modification time than a file already read.
    """
    ordered = sorted(listing)
    if start.last is None:
        behind: list[Landed] = []
        ahead = ordered
    else:
        last = start.last
        behind = [f for f in ordered if f <= last]
        ahead = [f for f in ordered if f > last]
    if start.last is not None and len(behind) > start.files:
        newest = sorted((f for f in behind if f != start.last), reverse=True)
        raise ValueError(
            f"{len(behind) - start.files} file(s) landed with a modification time before "
            f"{start.last.name} (file {start.files} of those read); the newest files before it "
            f"are {[f.name for f in newest[:3]]}"
        )
    if until is not None:
        ahead = [f for f in ahead if f <= until]
    return ahead[:max_files] if max_files is not None else ahead


def list_files(directory: str) -> list[Landed]:
    """The visible files of ``directory`` (not recursive; names starting with . or _ skipped).

    Raises:
        SourceError: The directory cannot be listed.
    """
    fs, path = _location(directory)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except (OSError, pa.ArrowException) as err:
        raise SourceError(f"cannot list the files of {directory}: {err}") from None
    return [
        Landed(int(i.mtime_ns or 0), i.base_name)
        for i in infos
        if i.type == pafs.FileType.File and not i.base_name.startswith((".", "_"))
    ]


def require_folder(directory: str) -> None:
    """Fail unless ``directory`` exists and is a folder.

    Raises:
        SourceError: It does not exist, is a file, or cannot be looked at.
    """
    fs, path = _location(directory)
    try:
        kind = fs.get_file_info(path).type
    except (OSError, pa.ArrowException) as err:
        raise SourceError(f"FileSource({directory}): cannot look at the folder: {err}") from None
    if kind == pafs.FileType.NotFound:
        raise SourceError(
            f"FileSource({directory}): the folder does not exist. Check the path, or create "
            f"the folder first if the files land later"
        )
    if kind != pafs.FileType.Directory:
        raise SourceError(
            f"FileSource({directory}): this is a file, not a folder; give the folder the "
            f"files land in"
        )


def read_file(path: str, fmt: Format, schema: pa.Schema, *, header: bool = True) -> pa.Table:
    """One file's rows with ``schema`` (columns the file lacks are null).

    Raises:
        SourceError: The file cannot be read or parsed as ``fmt`` with ``schema``.
    """
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson
    import pyarrow.parquet as pq

    fs, location = _location(path)
    try:
        with fs.open_input_file(location) as native:
            stream: Any = native  # pyarrow's readers take its files; its stubs say IO
            if fmt in ("json", "csv") and native.size() == 0:
                return schema.empty_table()  # as Spark reads it; pyarrow refuses empty input
            if fmt == "parquet":
                table = pq.read_table(stream)
            elif fmt == "json":
                table = pjson.read_json(
                    stream,
                    parse_options=pjson.ParseOptions(
                        explicit_schema=schema, unexpected_field_behavior="ignore"
                    ),
                )
            elif fmt == "csv":
                names = None if header else schema.names
                table = pcsv.read_csv(
                    stream,
                    read_options=pcsv.ReadOptions(column_names=names),
                    convert_options=pcsv.ConvertOptions(
                        column_types=schema,
                        include_columns=schema.names,
                        include_missing_columns=True,
                    ),
                )
            else:
                lines = stream.read().decode("utf-8").splitlines()
                return pa.table({"value": pa.array(lines, pa.string())}, schema=TEXT_SCHEMA)
        columns = [
            table[f.name].cast(f.type)
            if f.name in table.column_names
            else pa.nulls(table.num_rows, f.type)
            for f in schema
        ]
        return pa.Table.from_arrays(columns, schema=schema)
    except (OSError, pa.ArrowException, UnicodeDecodeError) as err:
        raise SourceError(f"cannot read {path} as {fmt} with schema {schema}: {err}") from None


def _location(uri: str) -> tuple[pafs.FileSystem, str]:
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (OSError, pa.ArrowException, ValueError):
        fs, path = pafs.LocalFileSystem(), uri
    return fs, path.rstrip("/")


@dataclass(frozen=True)
class _FilePartition(InputPartition):
    path: str


@dataclass(frozen=True)
class _Settings:
    directory: str
    format: Format
    schema: StructType
    header: bool
    max_files: int | None
    starting_offset: FileOffset

    def to_options(self) -> dict[str, str]:
        return {
            "directory": self.directory,
            "format": self.format,
            "schema": self.schema.json(),
            "header": json.dumps(self.header),
            "max_files": json.dumps(self.max_files),
            "starting_offset": json.dumps(self.starting_offset.to_dict()),
        }

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> _Settings:
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

    def __init__(self, settings: _Settings) -> None:
        self._settings = settings
        self._pinned: Landed | None = None

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

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The offset after the next files, within ``limit``."""
        begin = self._offset(start, "start")
        max_files = limit.max_files if isinstance(limit, ReadMaxFiles) else None
        ahead = self._ahead(begin, max_files)
        if not ahead:
            return begin.to_dict()
        return FileOffset(begin.files + len(ahead), ahead[-1]).to_dict()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        """One partition per file between the offsets: the same files every time."""
        begin, finish = self._offset(start, "start"), self._offset(end, "end")
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
        return _Settings.parse(self.options).schema

    def streamReader(self, schema: StructType) -> FileStreamReader:
        """A stream reader over the directory."""
        return FileStreamReader(_Settings.parse(self.options))


@dataclass(frozen=True)
class FileSource:
    """A directory of files read as a stream that a restore can rewind.

    Attributes:
        path: The directory: a local path or a URL pyarrow can list.
        format: ``json`` (JSON lines), ``csv``, ``text`` (one ``value`` row per line) or
            ``parquet``.
        schema: The rows' schema, a DDL string or a StructType; required except for
            ``text`` (always ``value string``).
        max_files_per_trigger: The most files per micro-batch (None: all that landed).
        header: CSV files start with a header line naming the columns.

    Raises:
        ConfigError: An unknown format, a missing or superfluous schema, or a limit that is
            not a positive integer.
    """

    path: str
    format: Format
    schema: str | StructType | None = None
    max_files_per_trigger: int | None = None
    header: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path.strip():
            raise ConfigError(f"FileSource: path must be a non-empty string, got {self.path!r}")
        if self.format not in FORMATS:
            raise ConfigError(
                f"FileSource({self.path}): format must be one of {list(FORMATS)}, got "
                f"{self.format!r}"
            )
        if self.format == "text" and self.schema is not None:
            raise ConfigError(
                f"FileSource({self.path}): text files have the schema 'value string'; "
                f"leave schema out"
            )
        if self.format != "text" and self.schema is None:
            raise ConfigError(
                f"FileSource({self.path}): {self.format} files need a schema, e.g. "
                f"schema='word string, ts timestamp'"
            )
        limit = self.max_files_per_trigger
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 1
        ):
            raise ConfigError(
                f"FileSource({self.path}): max_files_per_trigger must be a positive integer or "
                f"None, got {limit!r}"
            )

    def load(self, spark: SparkSession, starting_offset: FileOffset = START) -> DataFrame:
        """A streaming DataFrame of the files, from the first or right after ``starting_offset``.

        Raises:
            OperatorDefinitionError: ``schema`` is not a valid DDL schema.
            SourceError: ``path`` is not a folder that exists.
        """
        from pyspark_abs.operators.schema import resolve_struct, to_spark

        require_folder(self.path)

        if self.schema is None:  # text
            schema = to_spark(TEXT_SCHEMA)
        else:
            schema = resolve_struct(self.schema, f"FileSource({self.path}) schema")
        settings = _Settings(
            self.path, self.format, schema, self.header, self.max_files_per_trigger, starting_offset
        )
        spark.dataSource.register(FileDataSource)
        return spark.readStream.format(SOURCE_NAME).options(**settings.to_options()).load()

    def rewound(self, spark: SparkSession, offset_json: str) -> DataFrame:
        """The stream starting right after a recorded offset (see :meth:`offset_of`)."""
        return self.load(spark, self.offset_of(offset_json))

    @staticmethod
    def offset_of(offset_json: str) -> FileOffset:
        """Parse one offset of this source, as Spark wrote it to a checkpoint's offset log.

        Raises:
            ConfigError: The text is not JSON, or not an offset of this source.
        """
        try:
            return FileOffset.parse(json.loads(offset_json))
        except (json.JSONDecodeError, TypeError, ValueError) as err:
            raise ConfigError(f"{offset_json!r} is not an offset of {SOURCE_NAME}: {err}") from None
