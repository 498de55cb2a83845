"""The declaration of a directory of files read as a stream a restore can rewind.

How the files are ordered and read is in :mod:`.offsets`, Spark's data source in
:mod:`.stream`, imported only when a stream is loaded: on Spark 4.0 and 4.1 it is
refused before then.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.types import StructType

from pyspark_abs.errors import ConfigError
from pyspark_abs.runtime import require_python_sources, require_workers_import
from pyspark_abs.sources.files.offsets import (
    FORMATS,
    SOURCE_NAME,
    START,
    TEXT_SCHEMA,
    FileOffset,
    Format,
    require_folder,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


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
            ConfigError: pyspark-abs came with ``--py-files`` and the workers' Python lacks it.
            SparkVersionError: A read limit is given and the session runs Spark 4.0 or 4.1.
        """
        from pyspark_abs.operators.arrow_types import to_spark
        from pyspark_abs.operators.schema import resolve_struct

        if self.max_files_per_trigger is not None:
            require_python_sources(
                spark,
                f"FileSource({self.path}): max_files_per_trigger, a read limit of a Python "
                f"data source,",
                "Leave it out: each micro-batch then reads every file that has landed.",
            )
        require_workers_import(spark, f"FileSource({self.path})")
        from pyspark_abs.sources.files.stream import FileDataSource, FileSettings

        require_folder(self.path)

        if self.schema is None:  # text
            schema = to_spark(TEXT_SCHEMA)
        else:
            schema = resolve_struct(self.schema, f"FileSource({self.path}) schema")
        settings = FileSettings(
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
