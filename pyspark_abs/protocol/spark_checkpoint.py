"""Reading Spark's streaming checkpoint: the query id and each micro-batch's offsets.

Spark writes ``offsets/<batch>`` before it runs a micro-batch and ``commits/<batch>`` after
the sink returns. The offsets file holds the source offsets, the watermark and the session
configuration the query was started with (including its shuffle partition count, which a
restarted query keeps). Besides reading, a checkpoint superseded by a rollback is moved
aside, and what a stop left of writing micro-batch 0's offsets is deleted. On a classic
session, files are reached through Hadoop's FileSystem, so every checkpoint location Spark
supports works; under Spark Connect, where the client has no JVM, through pyarrow's file
systems (local paths and object stores).
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.fs as pafs

from pyspark_abs.errors import ConfigError, PipelineMismatchError
from pyspark_abs.logs import logger

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logger(__name__)

SUPERSEDED = "superseded-by-epoch-"
"""How a checkpoint superseded by a restore epoch is renamed: ``<location>-<this><epoch>``."""

_UNFINISHED_WRITE = re.compile(
    r"\.\.?\d+\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.tmp(\.crc)?"
)
"""Spark writes a log file ``<batch>`` as ``.<batch>.<uuid>.tmp`` and renames it when done; a
local or checksummed file system adds ``.<name>.crc`` beside it."""


def unfinished_writes(names: list[str]) -> list[str]:
    """The names among ``names`` that are temporary files of a log write never finished."""
    return [name for name in names if _UNFINISHED_WRITE.fullmatch(name)]


@dataclass(frozen=True)
class BatchOffsets:
    """What Spark recorded for one micro-batch before running it.

    Attributes:
        batch_id: The micro-batch id.
        source_offsets: The end offset of each source, as Spark wrote them (JSON lines).
        watermark_ms: The batch's event-time watermark.
        timestamp_ms: The batch's processing time.
        shuffle_partitions: The query's shuffle partition count.
    """

    batch_id: int
    source_offsets: str
    watermark_ms: int
    timestamp_ms: int
    shuffle_partitions: int


class CheckpointFiles(Protocol):
    """The file operations the reader needs, by path."""

    def read(self, path: str) -> str | None:
        """The file's text, or None if it does not exist."""

    def list(self, path: str) -> list[str]:
        """Names in the directory, empty if it does not exist."""

    def exists(self, path: str) -> bool:
        """Whether the path exists."""

    def rename(self, source: str, target: str) -> bool:
        """Rename a directory; False if the file system refused."""

    def delete(self, path: str) -> None:
        """Delete a file; nothing if it does not exist."""


