"""A single-node Kafka broker (KRaft) on 127.0.0.1, from the jars scripts/_jars.sh fetches,
started and stopped within bounded times; and records written to it through Spark."""

from __future__ import annotations

import base64
import gc
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import SparkSession

from tests.support.servers import free_port, serving

KAFKA_JARS = "ABS_KAFKA_JARS"
"""Comma-separated jars of Spark's Kafka connector for the session (set by scripts/test)."""
BROKER = "ABS_KAFKA_BROKER"
"""The folder of the broker's jars (set by scripts/test)."""
START_SECONDS = 90


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    found = f"{home}/bin/java" if home else shutil.which("java")
    if not found:
        raise RuntimeError("a Kafka broker needs Java (java on PATH or JAVA_HOME)")
    return found


@contextmanager
def kafka_broker(jars: Path, workdir: Path) -> Iterator[str]:
    """Run a broker with its controller in one process; yield its bootstrap servers.

    Topics are created on first use with two partitions.
    """
    port, controller = free_port(), free_port()
    config = workdir / "server.properties"
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(workdir / "logs"),
        "num.partitions": "2",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
    }
    config.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    classpath = ["-cp", f"{jars}/*"]
    cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    cluster = f"A{cluster[1:]}"  # a leading '-' would read as an option of the storage tool
    subprocess.run(
        [
            _java(),
            *classpath,
            "kafka.tools.StorageTool",
            "format",
            "-t",
            cluster,
            "-c",
            str(config),
        ],
        check=True,
        capture_output=True,
        timeout=START_SECONDS,
    )
    broker = [_java(), "-Xmx512m", *classpath, "kafka.Kafka", str(config)]
    with serving(broker, port, workdir / "broker.log", START_SECONDS):
        yield f"127.0.0.1:{port}"


def produce(spark: SparkSession, servers: str, topic: str, texts: Sequence[str]) -> None:
    """Write each text as one record, keyed by its position (spread over the partitions)."""
    rows = [(str(i), text) for i, text in enumerate(texts)]
    frame = spark.createDataFrame(rows, "key string, value string")
    frame.write.format("kafka").option("kafka.bootstrap.servers", servers).option(
        "topic", topic
    ).save()


def grow_topic(spark: SparkSession, servers: str, topic: str, partitions: int) -> None:
    """Give ``topic`` ``partitions`` partitions, with Kafka's admin client on the driver."""
    jvm = spark._jvm
    assert jvm is not None
    props = jvm.java.util.Properties()
    props.put("bootstrap.servers", servers)
    admin = jvm.org.apache.kafka.clients.admin.Admin.create(props)
    try:
        growth = jvm.org.apache.kafka.clients.admin.NewPartitions.increaseTo(partitions)
        admin.createPartitions(jvm.java.util.Map.of(topic, growth)).all().get()
    finally:
        admin.close()


def produce_to(
    spark: SparkSession, servers: str, topic: str, partition: int, texts: Sequence[str]
) -> None:
    """Write each text as one record to one partition."""
    frame = spark.createDataFrame([(partition, t) for t in texts], "partition int, value string")
    frame.write.format("kafka").option("kafka.bootstrap.servers", servers).option(
        "topic", topic
    ).save()


def committed_records(servers: str, topic: str) -> list[tuple[str | None, str, int]]:
    """Every record of ``topic`` a ``read_committed`` consumer sees: key, value and the
    ``pyspark-abs-epoch`` header, read with confluent-kafka up to the end of each partition."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        found, open_partitions = [], set(partitions)
        while open_partitions:
            message = consumer.poll(30)
            assert message is not None, f"reading topic {topic!r} timed out"
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                open_partitions.discard(message.partition())
                continue
            headers = dict(message.headers() or [])
            key, value, epoch = message.key(), message.value(), headers["pyspark-abs-epoch"]
            assert value is not None
            assert isinstance(epoch, bytes)
            found.append((None if key is None else key.decode(), value.decode(), int(epoch)))
        return found
    finally:
        consumer.close()


def live_kafka_clients() -> list[str]:
    """The confluent-kafka producers, consumers and admin clients this process still holds
    after a garbage collection. Each keeps threads that reconnect to its brokers until it is
    freed, so a client a failed run left behind retries a stopped broker forever."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    gc.collect()
    return [repr(o) for o in gc.get_objects() if isinstance(o, (Producer, Consumer, AdminClient))]
