"""KafkaSource against a real broker (KRaft, on 127.0.0.1): a crash, a kill mid-epoch, a
rollback and a restore at another scale equal an uninterrupted run, with
``maxOffsetsPerTrigger`` limits; a topic that gained partitions since the snapshot is rewound
with them; a job whose head stage reads a topic rolls back as the uninterrupted job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pyspark_abs import (
    AbsConfig,
    Job,
    KafkaSink,
    KafkaSource,
    Pipeline,
    Snapshots,
    restore,
    rollback,
    vacuum,
)
from pyspark_abs.errors import (
    ExternalChangeError,
    InjectedFault,
    OperatorDefinitionError,
    PublishError,
)
from pyspark_abs.examples import wordcount
from pyspark_abs.faults import EXIT_CODE, Fault, FaultStep
from pyspark_abs.protocol.lease import break_lease
from pyspark_abs.storage.root import SnapshotRoot
from tests.support.children import paused_child
from tests.support.docs import run_block
from tests.support.inputs import EPOCHS
from tests.support.jobs import assert_same_words_and_updates, words_and_updates
from tests.support.kafka import (
    BROKER,
    KAFKA_JARS,
    committed_records,
    grow_topic,
    kafka_broker,
    live_kafka_clients,
    produce,
    produce_to,
)
from tests.support.kafka_words import from_kafka, words_of_records
from tests.support.pipelines import OP, assert_same, counts_df, user_count
from tests.support.servers import free_port
from tests.support.versions import shuffle_partitions, sink_of

REPO = Path(__file__).parents[2]
LINES = [*EPOCHS, *(" ".join(f"{w}2" for w in text.split()) for text in EPOCHS)]


def kafka_child_env() -> dict[str, str]:
    """The environment of a child program that runs a pipeline over the broker."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env["PYSPARK_SUBMIT_ARGS"] = f"--jars {os.environ[KAFKA_JARS]} pyspark-shell"
    return env


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A broker for this module's tests (the session has Spark's Kafka connector)."""
    if not os.environ.get(BROKER) or not os.environ.get(KAFKA_JARS):
        pytest.skip("no Kafka broker jars or connector (scripts/test fetches them)")
    with kafka_broker(Path(os.environ[BROKER]), tmp_path_factory.mktemp("kafka")) as found:
        yield found


def test_kafka_source_survives_a_crash_a_rollback_and_a_restore_as_an_uninterrupted_run(
    spark: SparkSession, servers: str, tmp_path: Path
) -> None:
    root, clean, copy = tmp_path / "root", tmp_path / "clean", tmp_path / "copy"
    produce(spark, servers, "lines", LINES)
    with pytest.raises(InjectedFault):
        from_kafka(root, servers, "lines", faults=(Fault(FaultStep.AFTER_PREPARED, 1),)).run()
    from_kafka(root, servers, "lines").run()
    from_kafka(clean, servers, "lines").run()
    snapshots, uninterrupted = Snapshots(str(root), spark), Snapshots(str(clean), spark)
    assert_same(uninterrupted.state(OP), counts_df(spark, LINES))
    assert len(uninterrupted.list()) >= len(LINES) // 2
    assert_same(snapshots.state(OP), uninterrupted.state(OP))
    assert_same(snapshots.sink("output"), uninterrupted.sink("output"))

    rollback(str(root), 1)
    from_kafka(root, servers, "lines").run()
    assert_same(snapshots.state(OP), uninterrupted.state(OP))
    assert_same(snapshots.sink("output"), uninterrupted.sink("output"))

    restore(str(clean), 1, str(copy))
    with shuffle_partitions(spark, 3):
        from_kafka(copy, servers, "lines", key_groups=5).run()
    after = uninterrupted.sink("output").subtract(uninterrupted.sink("output", 1))
    assert_same(Snapshots(str(copy), spark).state(OP), uninterrupted.state(OP))
    assert_same(Snapshots(str(copy), spark).sink("output"), after)


@pytest.mark.parametrize("crash", ["after_align:1", "between_table_commits:1", "during_publish:1"])
def test_a_kill_mid_epoch_then_a_restart_is_exactly_once(
    spark: SparkSession, servers: str, tmp_path: Path, crash: str
) -> None:
    """The application leaves at once (no cleanup, as ``kill -9``) before epoch 1 is PREPARED,
    or with one of its tables committed and the other not."""
    root, clean, topic = tmp_path / "root", tmp_path / "clean", f"killed-{crash[:5]}"
    out = f"{topic}-out"
    produce(spark, servers, topic, LINES)
    child = [servers, topic, str(root), crash, out]
    command = [sys.executable, "-m", "tests.support.kafka_words", *child]
    killed = subprocess.run(
        command, env=kafka_child_env(), capture_output=True, text=True, timeout=600
    )
    assert killed.returncode == EXIT_CODE, killed.stderr[-4000:]
    from_kafka(root, servers, topic, publish_to=out).run()
    from_kafka(clean, servers, topic).run()
    restarted, uninterrupted = Snapshots(str(root), spark), Snapshots(str(clean), spark)
    assert_same(uninterrupted.state(OP), counts_df(spark, LINES))
    assert_same(restarted.state(OP), uninterrupted.state(OP))
    assert_same(restarted.sink("output"), uninterrupted.sink("output"))
    assert_same(published(spark, servers, out), uninterrupted.sink("output"))


def published(
    spark: SparkSession, servers: str, topic: str, epochs: range | None = None
) -> DataFrame:
    """The word counts a ``read_committed`` consumer of ``topic`` sees (of ``epochs``)."""
    rows = []
    for key, value, epoch in committed_records(servers, topic):
        record = json.loads(value)
        assert key == record["word"]
        if epochs is None or epoch in epochs:
            rows.append((record["word"], record["count"]))
    return spark.createDataFrame(rows, "word string, count long")


@pytest.mark.parametrize(
    ("step", "interval"),
    [
        ("after_align", 1),
        ("after_prepared", 1),
        ("between_table_commits", 1),
        ("after_committed", 1),
        ("during_publish", 1),
        ("during_publish", 2),
    ],
)
def test_a_kafka_sink_publishes_each_committed_row_once_whatever_step_fails(
    spark: SparkSession, servers: str, tmp_path: Path, step: str, interval: int
) -> None:
    """A failed run leaves its Kafka transaction open at ``during_publish``: the next run
    aborts it, fencing the failed run's producer, and publishes the snapshot once. With a
    snapshot interval, a snapshot publishes the rows of every epoch of its group."""
    root, source, out = tmp_path / "root", f"sunk-{step}-{interval}", f"sunk-{step}-{interval}-out"
    produce(spark, servers, source, LINES[:6])
    failing = (Fault(FaultStep(step), 2),)

    def run(faults: tuple[Fault, ...] = ()) -> None:
        from_kafka(
            root, servers, source, faults=faults, publish_to=out, snapshot_interval=interval
        ).run()

    with pytest.raises(InjectedFault) as failed:
        run(failing)
    assert failed.value.__traceback__ is not None  # held, as PySpark holds a batch's error
    assert live_kafka_clients() == []
    run()
    sink = Snapshots(str(root), spark).sink("output")
    final = sink.groupBy("word").agg(F.max("count").alias("count"))
    assert_same(final, counts_df(spark, LINES[:6]))
    assert_same(published(spark, servers, out), sink)
    snapshots = [s.epoch for s in Snapshots(str(root), spark).list()]
    assert {epoch for _, _, epoch in committed_records(servers, out)} <= set(snapshots)


def test_a_kafka_sink_whose_broker_is_unreachable_fails_clearly_and_publishes_later(
    spark: SparkSession, servers: str, tmp_path: Path
) -> None:
    """A run whose sink cannot reach its brokers stops after the sink's timeout with an error
    that names the sink, the address and the timeout, keeps no Kafka client that would retry
    them, and leaves the root so that the next run publishes every snapshot once."""
    root, out = tmp_path / "root", "unreachable-out"
    produce(spark, servers, "unreachable", LINES[:4])
    nobody = f"127.0.0.1:{free_port()}"
    unreachable = from_kafka(
        root, servers, "unreachable", publish_to=out, publish_servers=nobody, publish_timeout_s=2
    )
    expected = f"sink 'output'.*{nobody}, each call waiting up to 2 s.*once Kafka is reachable"
    with pytest.raises(PublishError, match=expected):
        unreachable.run()
    assert live_kafka_clients() == []
    from_kafka(root, servers, "unreachable", publish_to=out).run()
    sink = Snapshots(str(root), spark).sink("output")
    assert_same(published(spark, servers, out), sink)
    assert_same(*last_counts(sink, counts_df(spark, LINES[:4])))


def test_a_kafka_sink_fences_a_paused_run_that_held_its_transaction_open(
    spark: SparkSession, servers: str, tmp_path: Path
) -> None:
    """A run stops itself with epoch 1's Kafka transaction open; a second run takes the root
    over and publishes; the first, resumed, is fenced by Kafka and publishes nothing."""
    root, out = tmp_path / "root", "zombie-out"
    produce(spark, servers, "zombie", LINES[:6])
    command = [sys.executable, "-m", "tests.support.kafka_words", servers, "zombie", str(root)]
    log = tmp_path / "zombie.log"
    zombie = paused_child([*command, "during_publish:1:pause", out], kafka_child_env(), log)
    try:
        break_lease(SnapshotRoot(root))
        from_kafka(root, servers, "zombie", publish_to=out).run()
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
        zombie.wait(timeout=300)
    assert zombie.returncode != 0
    assert "Kafka fenced the publisher of snapshot 1" in log.read_text()
    sink = Snapshots(str(root), spark).sink("output")
    assert_same(published(spark, servers, out), sink)
    assert_same(*last_counts(sink, counts_df(spark, LINES[:6])))


def test_a_kafka_sink_rolled_back_or_restored_publishes_the_new_epochs_and_keeps_the_old(
    spark: SparkSession, servers: str, tmp_path: Path
) -> None:
    """Kafka cannot take records back: after a rollback the topic holds the rolled-back
    epochs' records once, then the re-run epochs', each tagged with its epoch. A restored
    copy publishes its own epochs, under its own root's id."""
    root, clean, out = tmp_path / "root", tmp_path / "clean", "rolled-out"
    produce(spark, servers, "rolled", LINES[:6])
    from_kafka(root, servers, "rolled", publish_to=out).run()
    from_kafka(clean, servers, "rolled").run()
    before = published(spark, servers, out)
    last = max(epoch for _, _, epoch in committed_records(servers, out))
    assert_same(before, Snapshots(str(root), spark).sink("output"))
    rollback(str(root), 1)
    from_kafka(root, servers, "rolled", publish_to=out).run()
    sink = Snapshots(str(root), spark).sink("output")
    assert_same(sink, Snapshots(str(clean), spark).sink("output"))
    kept = published(spark, servers, out, range(2)).union(
        published(spark, servers, out, range(last + 1, 10**6))
    )
    assert_same(kept, sink)
    assert_same(published(spark, servers, out, range(last + 1)), before)

    copy = tmp_path / "copy"
    restore(str(clean), 1, str(copy))
    from_kafka(copy, servers, "rolled", publish_to="restored-out").run()
    copied = Snapshots(str(copy), spark).sink("output")
    assert_same(published(spark, servers, "restored-out"), copied)
    uninterrupted = Snapshots(str(clean), spark)
    assert_same(copied, uninterrupted.sink("output").subtract(uninterrupted.sink("output", 1)))