class CheckpointReader:
    """Reads a streaming query's checkpoint directory."""

    def __init__(self, location: str, files: CheckpointFiles) -> None:
        self.location = location.rstrip("/")
        self._files = files

    @classmethod
    def for_session(cls, spark: SparkSession, location: str) -> CheckpointReader:
        """A reader through the session's Hadoop FileSystem, or pyarrow's under Spark Connect."""
        jvm = getattr(spark, "_jvm", None)
        if jvm is None:
            return cls(location, ArrowFiles())
        return cls(location, HadoopFiles(jvm, spark._jsc.hadoopConfiguration()))

    def query_id(self) -> str | None:
        """The id Spark stored for the query, or None for a fresh checkpoint."""
        text = self._files.read(f"{self.location}/metadata")
        if text is None:
            return None
        query_id: str = json.loads(text)["id"]
        return query_id

    def committed_batches(self) -> list[int]:
        """Micro-batch ids Spark has marked as committed."""
        return sorted(int(n) for n in self._files.list(f"{self.location}/commits") if n.isdigit())

    def planned_batches(self) -> list[int]:
        """Micro-batch ids Spark has recorded offsets for (planned, maybe not committed)."""
        return sorted(int(n) for n in self._files.list(f"{self.location}/offsets") if n.isdigit())

    def clear_unfinished_first_batch(self) -> list[str]:
        """Delete what a stop left of writing micro-batch 0's offsets; return what went.

        A query stopped while Spark wrote its first offsets file leaves that file's temporary
        copy, and Spark 4.1 and later refuse to run micro-batch 0 beside it
        (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``). Once Spark has planned a micro-batch,
        nothing is deleted: Spark itself ignores such files then. Call it with the snapshot
        root's lease held, so that no run writes the checkpoint meanwhile.
        """
        if self.planned_batches():
            return []
        gone = []
        for folder in ("offsets", "commits"):
            for name in unfinished_writes(self._files.list(f"{self.location}/{folder}")):
                self._files.delete(f"{self.location}/{folder}/{name}")
                gone.append(f"{folder}/{name}")
        if gone:
            log.warning(
                "deleted %s from checkpoint %s: a stop interrupted Spark while it wrote "
                "micro-batch 0's offsets, and Spark refuses to start beside them",
                ", ".join(gone),
                self.location,
            )
        return gone

    def offsets(self, batch_id: int) -> BatchOffsets:
        """The offsets Spark recorded for ``batch_id``.

        Raises:
            PipelineMismatchError: Spark has not recorded offsets for that batch.
        """
        text = self._files.read(f"{self.location}/offsets/{batch_id}")
        if text is None:
            raise PipelineMismatchError(
                f"checkpoint {self.location} has no offsets for micro-batch {batch_id}"
            )
        lines = text.splitlines()
        meta: dict[str, Any] = json.loads(lines[1])
        conf = meta.get("conf", {})
        return BatchOffsets(
            batch_id=batch_id,
            source_offsets="\n".join(lines[2:]),
            watermark_ms=int(meta.get("batchWatermarkMs", 0)),
            timestamp_ms=int(meta.get("batchTimestampMs", 0)),
            shuffle_partitions=int(conf.get("spark.sql.shuffle.partitions", 0)),
        )

    def source_log(self, index: int) -> dict[str, str]:
        """The files of source ``index``'s metadata log (Spark's file source), by name."""
        folder = f"{self.location}/sources/{index}"
        names = [n for n in self._files.list(folder) if n.removesuffix(".compact").isdigit()]
        texts = {n: self._files.read(f"{folder}/{n}") for n in names}
        return {n: t for n, t in texts.items() if t is not None}

    def find(self, query_id: str) -> CheckpointReader | None:
        """The checkpoint of query ``query_id``: this one, or one a restore moved aside."""
        parent, _, name = self.location.rpartition("/")
        aside = sorted(n for n in self._files.list(parent) if n.startswith(f"{name}-{SUPERSEDED}"))
        for candidate in [self.location, *(f"{parent}/{n}" for n in aside)]:
            reader = CheckpointReader(candidate, self._files)
            if reader.query_id() == query_id:
                return reader
        return None

    def move_aside(self, suffix: str) -> str:
        """Rename the checkpoint directory to ``<location>-<suffix>``; return the new name."""
        target = f"{self.location}-{suffix}"
        if self._files.exists(target):
            target = f"{target}-{uuid.uuid4().hex[:8]}"
        if not self._files.rename(self.location, target):
            raise PipelineMismatchError(
                f"cannot move superseded checkpoint {self.location} to {target}; move or "
                f"delete it by hand and start again"
            )
        return target


