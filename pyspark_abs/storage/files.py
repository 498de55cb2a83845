"""Data files of Delta tables: entries tasks write, and files a table adds, removes, holds."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable

FILE_TYPE = pa.struct(
    [
        pa.field("table", pa.string()),
        pa.field("path", pa.string()),
        pa.field("size_bytes", pa.int64()),
        pa.field("num_rows", pa.int64()),
        pa.field("crc32", pa.int64()),
        pa.field("partition_values", pa.string()),
        pa.field("stats", pa.string()),
    ]
)
"""Arrow type of one pre-committed file, in markers and in the manifest."""

_GONE = pafs.FileType.NotFound


@dataclass(frozen=True)
class FileEntry:
    """A data file written by a pre-commit task, not yet in any Delta log.

    Attributes:
        table: Table id, e.g. ``state/word_count`` or ``sink/output``.
        path: Path relative to the table's root.
        size_bytes: File size.
        num_rows: Rows in the file.
        crc32: CRC-32 of the file's bytes.
        partition_values: Hive partition values as JSON (``{}`` when unpartitioned).
        stats: Delta statistics JSON for the add action.
    """

    table: str
    path: str
    size_bytes: int
    num_rows: int
    crc32: int
    partition_values: str = "{}"
    stats: str = "{}"

    @property
    def partitions(self) -> dict[str, str | None]:
        """Partition values as a dict."""
        values: dict[str, str | None] = json.loads(self.partition_values)
        return values

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> FileEntry:
        """Build an entry from a row dict (Spark Row.asDict() or Arrow to_pylist())."""
        return cls(**{k: row[k] for k in FILE_TYPE.names})

    def to_dict(self) -> dict[str, Any]:
        """The entry as a row dict."""
        return asdict(self)


def add_actions(table: DeltaTable) -> list[dict[str, Any]]:
    """The add actions of a table version: path, size_bytes, ..."""
    actions: list[dict[str, Any]] = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    return actions


def files_at(uri: str, version: int) -> list[dict[str, Any]]:
    """The add actions of the table at ``uri`` as of ``version`` (see :func:`add_actions`)."""
    return add_actions(DeltaTable(uri, version=version))


def missing_files(uri: str, version: int) -> list[str]:
    """The files the table at ``uri`` referenced as of ``version`` that are gone (vacuumed).

    Only files the latest version no longer references are looked for.
    """
    fs, base = pafs.FileSystem.from_uri(uri)
    latest = {str(action["path"]) for action in add_actions(DeltaTable(uri))}
    paths = [str(a["path"]) for a in files_at(uri, version) if str(a["path"]) not in latest]
    found = fs.get_file_info([f"{base}/{path}" for path in paths])
    return [path for path, info in zip(paths, found, strict=True) if info.type == _GONE]


def read_files(uri: str, paths: Sequence[str], columns: Sequence[str]) -> pa.Table:
    """Columns of Parquet files under a table root (pre-committed files, say)."""
    fs, root = pafs.FileSystem.from_uri(uri)
    return pq.read_table([f"{root}/{p}" for p in paths], columns=list(columns), filesystem=fs)


def file_sizes(uri: str, paths: Sequence[str]) -> list[int | None]:
    """Sizes of files under a table root; None for a missing file."""
    fs, root = pafs.FileSystem.from_uri(uri)
    infos = fs.get_file_info([f"{root}/{p}" for p in paths])
    return [None if i.type == pafs.FileType.NotFound else int(i.size) for i in infos]


def damaged(uri: str, files: Sequence[FileEntry]) -> tuple[FileEntry, int | None] | None:
    """The first of ``files`` (under table root ``uri``) missing or not of its written size.

    Returns the file and the size found (None: missing), or None if every file is intact.
    """
    sizes = file_sizes(uri, [f.path for f in files])
    for entry, size in zip(files, sizes, strict=True):
        if size != entry.size_bytes:
            return entry, size
    return None


def delete_files(uri: str, paths: Sequence[str]) -> None:
    """Delete files under a table root that no Delta log references; missing is fine."""
    fs, root = pafs.FileSystem.from_uri(uri)
    for path in paths:
        try:
            fs.delete_file(f"{root}/{path}")
        except FileNotFoundError:
            continue


def removed_paths(uri: str) -> dict[str, int | None]:
    """Files the table's JSON log entries remove (committed once, replaced since).

    Each with the newest ``deletionTimestamp`` of its removes, in ms since the Unix epoch
    (None where a remove has none).
    """
    fs, base = pafs.FileSystem.from_uri(uri)
    selector = pafs.FileSelector(f"{base}/_delta_log", allow_not_found=True)
    removed: dict[str, int | None] = {}
    for info in fs.get_file_info(selector):
        if info.type != pafs.FileType.File or not info.path.endswith(".json"):
            continue
        try:
            with fs.open_input_stream(info.path) as stream:
                lines = stream.read().decode().splitlines()
        except (OSError, UnicodeDecodeError):
            continue  # a damaged or vanished entry: keep its files
        for line in lines:
            try:
                action = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(action, dict) and isinstance(action.get("remove"), dict):
                path = unquote(str(action["remove"].get("path", "")))
                stamp = action["remove"].get("deletionTimestamp")
                when = int(stamp) if isinstance(stamp, int) else None
                earlier = removed.get(path, when)
                removed[path] = None if when is None or earlier is None else max(when, earlier)
    return removed


def data_files(uri: str) -> Iterable[tuple[str, float]]:
    """Data files under a table root (not its log): relative path and age in seconds."""
    fs, base = pafs.FileSystem.from_uri(uri)
    now = time.time()
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    for info in fs.get_file_info(selector):
        relative = info.path[len(base) :].lstrip("/")
        if info.type != pafs.FileType.File or relative.startswith("_delta_log"):
            continue
        if not relative.endswith(".parquet"):
            continue
        modified = info.mtime.timestamp() if info.mtime is not None else now
        yield relative, now - modified


def files_after(
    files: Mapping[int, Sequence[FileEntry]], committed_through: int | None
) -> list[FileEntry]:
    """The files of the epochs after ``committed_through``, in epoch order.

    A table whose application transaction version is ``committed_through`` holds the files
    of that epoch and of every earlier one: commits are made in epoch order, each with every
    epoch up to its own.
    """
    done = -1 if committed_through is None else committed_through
    return [f for epoch in sorted(files) if epoch > done for f in files[epoch]]


def read_added(
    uri: str, paths: Sequence[str], partitions: Mapping[str, Any], schema: pa.Schema
) -> pa.Table:
    """The rows of files a commit added, with their Hive partition columns, as ``schema``.

    Columns added to the table since a file was written are null in its rows.

    Args:
        uri: The table's location.
        paths: The added files, relative to the table.
        partitions: Each file's partition values as the log writes them (column, text).
        schema: The table's columns.
    """
    fs, root = pafs.FileSystem.from_uri(uri)
    parts = []
    for path in paths:
        part = pq.read_table(f"{root}/{path}", filesystem=fs)
        for column, text in dict(partitions.get(path, ())).items():
            if column not in part.column_names:
                kind = schema.field(column).type
                values = pa.array([text] * part.num_rows, pa.string()).cast(kind)
                part = part.append_column(column, values)
        for field in schema:
            if field.name not in part.column_names:  # a column added since the file was written
                part = part.append_column(field, pa.nulls(part.num_rows, field.type))
        parts.append(part.select(schema.names).cast(schema))
    return pa.concat_tables(parts) if parts else schema.empty_table()