def test_a_kafka_sink_added_after_retention_expired_snapshots_publishes_the_whole_table(
    spark: SparkSession, servers: str, tmp_path: Path
) -> None:
    """A root ran with a plain Delta sink (say while Kafka was down), retention expired all
    but its newest snapshot, then the sink became a KafkaSink: the topic gets every row of
    the table once, the expired snapshots' too, each under the epoch that committed it."""
    root, out = tmp_path / "root", "expired-out"
    produce(spark, servers, "expired", LINES[:6])
    from_kafka(root, servers, "expired").run()
    before = [s.epoch for s in Snapshots(str(root), spark).list()]
    assert len(before) >= 2
    assert vacuum(str(root), keep_last=1).expired == before[:-1]
    produce(spark, servers, "expired", LINES[6:8])
    from_kafka(root, servers, "expired", publish_to=out).run()
    sink = Snapshots(str(root), spark).sink("output")
    assert_same(published(spark, servers, out), sink)
    assert_same(*last_counts(sink, counts_df(spark, LINES[:8])))
    headers = {epoch for _, _, epoch in committed_records(servers, out)}
    after = [s.epoch for s in Snapshots(str(root), spark).list()]
    assert headers == {*before, *after}


def test_a_kafka_sink_owed_snapshots_whose_files_were_vacuumed_says_so_and_sends_nothing(
    spark: SparkSession, servers: str, tmp_path: Path
) -> None:
    """The table was compacted and vacuumed before its snapshots reached the topic: the
    start names the snapshot, the file and what to do, and the topic gets none of them."""
    root, out = tmp_path / "root", "vacuumed-out"
    produce(spark, servers, "vacuumed", LINES[:6])
    from_kafka(root, servers, "vacuumed").run()
    table = DeltaTable(sink_of(root))
    table.optimize.compact()
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    gone = r"snapshot 0 is owed to topic 'vacuumed-out', but a file its commit .* is gone"
    with pytest.raises(ExternalChangeError, match=rf"{gone}.*Restore the file from a backup"):
        from_kafka(root, servers, "vacuumed", publish_to=out).run()
    assert committed_records(servers, out) == []
    assert live_kafka_clients() == []