class HadoopFiles:
    """Checkpoint files through the JVM's Hadoop FileSystem (classic sessions)."""

    def __init__(self, jvm: Any, conf: Any) -> None:
        # Py4J finds ``jvm.org.apache...`` one name at a time, each miss a search of every
        # jar on the class path: the classes are looked up once, not on every file read
        self._path_class = jvm.org.apache.hadoop.fs.Path
        self._io_utils = jvm.org.apache.commons.io.IOUtils
        self._conf = conf

    def read(self, path: str) -> str | None:
        """The file's text, or None if it does not exist."""
        fs, hadoop_path = self._fs(path)
        if not fs.exists(hadoop_path):
            return None
        stream = fs.open(hadoop_path)
        try:
            text: str = self._io_utils.toString(stream, "UTF-8")
        finally:
            stream.close()
        return text

    def list(self, path: str) -> list[str]:
        """Names in the directory, empty if it does not exist."""
        fs, hadoop_path = self._fs(path)
        if not fs.exists(hadoop_path):
            return []
        return [str(status.getPath().getName()) for status in fs.listStatus(hadoop_path)]

    def exists(self, path: str) -> bool:
        """Whether the path exists."""
        fs, hadoop_path = self._fs(path)
        return bool(fs.exists(hadoop_path))

    def rename(self, source: str, target: str) -> bool:
        """Rename a directory; False if the file system refused."""
        fs, hadoop_source = self._fs(source)
        return bool(fs.rename(hadoop_source, self._path_class(target)))

    def delete(self, path: str) -> None:
        """Delete a file; nothing if it does not exist."""
        fs, hadoop_path = self._fs(path)
        fs.delete(hadoop_path, False)

    def _fs(self, path: str) -> tuple[Any, Any]:
        hadoop_path = self._path_class(path)
        try:
            return hadoop_path.getFileSystem(self._conf), hadoop_path
        except Exception as err:  # Py4J's error carries Hadoop's
            if "No FileSystem for scheme" not in str(err):
                raise
            raise _no_file_system(path) from err


def _no_file_system(path: str) -> ConfigError:
    """The error for a checkpoint on a file system that the Spark session cannot reach."""
    scheme = path.split("://", 1)[0]
    hint = {
        "s3": "add hadoop-aws and the AWS SDK to the session (--packages "
        "org.apache.hadoop:hadoop-aws:<Spark's Hadoop version>) and set "
        "spark.hadoop.fs.s3.impl=org.apache.hadoop.fs.s3a.S3AFileSystem",
        "s3a": "add hadoop-aws and the AWS SDK to the session (--packages "
        "org.apache.hadoop:hadoop-aws:<Spark's Hadoop version>)",
        "gs": "add the GCS connector for Hadoop to the session",
        "abfss": "add hadoop-azure to the session",
    }.get(scheme, f"add a Hadoop file system for {scheme}:// to the session")
    return ConfigError(
        f"Spark has no file system for {scheme}:// and so cannot keep the checkpoint at "
        f"{path}: {hint} (see docs/operations/object-stores.md), or pass checkpoint= a "
        f"path Spark can write"
    )


class ArrowFiles:
    """Checkpoint files through pyarrow's file systems (Spark Connect clients and servers)."""

    def read(self, path: str) -> str | None:
        """The file's text, or None if it does not exist."""
        fs, local = _arrow_fs(path)
        try:
            with fs.open_input_stream(local) as stream:
                return bytes(stream.read()).decode("utf-8")
        except FileNotFoundError:
            return None

    def list(self, path: str) -> list[str]:
        """Names in the directory, empty if it does not exist."""
        fs, local = _arrow_fs(path)
        selector = pafs.FileSelector(local, allow_not_found=True)
        return [info.base_name for info in fs.get_file_info(selector)]

    def exists(self, path: str) -> bool:
        """Whether the path exists."""
        fs, local = _arrow_fs(path)
        return bool(fs.get_file_info(local).type != pafs.FileType.NotFound)

    def rename(self, source: str, target: str) -> bool:
        """Rename a directory; False if the file system refused."""
        fs, local = _arrow_fs(source)
        try:
            fs.move(local, _arrow_fs(target)[1])
        except (OSError, pa.ArrowException):
            return False
        return True

    def delete(self, path: str) -> None:
        """Delete a file; nothing if it does not exist."""
        fs, local = _arrow_fs(path)
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(local)


def _arrow_fs(path: str) -> tuple[pafs.FileSystem, str]:
    try:
        return pafs.FileSystem.from_uri(path)
    except (pa.ArrowInvalid, ValueError):
        raise ConfigError(
            f"checkpoint location {path} is not a URI pyarrow can open; under Spark Connect use "
            f"a local path or an s3://, gs://, abfss:// or hdfs:// location"
        ) from None
