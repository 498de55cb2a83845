"""Reading a Delta table's log for the Delta source: its versions, data files and schemas."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql.types import StructType

from pyspark_abs.errors import SourceError
from pyspark_abs.sources.delta.files import file_location, table_location
from pyspark_abs.sources.delta.offsets import (
    VersionRows,
)

_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")


COLUMN_MAPPING = "delta.columnMapping.mode"


ChangeMode = Literal["fail", "skip", "read"]
"""What the stream does with a commit that removes data: stop, skip it, or read its adds."""


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
        self._fs, self._root = table_location(uri)
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
            raise self._unreadable("list the log", err) from None
        return sorted(
            int(match.group(1)) for info in infos if (match := _COMMIT_FILE.match(info.base_name))
        )

    def _exists(self, version: int) -> bool:
        try:
            info = self._fs.get_file_info(self._commit_path(version))
        except (OSError, pa.ArrowException) as err:
            raise self._unreadable(f"look for version {version} in the log", err) from None
        return bool(info.type != pafs.FileType.NotFound)

    def _unreadable(self, what: str, err: Exception) -> SourceError:
        return SourceError(
            f"cannot {what} of Delta table {self.uri}: {err}. Check that its store answers "
            f"and the credentials hold, then retry: the stream starts again from its checkpoint"
        )

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
        mode = configuration.get(COLUMN_MAPPING, "none")
        if mode not in (None, "none"):
            return (
                f"version {version} of Delta table {self.uri} uses column mapping "
                f"({COLUMN_MAPPING}={mode}), which this source cannot read"
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
                fs, location = file_location(self.uri, path)
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

    from pyspark_abs.operators.arrow_types import to_spark

    exported: Any = Schema.from_json(schema_json).to_arrow()
    return to_spark(pa.schema(exported))