def test_a_kafka_sink_refuses_what_it_cannot_publish(
    spark: SparkSession, servers: str, tmp_path: Path
) -> None:
    def sink(**fields: Any) -> KafkaSink:
        return KafkaSink(
            str(tmp_path / "sink"), **{"topic": "t", "bootstrap_servers": servers, **fields}
        )

    def pipeline(kafka: KafkaSink, config: AbsConfig | None = None) -> Pipeline:
        return Pipeline(
            "wordcount",
            KafkaSource({"kafka.bootstrap.servers": servers, "subscribe": "t"}),
            wordcount.word_count,
            root=str(tmp_path / "root"),
            sinks=kafka,
            config=config,
            transform=words_of_records,
        )

    with pytest.raises(OperatorDefinitionError, match="topic 'no/such'"):
        pipeline(sink(topic="no/such"))
    with pytest.raises(OperatorDefinitionError, match="column 'user'"):
        pipeline(sink(key="user"))
    with pytest.raises(OperatorDefinitionError, match="of type int64 as record values"):
        pipeline(sink(value="count"))
    for timeout in (0, -1.0, float("nan"), float("inf"), "60", True):
        with pytest.raises(OperatorDefinitionError, match=f"timeout_s={timeout!r}; give the"):
            pipeline(sink(timeout_s=timeout))
    with pytest.raises(OperatorDefinitionError, match="with snapshots off"):
        pipeline(sink(), AbsConfig(snapshots=False)).run()


