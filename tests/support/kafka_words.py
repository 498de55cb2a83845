"""The word count over a Kafka topic, as the broker tests and their child programs run it.

``python -m tests.support.kafka_words SERVERS TOPIC ROOT STEP:EPOCH[:ACTION] [OUT]`` runs it
in a program of its own that exits at once (skipping all cleanup, as a ``kill -9`` would), or
does ACTION (``pause``), at that protocol step of that epoch; with OUT its sink also
publishes to that topic.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pyspark_abs import AbsConfig, KafkaSink, KafkaSource, Pipeline
from pyspark_abs.examples import wordcount
from pyspark_abs.faults import Fault, FaultAction, FaultStep
from pyspark_abs.session import local_session
from tests.support.versions import sink_of


def words_of_records(records: DataFrame) -> DataFrame:
    """The words of the records' values."""
    return wordcount.words_of(records.select(F.col("value").cast("string").alias("value")))


def from_kafka(
    root: Path,
    servers: str,
    topic: str,
    *,
    key_groups: int = 8,
    faults: tuple[Fault, ...] = (),
    publish_to: str | None = None,
    snapshot_interval: int = 1,
    publish_servers: str | None = None,
    publish_timeout_s: float = 60.0,
) -> Pipeline:
    """The word count over a topic, at most two records per micro-batch; with ``publish_to``,
    its sink publishes to that topic as well (on ``publish_servers``, or on ``servers``,
    waiting up to ``publish_timeout_s`` for each Kafka call), keyed by word."""
    options = {
        "kafka.bootstrap.servers": servers,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "2",
    }
    return Pipeline(
        "wordcount",
        KafkaSource(options),
        wordcount.word_count,
        root=str(root),
        sinks={
            "output": sink_of(root)
            if publish_to is None
            else published(root, publish_servers or servers, publish_to, publish_timeout_s)
        },
        config=AbsConfig(
            key_groups=key_groups,
            commit_mode="sync",
            faults=faults,
            snapshot_interval=snapshot_interval,
        ),
        transform=words_of_records,
    )


def published(root: Path, servers: str, topic: str, timeout_s: float = 60.0) -> KafkaSink:
    """The word count's sink at ``root``, published to ``topic`` keyed by word."""
    return KafkaSink(
        sink_of(root), topic=topic, bootstrap_servers=servers, key="word", timeout_s=timeout_s
    )


def main(servers: str, topic: str, root: str, crash: str, publish_to: str | None = None) -> None:
    step, epoch, *action = crash.split(":")
    local_session("kafka-words", shuffle_partitions=2)
    fault = Fault(FaultStep(step), int(epoch), FaultAction(action[0] if action else "exit"))
    from_kafka(Path(root), servers, topic, faults=(fault,), publish_to=publish_to).run()


if __name__ == "__main__":
    main(*sys.argv[1:])
