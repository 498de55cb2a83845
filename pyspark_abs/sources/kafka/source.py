"""Kafka topics read with Spark's Kafka connector, rewindable to a snapshot's offsets.

Spark records a Kafka source's offset in the checkpoint as JSON of the next offset to read
per topic and partition, ``{"clicks": {"0": 1200, "1": 1187}}``: the same form as the
connector's ``startingOffsets`` option. A pipeline that starts from a restore epoch (after
``rollback``, ``restore`` or ``write_state``) on a fresh checkpoint passes the epoch's
recorded offsets as ``startingOffsets``, so it reads exactly the records after the snapshot.
Spark refuses specific starting offsets that leave out a partition it is assigned, so
partitions (and, for a pattern, topics) created since the snapshot are found with Kafka's
admin client and start at their earliest offset: every record in them came after it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark_abs.errors import ConfigError, SourceError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_SUBSCRIPTIONS = ("subscribe", "subscribePattern", "assign")
_EARLIEST = -2
_ADMIN_SECONDS = 60


@dataclass(frozen=True)
class KafkaSource:
    """A Kafka source for :class:`~pyspark_abs.Pipeline` that a restore can rewind.

    Attributes:
        options: The connector's options, as for ``spark.readStream.format("kafka")``:
            ``kafka.bootstrap.servers`` and one of ``subscribe``, ``subscribePattern`` or
            ``assign``, and any other. ``startingOffsets`` applies to a new pipeline only; a
            start from a restore epoch replaces it with the epoch's offsets.
    """

    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.options, Mapping) or not self.options.get("kafka.bootstrap.servers"):
            raise ConfigError(
                f"KafkaSource needs its options as a dict with 'kafka.bootstrap.servers', got "
                f"{self.options!r}"
            )
        given = [name for name in _SUBSCRIPTIONS if name in self.options]
        if len(given) != 1:
            raise ConfigError(
                f"KafkaSource needs exactly one of {list(_SUBSCRIPTIONS)} in its options, got "
                f"{given or 'none'}"
            )

    def load(self, spark: SparkSession, starting_offsets: str | None = None) -> DataFrame:
        """A streaming DataFrame of the topics, from ``starting_offsets`` if given.

        Raises:
            SourceError: Spark's Kafka connector is not on the classpath.
        """
        reader = spark.readStream.format("kafka").options(**self.options)
        if starting_offsets is not None:
            reader = reader.option("startingOffsets", starting_offsets)
        try:
            return reader.load()
        except Exception as err:
            if "kafka" not in str(err).lower() or "data source" not in str(err).lower():
                raise
            raise SourceError(
                f"Spark's Kafka connector is not on the classpath ({str(err).splitlines()[0]}); "
                f"add it, e.g. spark-submit --packages "
                f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark.version} (Databricks "
                f"runtimes include it)"
            ) from None

    def rewound(self, spark: SparkSession, offset_json: str) -> DataFrame:
        """The stream right after a recorded offset, and from the start of newer partitions.

        See :meth:`starting_offsets`; partitions created since the offset start at their
        earliest record.

        Raises:
            SourceError: The offset is not this source's, or the brokers cannot be asked
                which partitions the topics have now.
        """
        offsets: dict[str, dict[str, int]] = json.loads(self.starting_offsets(offset_json))
        current = self._partitions(spark)
        if current is not None:
            offsets = with_new_partitions(offsets, current)
        return self.load(spark, json.dumps(offsets, separators=(",", ":")))

    def _partitions(self, spark: SparkSession) -> dict[str, list[int]] | None:
        """The subscribed topics' partitions now, from Kafka's admin client on the driver.

        None for ``assign`` (its partitions are fixed) or without a JVM (Spark Connect).
        """
        jvm = getattr(spark, "_jvm", None)
        if jvm is None or "assign" in self.options:
            return None
        props = jvm.java.util.Properties()
        for name, value in self.options.items():
            if name.startswith("kafka."):
                props.put(name.removeprefix("kafka."), value)
        seconds = jvm.java.util.concurrent.TimeUnit.SECONDS
        try:
            admin = jvm.org.apache.kafka.clients.admin.Admin.create(props)
            try:
                names = [str(n) for n in admin.listTopics().names().get(_ADMIN_SECONDS, seconds)]
                topics = subscribed(self.options, names)
                found = admin.describeTopics(jvm.java.util.ArrayList(topics)).allTopicNames()
                described = found.get(_ADMIN_SECONDS, seconds)
                return {
                    t: [int(p.partition()) for p in described.get(t).partitions()] for t in topics
                }
            finally:
                admin.close()
        except Exception as err:
            raise SourceError(
                f"cannot ask Kafka at {self.options['kafka.bootstrap.servers']} which "
                f"partitions the topics have now ({str(err).splitlines()[0]}), which a start "
                f"right after a snapshot needs; check that the brokers are reachable and the "
                f"options' kafka.* security settings"
            ) from None

    @staticmethod
    def starting_offsets(offset_json: str) -> str:
        """The ``startingOffsets`` option that resumes right after a recorded offset.

        Args:
            offset_json: This source's line of an epoch's source offsets, as Spark wrote it
                to the checkpoint's offset log.

        Raises:
            SourceError: The line is not a Kafka offset (a topic to partition to offset map).
        """
        try:
            value = json.loads(offset_json)
        except (json.JSONDecodeError, TypeError):
            value = None
        if not isinstance(value, dict) or not value:
            raise SourceError(_not_kafka(offset_json, "it is not a JSON object of topics"))
        offsets: dict[str, dict[str, int]] = {}
        for topic, partitions in sorted(value.items()):
            if not isinstance(partitions, dict) or not partitions:
                raise SourceError(_not_kafka(offset_json, f"topic {topic!r} has no partitions"))
            offsets[topic] = {}
            for partition, offset in sorted(partitions.items(), key=lambda p: _number(p[0])):
                if (
                    _number(partition) < 0
                    or isinstance(offset, bool)
                    or not isinstance(offset, int)
                ):
                    raise SourceError(
                        _not_kafka(offset_json, f"{topic!r} partition {partition!r}: {offset!r}")
                    )
                offsets[topic][partition] = offset
        return json.dumps(offsets, separators=(",", ":"))


def subscribed(options: Mapping[str, str], topics: Sequence[str]) -> list[str]:
    """The topics a ``subscribe`` or ``subscribePattern`` source reads, of those that exist."""
    if "subscribePattern" in options:
        pattern = re.compile(options["subscribePattern"])
        return sorted(t for t in topics if pattern.fullmatch(t))
    wanted = {t.strip() for t in options.get("subscribe", "").split(",") if t.strip()}
    return sorted(wanted & set(topics))


def with_new_partitions(
    offsets: Mapping[str, Mapping[str, int]], current: Mapping[str, Sequence[int]]
) -> dict[str, dict[str, int]]:
    """``offsets`` with every partition of ``current`` it lacks, at the earliest offset (-2)."""
    merged = {topic: dict(parts) for topic, parts in offsets.items()}
    for topic, partitions in current.items():
        known = merged.setdefault(topic, {})
        for partition in partitions:
            known.setdefault(str(partition), _EARLIEST)
    return merged


def _number(text: str) -> int:
    return int(text) if isinstance(text, str) and text.isdigit() else -1


def _not_kafka(line: str, why: str) -> str:
    return (
        f"the recorded source offset {line!r} is not a Kafka offset ({why}); the pipeline's "
        f"source at that epoch was not this KafkaSource"
    )
