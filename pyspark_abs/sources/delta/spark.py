"""Spark's own Delta source (``readStream.format("delta")``), rewindable to a snapshot's offsets.

Delta's streaming source records ``{"sourceVersion": 1, "reservoirId": <table id>,
"reservoirVersion": v, "index": i, "isStartingVersion": b}`` in the checkpoint. With index
-1 outside the table's initial snapshot, every change before version ``v`` has been read.
Version ``v`` often does not exist yet (the query had read the whole table), and Delta
refuses a ``startingVersion`` (or ``startingTimestamp``) after the latest commit, while
``"latest"`` would skip a commit that lands before the new query plans its first batch. So
the rewound stream starts at version ``v - 1``, which exists, and drops the rows of the files
that version ``v - 1`` added, by file name: the same rows whenever it starts or restarts.
An offset inside a version (``maxFilesPerTrigger`` or
``maxBytesPerTrigger`` cut the version, or the initial snapshot, in two) has no option that
continues it, so an epoch that ends there cannot be rewound and is refused up front.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from pyspark_abs.errors import ConfigError, SourceError
from pyspark_abs.sources.readers import require_text_options

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_BOUNDARY = -1
_STARTS = ("startingVersion", "startingTimestamp")
_DELTA_JARS = "io.delta:delta-spark_<spark major.minor>_2.13"


@dataclass(frozen=True)
class DeltaPosition:
    """Where a Delta stream continues after a recorded offset.

    Attributes:
        table_id: The table's id (Delta's ``reservoirId``).
        version: The first table version still to read.
    """

    table_id: str
    version: int


@dataclass(frozen=True)
class SparkDeltaSource:
    """Spark's own Delta streaming source for a :class:`~pyspark_abs.Pipeline`, rewindable.

    It reads what ``spark.readStream.format("delta")`` reads (Delta Lake's jars must be on the
    session, as on Databricks). Rollback and restore start it on a fresh checkpoint right
    after the snapshot's offsets, with ``startingVersion``.

    Attributes:
        path: The table's location; give it or ``table``.
        table: The table's name in the session's catalog; give it or ``path``.
        options: Delta's streaming options (``maxFilesPerTrigger``, ``skipChangeCommits``,
            ...). ``startingVersion`` and ``startingTimestamp`` apply to a new pipeline
            only; a start from a restore epoch replaces them. A read limit that cuts a table
            version in two makes the epochs that end inside it impossible to rewind.

    Raises:
        ConfigError: Neither or both of ``path`` and ``table``, or options that are not text.
    """

    path: str | None = None
    table: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.path is None) == (self.table is None):
            raise ConfigError(
                f"SparkDeltaSource needs exactly one of path= and table=, got path={self.path!r} "
                f"table={self.table!r}"
            )
        require_text_options(self.options, f"SparkDeltaSource({self.name})")

    @property
    def name(self) -> str:
        """The table's path or name, as given."""
        return self.path if self.path is not None else str(self.table)

    def load(self, spark: SparkSession, starting_version: int | None = None) -> DataFrame:
        """A streaming DataFrame of the table, from ``starting_version`` if given.

        Raises:
            SourceError: Delta Lake's jars are not on the session, or the table cannot be read.
        """
        options = dict(self.options)
        if starting_version is not None:
            options = {k: v for k, v in options.items() if k not in _STARTS}
            options["startingVersion"] = str(starting_version)
        reader = spark.readStream.format("delta").options(**options)
        try:
            return reader.load(self.path) if self.path is not None else reader.table(self.name)
        except Exception as err:
            text = str(err)
            if "DATA_SOURCE_NOT_FOUND" not in text and "Failed to find data source" not in text:
                raise SourceError(
                    f"SparkDeltaSource({self.name}): cannot read the Delta table "
                    f"({text.splitlines()[0]}); check the path or table name"
                ) from None
            raise SourceError(
                f"SparkDeltaSource({self.name}): Delta Lake's jars are not on the session "
                f"({text.splitlines()[0]}); add them, e.g. spark-submit --packages "
                f"{_DELTA_JARS}:<version> with Delta's SQL extension and catalog (Databricks "
                f"runtimes include them), or read the table with pyspark_abs.DeltaSource"
            ) from None

    def rewound(self, spark: SparkSession, offset_json: str) -> DataFrame:
        """The stream starting right after a recorded offset, on the same table.

        Raises:
            SourceError: The offset cannot be continued (see :meth:`position_of`), or the
                table now at ``path``/``table`` is another table than the one recorded.
        """
        from pyspark.sql import functions as F

        position = self.position_of(offset_json)
        target = f"delta.`{self.path.replace('`', '``')}`" if self.path is not None else self.name
        try:
            found = spark.sql(f"DESCRIBE DETAIL {target}").first()
        except Exception as err:
            raise SourceError(
                f"SparkDeltaSource({self.name}): cannot read the table to resume right after "
                f"the snapshot's offset ({str(err).splitlines()[0]}); point the source at the "
                f"Delta table the snapshot read (table {position.table_id})"
            ) from None
        if found is None or found["id"] != position.table_id:
            raise SourceError(
                f"SparkDeltaSource({self.name}) is table {found['id'] if found else None}, but "
                f"the snapshot read table {position.table_id} (the table was replaced or the "
                f"source points elsewhere); start from a snapshot of this table, or point "
                f"the source at the table the snapshot read"
            )
        if position.version == 0:
            return self.load(spark, 0)
        previous = position.version - 1
        names = self._added_names(spark, str(found["location"]), previous)
        frame = self.load(spark, previous)
        if not names:
            return frame
        name = F.element_at(F.split(F.input_file_name(), "/"), -1)
        return frame.where(~name.isin(sorted(names)))

    def _added_names(self, spark: SparkSession, location: str, version: int) -> set[str]:
        """The names of the files that ``version`` of the table adds.

        Raises:
            SourceError: The version's log entry cannot be read.
        """
        entry = f"{location.rstrip('/')}/_delta_log/{version:020d}.json"
        try:
            actions = spark.read.json(entry)
            paths: list[Any] = (
                [r.path for r in actions.where("add IS NOT NULL").select("add.path").collect()]
                if "add" in actions.columns
                else []
            )
        except Exception as err:
            raise SourceError(
                f"SparkDeltaSource({self.name}): cannot read version {version}'s log entry "
                f"{entry} ({str(err).splitlines()[0]}), which a rewind past it needs. If it "
                f"expired with Delta's log retention (delta.logRetentionDuration), start from "
                f"a newer snapshot; if the session may not read the table's files by path "
                f"(a catalog-managed table), give the source the table's path"
            ) from None
        # the log holds each path URL-encoded; a file's name may reach Spark either way
        return {posixpath.basename(form) for p in paths for form in (str(p), unquote(str(p)))}

    @staticmethod
    def position_of(offset_json: str) -> DeltaPosition:
        """Where the stream continues after one offset Spark's Delta source recorded.

        Raises:
            ConfigError: The text is not an offset of Spark's Delta source.
            SourceError: The offset lies inside a table version, where no option continues.
        """
        try:
            value = json.loads(offset_json)
        except (json.JSONDecodeError, TypeError):
            value = None
        keys = ("reservoirId", "reservoirVersion", "index", "isStartingVersion")
        if not isinstance(value, dict) or not all(k in value for k in keys):
            raise ConfigError(f"{offset_json!r} is not an offset of Spark's Delta source")
        version, index = value["reservoirVersion"], value["index"]
        if value["isStartingVersion"] or index != _BOUNDARY:
            where = "the table's initial snapshot" if value["isStartingVersion"] else "it"
            raise SourceError(
                f"Spark's Delta source stopped inside version {version} of table "
                f"{value['reservoirId']} (file {index} of {where}; a read limit such as "
                f"maxFilesPerTrigger or maxBytesPerTrigger cut the version in two), and no "
                f"option starts a Delta stream inside a version. Pick an epoch that ends on "
                f"a version boundary, or raise the read limit above the files of one commit"
            )
        return DeltaPosition(str(value["reservoirId"]), int(version))