def test_a_job_whose_head_reads_a_topic_rolls_back_as_the_uninterrupted_job(
    spark: SparkSession, servers: str, tmp_path: Path
) -> None:
    """The rolled-back job's head stage publishes to a topic with a KafkaSink as well."""

    def job_at(base: Path, publish_to: str | None = None) -> Job:
        head = from_kafka(base / "words", servers, "jobbed", publish_to=publish_to)
        return words_and_updates(base, head)

    rolled, clean, out = tmp_path / "rolled", tmp_path / "clean", "jobbed-out"
    for line in LINES[:5]:
        produce(spark, servers, "jobbed", [line])
        job_at(rolled, out).run()
        job_at(clean).run()
    last = max(epoch for _, _, epoch in committed_records(servers, out))
    job_at(rolled, out).rollback(1)
    job_at(rolled, out).run()
    assert_same_words_and_updates(spark, rolled, clean)
    words = Snapshots(str(clean / "words"), spark).state(OP)
    assert_same(words, counts_df(spark, LINES[:5]))
    kept = published(spark, servers, out, range(2)).union(
        published(spark, servers, out, range(last + 1, 10**6))
    )
    assert_same(kept, Snapshots(str(rolled / "words"), spark).sink("output"))


def test_a_topic_that_gained_a_partition_since_the_snapshot_is_rewound_with_it(
    spark: SparkSession, servers: str, tmp_path: Path
) -> None:
    root, clean = tmp_path / "root", tmp_path / "clean"
    produce(spark, servers, "grows", LINES[:4])
    for base in (root, clean):
        from_kafka(base, servers, "grows").run()
    grow_topic(spark, servers, "grows", 3)
    produce_to(spark, servers, "grows", 2, LINES[4:])
    for base in (root, clean):
        from_kafka(base, servers, "grows").run()
    uninterrupted = Snapshots(str(clean), spark)
    assert_same(uninterrupted.state(OP), counts_df(spark, LINES))

    rollback(str(root), 0)
    from_kafka(root, servers, "grows").run()
    snapshots = Snapshots(str(root), spark)
    assert_same(snapshots.state(OP), uninterrupted.state(OP))
    assert_same(*last_counts(snapshots.sink("output"), uninterrupted.sink("output")))


