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

The module has the pure planning (:func:`next_files`) over a listing, the files themselves
(:func:`list_files`, :func:`read_file`) with pyarrow. Spark's data source, registered as
``pyspark_abs_files``, is in :mod:`.stream`, and the declaration users write,
:class:`FileSource`, in :mod:`.source`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.fs as pafs

from pyspark_abs.errors import SourceError

if TYPE_CHECKING:
    pass

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
