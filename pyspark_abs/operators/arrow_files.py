"""Reading Parquet files given by location, on local paths and object stores alike.

delta-rs lists a table's files as URIs (``s3://bucket/key``, ``abfss://container@account
.dfs.core.windows.net/path``), which pyarrow reads only through a file system and a path in
that file system's own form.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

_AZURE = ("abfs", "abfss", "az", "adl")


def arrow_path(uri: str) -> str:
    """The path of ``uri`` within its pyarrow file system (bucket or container first)."""
    parts = urlsplit(uri)
    if len(parts.scheme) <= 1:  # a local path (or a Windows drive letter)
        return uri
    if parts.scheme == "file":
        return parts.path
    authority = parts.netloc.split("@")[0] if parts.scheme in _AZURE else parts.netloc
    return f"{authority}{parts.path}"


def read_parquet(
    uris: Sequence[str], columns: Sequence[str] | None = None, schema: pa.Schema | None = None
) -> pa.Table:
    """The rows of Parquet files, all on the file system of the first one.

    Files that hold every column of ``schema`` with its type are read one by one; otherwise
    pyarrow's dataset reader reconciles them (it fills missing columns with nulls and casts),
    at the price of loading pandas, which a Python data source process would not otherwise.
    """
    filesystem, _ = pafs.FileSystem.from_uri(uris[0])
    paths = [arrow_path(u) for u in uris]
    if schema is not None:
        wanted = schema
        if columns is not None:
            wanted = pa.schema([schema.field(c) for c in columns]).with_metadata(schema.metadata)
        tables = []
        for path in paths:
            with pq.ParquetFile(path, filesystem=filesystem) as file:
                if not _holds(file.schema_arrow, wanted):
                    break
                tables.append(file.read(columns=wanted.names).select(wanted.names).cast(wanted))
        else:
            return pa.concat_tables(tables)
    return pq.read_table(
        paths,
        columns=list(columns) if columns is not None else None,
        schema=schema,
        filesystem=filesystem,
    )


def _holds(found: pa.Schema, wanted: pa.Schema) -> bool:
    """Whether a file's schema has every wanted column, each of the wanted type."""
    names = set(found.names)
    return all(f.name in names and found.field(f.name).type == f.type for f in wanted)