def last_counts(*sinks: DataFrame) -> list[DataFrame]:
    """Each word's last count in each sink (the epochs' boundaries may differ)."""
    return [s.groupBy("word").agg(F.max("count").alias("count")) for s in sinks]


CLICKS = ["ann", "bob", "ann", "cy", "ann"]


def run_clicks_block(
    spark: SparkSession, servers: str, tmp_path: Path, line: str, topic: str
) -> None:
    """Write :data:`CLICKS` to ``topic``, then run the documentation block holding ``line`` on it,
    with its root and sink under ``tmp_path``."""
    frame = spark.createDataFrame([(u, "click") for u in CLICKS], "key string, value string")
    frame.write.format("kafka").option("kafka.bootstrap.servers", servers).option(
        "topic", topic
    ).save()
    places = {
        "broker:9092": servers,
        '"subscribe": "clicks"': f'"subscribe": "{topic}"',
        "/roots/clicks": str(tmp_path / "r"),
        "/sinks/clicks": str(tmp_path / "s"),
    }
    run_block(line, {"clicks_per_user": user_count}, places)


def test_the_readme_block_runs_a_pipeline_over_a_topic(
    spark: SparkSession, servers: str, tmp_path: Path
) -> None:
    run_clicks_block(spark, servers, tmp_path, '"maxOffsetsPerTrigger": "10000",', "clicks")
    expected = spark.createDataFrame([("ann", 3), ("bob", 1), ("cy", 1)], "user string, count long")
    state = Snapshots(str(tmp_path / "r"), spark).state("user_count").select("user", "count")
    assert_same(state, expected)


def test_the_readme_block_publishes_a_pipeline_to_a_topic_exactly_once(
    spark: SparkSession, servers: str, tmp_path: Path
) -> None:
    run_clicks_block(spark, servers, tmp_path, 'topic="clicks-per-user",', "sunk-clicks")
    sink = Snapshots(str(tmp_path / "r"), spark).sink("output")
    records = committed_records(servers, "clicks-per-user")
    assert all(key == json.loads(value)["user"] for key, value, _ in records)
    rows = [(json.loads(value)["user"], json.loads(value)["count"]) for _, value, _ in records]
    assert_same(
        spark.createDataFrame(rows, "user string, count long"), sink.select("user", "count")
    )
    expected = spark.createDataFrame([("ann", 3), ("bob", 1), ("cy", 1)], "user string, count long")
    final = sink.groupBy("user").agg(F.max("count").alias("count"))
    assert_same(final, expected)
