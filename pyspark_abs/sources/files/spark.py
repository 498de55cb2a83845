"""Spark's own file source (``readStream.json(dir)`` and the like), rewindable to a snapshot.

Spark's file source records ``{"logOffset": n}`` in the checkpoint: every file its metadata
log (``<checkpoint>/sources/<i>/``) lists for batches up to ``n`` has been read. No option
starts the source at an offset, so a rewound stream reads the directory afresh and drops the
rows of the files read through the snapshot. Which files those were is resolved when the
restore epoch is installed, from the checkpoint that produced the snapshot (while it still
exists), and kept in the root's ``_rewinds`` table (:mod:`.rewinds`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from pyspark.sql.types import StructType

from pyspark_abs.errors import ConfigError, SourceError
from pyspark_abs.sources.readers import require_text_options

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_COMPACT = ".compact"
_LOG_VERSION = "v1"
_SCHEME = r"^[A-Za-z][A-Za-z0-9+.-]*:(//[^/]*)?"
_NO_SCHEMA = ("text", "binaryFile")


@dataclass(frozen=True)
class SparkFileSource:
    """Spark's own streaming file source for a :class:`~pyspark_abs.Pipeline`, rewindable.

    It reads what ``spark.readStream.format(format).schema(schema).options(**options)
    .load(path)`` reads, on every Spark version. Rollback and restore start it on a fresh
    checkpoint that skips the files the snapshot had read.

    Attributes:
        path: The directory (or glob) Spark reads.
        format: Spark's format name: ``json``, ``csv``, ``parquet``, ``orc``, ``text``, ...
        schema: The rows' schema, a DDL string or a StructType; required except for
            ``text`` and ``binaryFile``.
        options: Spark's reader options (``maxFilesPerTrigger``, ``header``, ...).
            ``cleanSource`` is refused: a rewind re-reads files after the snapshot, which
            archiving or deleting them would lose.

    Raises:
        ConfigError: An empty path or format, a missing schema, options that are not text,
            or ``cleanSource``.
    """

    path: str
    format: str
    schema: str | StructType | None = None
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("path", "format"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(
                    f"SparkFileSource: {name} must be a non-empty string, got {value!r}"
                )
        if self.schema is None and self.format not in _NO_SCHEMA:
            raise ConfigError(
                f"SparkFileSource({self.path}): a streaming {self.format} source needs a "
                f"schema, e.g. schema='word string, ts timestamp'"
            )
        require_text_options(self.options, f"SparkFileSource({self.path})")
        clean = {k.lower(): v for k, v in self.options.items()}.get("cleansource", "off")
        if clean.lower() != "off":
            raise ConfigError(
                f"SparkFileSource({self.path}): cleanSource={clean!r} archives or deletes "
                f"files once read, but a rollback or restore reads the files after its "
                f"snapshot again. Leave cleanSource out and expire old input yourself"
            )

    def load(self, spark: SparkSession) -> DataFrame:
        """A streaming DataFrame of the files.

        Raises:
            OperatorDefinitionError: ``schema`` is not a valid DDL schema.
            SourceError: Spark cannot read the path in this format.
        """
        from pyspark_abs.operators.schema import resolve_struct

        reader = spark.readStream.format(self.format).options(**self.options)
        if self.schema is not None:
            reader = reader.schema(resolve_struct(self.schema, f"SparkFileSource({self.path})"))
        try:
            return reader.load(self.path)
        except Exception as err:
            raise SourceError(
                f"SparkFileSource({self.path}): Spark cannot stream {self.format} files from "
                f"it ({str(err).splitlines()[0]}); check the path, format and options"
            ) from None

    def rewound(self, spark: SparkSession, read: Iterable[str]) -> DataFrame:
        """The stream without the rows of the files in ``read`` (paths as Spark's log has them)."""
        from pyspark.sql import functions as F

        skipped = sorted(path_forms(read))
        frame = self.load(spark)
        if not skipped:
            return frame
        path = F.regexp_replace(F.col("_metadata.file_path"), _SCHEME, "")
        return frame.where(~path.isin(skipped))

    @staticmethod
    def log_offset_of(offset_json: str) -> int:
        """The batch of the metadata log an offset of Spark's file source points at.

        Raises:
            ConfigError: The text is not an offset of Spark's file source.
        """
        try:
            value = json.loads(offset_json)
        except (json.JSONDecodeError, TypeError):
            value = None
        if not isinstance(value, dict) or set(value) != {"logOffset"}:
            raise ConfigError(f"{offset_json!r} is not an offset of Spark's file source")
        offset = value["logOffset"]
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise ConfigError(f"{offset_json!r} is not an offset of Spark's file source")
        return offset


def path_forms(paths: Iterable[str]) -> set[str]:
    """Each path without its scheme and authority, as recorded and URL-decoded.

    Spark's log writes ``file:///a/b%20c.json`` where ``_metadata.file_path`` has
    ``file:/a/b%20c.json``; both become ``/a/b%20c.json``.
    """
    found: set[str] = set()
    for path in paths:
        bare = re.sub(_SCHEME, "", path) if urlsplit(path).scheme else path
        found.update((bare, unquote(bare)))
    return found


def files_through(log: Mapping[str, str], batch: int) -> list[str]:
    """The files a file source's metadata log lists for batches up to ``batch``.

    Args:
        log: The log's files by name (``"7"``, ``"9.compact"``, ...) to their text.
        batch: The ``logOffset`` of the snapshot.

    Raises:
        SourceError: The log does not reach ``batch``, or a file is not a log file.
    """
    compacts = [int(n.removesuffix(_COMPACT)) for n in log if n.endswith(_COMPACT)]
    start = max(compacts, default=-1)
    names = [f"{start}{_COMPACT}"] if start >= 0 else []
    names += sorted((n for n in log if n.isdigit() and int(n) > start), key=int)
    if start < batch and str(batch) not in log:
        raise SourceError(f"Spark's file source log has no batch {batch} (it holds {sorted(log)})")
    files: list[str] = []
    for name in names:
        lines = log[name].splitlines()
        if not lines or lines[0] != _LOG_VERSION:
            raise SourceError(f"{name} is not a file of Spark's file source log")
        for line in lines[1:]:
            entry = json.loads(line)
            if int(entry["batchId"]) <= batch:
                files.append(str(entry["path"]))
    return files
