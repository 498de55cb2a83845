"""Reading Spark's streaming checkpoint: the query id and each micro-batch's offsets.

Spark writes ``offsets/<batch>`` before it runs a micro-batch and ``commits/<batch>`` after
the sink returns. The offsets file holds the source offsets, the watermark and the session
configuration the query was started with (including its shuffle partition count, which a
restarted query keeps). Files are read through Hadoop's FileSystem, so every checkpoint
location Spark supports works.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark_abs.errors import ConfigError, PipelineMismatchError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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


class CheckpointReader:
    """Reads a streaming query's checkpoint directory."""

    def __init__(self, spark: SparkSession, location: str) -> None:
        self.location = location.rstrip("/")
        jvm = getattr(spark, "_jvm", None)
        if jvm is None:
            raise ConfigError(
                "pyspark-abs reads the streaming checkpoint through the JVM and needs a classic "
                "SparkSession; this one (Spark Connect?) has no JVM gateway. Run the pipeline "
                "on a classic session"
            )
        self._jvm = jvm
        self._conf = spark._jsc.hadoopConfiguration()

    def query_id(self) -> str | None:
        """The id Spark stored for the query, or None for a fresh checkpoint."""
        text = self._read("metadata")
        if text is None:
            return None
        query_id: str = json.loads(text)["id"]
        return query_id

    def committed_batches(self) -> list[int]:
        """Micro-batch ids Spark has marked as committed."""
        return sorted(int(n) for n in self._list("commits") if n.isdigit())

    def offsets(self, batch_id: int) -> BatchOffsets:
        """The offsets Spark recorded for ``batch_id``.

        Raises:
            PipelineMismatchError: Spark has not recorded offsets for that batch.
        """
        text = self._read(f"offsets/{batch_id}")
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

    def move_aside(self, suffix: str) -> str:
        """Rename the checkpoint directory to ``<location>-<suffix>``; return the new name."""
        source = self._jvm.org.apache.hadoop.fs.Path(self.location)
        fs = source.getFileSystem(self._conf)
        target_name = f"{self.location}-{suffix}"
        if fs.exists(self._jvm.org.apache.hadoop.fs.Path(target_name)):
            target_name = f"{target_name}-{uuid.uuid4().hex[:8]}"
        target = self._jvm.org.apache.hadoop.fs.Path(target_name)
        if not fs.rename(source, target):
            raise PipelineMismatchError(
                f"cannot move superseded checkpoint {self.location} to {target_name}; move or "
                f"delete it by hand and start again"
            )
        return target_name

    def _path(self, name: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(f"{self.location}/{name}")

    def _read(self, name: str) -> str | None:
        path = self._path(name)
        fs = path.getFileSystem(self._conf)
        if not fs.exists(path):
            return None
        stream = fs.open(path)
        try:
            text: str = self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()
        return text

    def _list(self, name: str) -> list[str]:
        path = self._path(name)
        fs = path.getFileSystem(self._conf)
        if not fs.exists(path):
            return []
        return [str(status.getPath().getName()) for status in fs.listStatus(path)]
