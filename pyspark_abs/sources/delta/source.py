"""A Delta table read as a replayable stream: :class:`DeltaSource`, what a user declares.

The stream reads the rows that the table's commits append, version after version. An offset
``{"source": "pyspark_abs_delta", "version": v, "index": i}`` means that every row before
row ``i`` of version ``v`` has been read (a ``"tag"`` names the stream when a query reads
several), where the rows of a version are those of its
``add`` actions with ``dataChange=true``, in the order of ``_delta_log/<v:020d>.json``,
concatenated. Offsets depend only on the table's log, so a range of offsets always reads
the same rows.

The stream has three layers, a module each, lowest first:

* :mod:`~pyspark_abs.sources.delta.offsets`: pure offset planning over per-version row
  counts, without I/O;
* :mod:`~pyspark_abs.sources.delta.log`: the Delta log and file access with pyarrow;
* :mod:`~pyspark_abs.sources.delta.stream`: the Spark data source ``pyspark_abs_delta``,
  which :meth:`DeltaSource.load` registers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pyspark_abs.errors import ConfigError, SnapshotDamagedError, SnapshotRootError, SourceError
from pyspark_abs.runtime import require_python_sources, require_workers_import
from pyspark_abs.sources.delta.log import COLUMN_MAPPING
from pyspark_abs.sources.delta.offsets import SOURCE_NAME, Offset, parse_offset_json
from pyspark_abs.storage.root import normalize_uri

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


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
            ConfigError: pyspark-abs came with ``--py-files`` and the workers' Python lacks it.
            SparkVersionError: A read limit is given and the session runs Spark 4.0 or 4.1.
        """
        if self.max_rows_per_trigger is not None or self.max_files_per_trigger is not None:
            require_python_sources(
                spark,
                f"DeltaSource({self.path}): max_rows_per_trigger and max_files_per_trigger, "
                f"read limits of a Python data source,",
                "Leave them out: each micro-batch then reads all the table's new versions.",
            )
        require_workers_import(spark, f"DeltaSource({self.path})")
        from pyspark_abs.sources.delta.stream import DeltaDataSource

        options = self._options(starting_offset)
        spark.dataSource.register(DeltaDataSource)
        return spark.readStream.format(SOURCE_NAME).options(**options).load()

    def _options(self, starting_offset: Mapping[str, Any] | None = None) -> dict[str, str]:
        """The data source's options, read from the table's log now (see :meth:`load`)."""
        from pyspark_abs.operators.arrow_types import to_spark
        from pyspark_abs.storage.schemas import arrow_schema
        from pyspark_abs.storage.store import DeltaStore

        uri = normalize_uri(self.path)
        try:
            table = DeltaStore().open(uri)
        except SnapshotRootError:
            raise SourceError(
                f"no Delta table at {uri}. Check the path, or create the table before "
                f"starting the stream"
            ) from None
        except (SnapshotDamagedError, OSError) as err:
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
        return parse_offset_json(offset_json)
