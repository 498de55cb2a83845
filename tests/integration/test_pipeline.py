"""End to end: a streaming word count snapshotted into Delta, read back as DataFrames."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pyspark_abs import AbsConfig, EpochStatus, Pipeline, Snapshots, operator, vectorized_operator
from pyspark_abs.errors import ConfigError
from pyspark_abs.examples import wordcount
from pyspark_abs.storage.spark import load_dataframe
from pyspark_abs.storage.store import DeltaStore
from tests.support.inputs import EPOCHS, write_epochs
from tests.support.pipelines import (
    assert_same,
    assert_word_counts,
    expected_history,
    expected_sink,
    expected_state,
    state_history,
    word_count_per_key,
    word_count_seeing_the_heap,
    word_pipeline,
)

pytestmark = pytest.mark.compat


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.smoke
def test_every_epoch_is_snapshotted_and_committed(
    spark: SparkSession, tmp_path: Path, mode: str
) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    query = word_pipeline(inputs, tmp_path / "root", commit_mode=mode).run()
    assert query.recovered_epochs == []
    assert query.pending_epochs == 0
    assert_word_counts(spark, tmp_path / "root", EPOCHS)

    snapshots = Snapshots(str(tmp_path / "root"), spark)
    infos = snapshots.list()
    assert all(i.status is EpochStatus.COMMITTED for i in infos)
    assert [i.table_versions["state/word_count"] for i in infos] == [1, 2, 3, 4]
    assert [i.rows["state/word_count"] for i in infos] == [3, 3, 4, 5]
    assert [i.state_keys for i in infos] == [3, 5, 8, 11]
    assert all(i.commit_ms and i.batch_ms and i.align_ms is not None for i in infos)
    assert '"logOffset":3' in (infos[-1].source_offsets or "")


def test_both_operator_forms_write_the_same_snapshot(spark: SparkSession, tmp_path: Path) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    word_pipeline(inputs, tmp_path / "vec").run()
    word_pipeline(inputs, tmp_path / "key", op=word_count_per_key).run()
    store = DeltaStore()
    tables = []
    for root in ("vec", "key"):
        uri = str(tmp_path / root / "state" / "word_count")
        tables.append(load_dataframe(spark, uri, store.open(uri).version()))
    assert_same(tables[0], tables[1])
    assert_word_counts(spark, tmp_path / "key", EPOCHS)


def test_python_workers_collect_garbage_without_walking_what_they_imported(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A reused PySpark worker runs a full garbage collection after every task; the
    operator's worker has frozen its loaded modules, so those collections skip them, and
    the driver's heap is left alone."""
    frozen_in_driver = gc.get_freeze_count()
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    word_pipeline(inputs, tmp_path / "root", op=word_count_seeing_the_heap).run()

    snapshots = Snapshots(str(tmp_path / "root"), spark)
    assert_same(state_history(snapshots), expected_history(spark, EPOCHS))
    sink = snapshots.sink("output")
    assert_same(sink.drop("frozen"), expected_sink(spark, EPOCHS))
    assert min(row.frozen for row in sink.collect()) > 10_000
    assert gc.get_freeze_count() == frozen_in_driver


def test_workers_spark_does_not_reuse_leave_their_heap_and_a_restart_with_reuse_continues(
    spark: SparkSession, tmp_path: Path
) -> None:
    """With ``spark.python.worker.reuse=false`` every task has a fresh worker that PySpark
    never collects after: nothing is frozen there. The same root restarted by a session
    that reuses its workers continues exactly once, as the uninterrupted run."""
    inputs, root = tmp_path / "in", tmp_path / "root"
    write_epochs(inputs, EPOCHS[:2])
    child = subprocess.run(
        [sys.executable, "-m", "tests.support.unreused_workers", str(inputs), str(root)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        capture_output=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr.decode()[-3000:]
    write_epochs(inputs, EPOCHS)
    word_pipeline(inputs, root, op=word_count_seeing_the_heap).run()

    snapshots = Snapshots(str(root), spark)
    assert_same(state_history(snapshots), expected_history(spark, EPOCHS))
    sink = snapshots.sink("output")
    assert_same(sink.drop("frozen"), expected_sink(spark, EPOCHS))
    unreused = snapshots.sink("output", 1)
    assert_same(unreused.drop("frozen"), expected_sink(spark, EPOCHS[:2]))
    assert {row.frozen for row in unreused.collect()} == {0}
    assert min(row.frozen for row in sink.subtract(unreused).collect()) > 10_000


@pytest.mark.smoke
def test_restart_continues_where_it_stopped(spark: SparkSession, tmp_path: Path) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS[:2])
    word_pipeline(inputs, tmp_path / "root").run()
    write_epochs(tmp_path / "in", EPOCHS)
    query = word_pipeline(inputs, tmp_path / "root").run()
    assert query.recovered_epochs == []
    assert_word_counts(spark, tmp_path / "root", EPOCHS)


def test_state_is_typed_and_queryable_with_sql(spark: SparkSession, tmp_path: Path) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    pipeline = word_pipeline(inputs, tmp_path / "root", key_groups=4)
    pipeline.run()
    state = pipeline.snapshots.state("word_count", 1, with_metadata=True)
    assert state.schema.simpleString() == (
        "struct<word:string,count:bigint,_key_group:int,_epoch:bigint,_timeout:bigint>"
    )
    state.createOrReplaceTempView("word_state")
    top = spark.sql("SELECT word, count FROM word_state WHERE count > 1 ORDER BY word")
    assert_same(top, spark.createDataFrame([("a", 2), ("b", 2)], "word string, count long"))
    rehashed = state.where(F.col("_key_group") != F.expr("pmod(hash(word), 4)"))
    assert rehashed.count() == 0
    assert [row["_epoch"] for row in state.where("word = 'a'").collect()] == [0]


def test_manifest_reads_as_a_dataframe(spark: SparkSession, tmp_path: Path) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS[:2])
    pipeline = word_pipeline(inputs, tmp_path / "root")
    pipeline.run()
    manifest = pipeline.snapshots.manifest()
    transitions = manifest.groupBy("status").count()
    assert_same(
        transitions,
        spark.createDataFrame([("PREPARED", 2), ("COMMITTED", 2)], "status string, count long"),
    )
    prepared = manifest.where("status = 'PREPARED'").select(F.explode("files").alias("f"))
    assert prepared.where("f.size_bytes <= 0").count() == 0


def test_epoch_without_words_commits_nothing_new(spark: SparkSession, tmp_path: Path) -> None:
    epochs = ["a b", "   ", "b"]
    inputs = write_epochs(tmp_path / "in", epochs)
    pipeline = word_pipeline(inputs, tmp_path / "root")
    pipeline.run()
    infos = pipeline.snapshots.list()
    assert [i.status for i in infos] == [EpochStatus.COMMITTED] * 3
    assert infos[1].rows == {}
    assert infos[1].table_versions == infos[0].table_versions
    assert_same(pipeline.snapshots.state("word_count", 1), expected_state(spark, epochs[:2]))


def test_several_outputs_commit_to_several_sinks(spark: SparkSession, tmp_path: Path) -> None:
    @vectorized_operator(
        key="word",
        state_schema="count long",
        outputs={"counts": "word string, count long", "new_words": "word string, epoch long"},
    )
    def counting(rows, state, ctx):  # type: ignore[no-untyped-def]
        from pyspark_abs import KeyGroupResult

        seen = rows.groupby("word").size().rename("n").reset_index()
        merged = seen.merge(state, on="word", how="left", indicator=True)
        merged["count"] = merged["count"].fillna(0).astype("int64") + merged["n"]
        fresh = merged.loc[merged["_merge"] == "left_only", ["word"]]
        counts = merged[["word", "count"]]
        return KeyGroupResult(
            state=counts,
            output={"counts": counts, "new_words": fresh.assign(epoch=ctx.epoch)},
        )

    inputs = write_epochs(tmp_path / "in", EPOCHS)
    lines = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(inputs))
    from pyspark_abs import DeltaSink

    pipeline = Pipeline(
        "two-sinks",
        wordcount.words_of(lines),
        counting,
        root=str(tmp_path / "root"),
        sinks={
            "counts": str(tmp_path / "counts"),
            "new_words": DeltaSink(str(tmp_path / "new"), ("epoch",)),
        },
        config=AbsConfig(key_groups=4, commit_mode="async"),
    )
    pipeline.run()
    infos = pipeline.snapshots.list()
    assert set(infos[-1].table_versions) == {"state/counting", "sink/counts", "sink/new_words"}
    new_words = pipeline.snapshots.sink("new_words")
    expected = spark.createDataFrame(
        [
            ("a", 0),
            ("b", 0),
            ("c", 0),
            ("d", 1),
            ("e", 1),
            ("f", 2),
            ("g", 2),
            ("h", 2),
            ("i", 3),
            ("j", 3),
            ("k", 3),
        ],
        "word string, epoch long",
    )
    assert_same(new_words.select("word", "epoch"), expected)
    first_epoch = pipeline.snapshots.sink("new_words", epoch=0)
    assert first_epoch.count() == 3


def test_sinks_only_mode_writes_outputs_exactly_once(spark: SparkSession, tmp_path: Path) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    word_pipeline(inputs, tmp_path / "root", snapshots=False).run()
    store = DeltaStore()
    sink = str(tmp_path / "root" / "sinks" / "word_counts")
    counts = load_dataframe(spark, sink, store.open(sink).version())
    assert_same(counts, expected_sink(spark, EPOCHS))
    assert Snapshots(str(tmp_path / "root"), spark).list() == []  # its manifest: the root's id
    assert not (tmp_path / "root" / "state").exists()


def test_configuration_comes_from_spark_conf(spark: SparkSession, tmp_path: Path) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS[:1])
    lines = spark.readStream.format("text").load(str(inputs))
    spark.conf.set("spark.abs.commitMode", "sync")
    spark.conf.set("spark.abs.keyGroups", "4")
    try:
        pipeline = Pipeline(
            "conf",
            wordcount.words_of(lines),
            wordcount.word_count,
            root=str(tmp_path / "root"),
            sinks=str(tmp_path / "sink"),
        )
        assert pipeline.config == AbsConfig(commit_mode="sync", key_groups=4)
        spark.conf.set("spark.abs.keyGroup", "4")
        with pytest.raises(
            ConfigError,
            match=r"in the Spark conf: unknown configuration key\(s\) \['spark\.abs\.keyGroup'\] "
            r"\(did you mean \['spark\.abs\.keyGroups'\]\?\); known keys are \['spark\.abs\.",
        ):
            Pipeline(
                "conf",
                wordcount.words_of(lines),
                wordcount.word_count,
                root=str(tmp_path / "root"),
                sinks=str(tmp_path / "sink"),
            )
    finally:
        for key in ("spark.abs.commitMode", "spark.abs.keyGroups", "spark.abs.keyGroup"):
            spark.conf.unset(key)


def test_tables_use_only_features_delta_spark_reads(spark: SparkSession, tmp_path: Path) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS[:1])
    pipeline = word_pipeline(inputs, tmp_path / "root")
    pipeline.run()
    store = DeltaStore()
    for table in ("_manifest", "state/word_count", "sinks/word_counts"):
        protocol = store.open(str(tmp_path / "root" / table)).protocol()
        assert (protocol.min_reader_version, protocol.reader_features) == (1, None), table


def test_composite_null_and_unicode_keys_with_nested_state(
    spark: SparkSession, tmp_path: Path
) -> None:
    @operator(
        key=["user", "day"],
        state_schema="items array<string>, last struct<item: string, n: int>",
        output_schema="user string, day int, items array<string>",
    )
    def baskets(key, rows, state):  # type: ignore[no-untyped-def]
        items = list(state.get({"items": []})["items"]) + list(rows["item"])
        state.update({"items": items, "last": {"item": items[-1], "n": len(items)}})
        return {"user": key[0], "day": key[1], "items": items}

    inputs = tmp_path / "in"
    inputs.mkdir()
    epochs: list[list[tuple[str | None, int | None, str]]] = [
        [("ünïcødé", 1, "a"), (None, 1, "b"), ("bob", None, "c")],
        [("ünïcødé", 1, "d"), (None, 1, "e"), ("bob", 2, "f")],
    ]
    for i, batch in enumerate(epochs):
        path = inputs / f"e{i}.json"
        path.write_text(
            "".join(json.dumps({"user": u, "day": d, "item": t}) + "\n" for u, d, t in batch),
            encoding="utf-8",
        )
        os.utime(path, (1_700_000_000 + i * 10, 1_700_000_000 + i * 10))
    events = (
        spark.readStream.schema("user string, day int, item string")
        .option("maxFilesPerTrigger", 1)
        .json(str(inputs))
    )
    pipeline = Pipeline(
        "baskets",
        events,
        baskets,
        root=str(tmp_path / "root"),
        sinks=str(tmp_path / "sink"),
        config=AbsConfig(key_groups=4, commit_mode="sync"),
    )
    pipeline.run()
    expected = spark.createDataFrame(
        [
            ("ünïcødé", 1, ["a", "d"], ("d", 2)),
            (None, 1, ["b", "e"], ("e", 2)),
            ("bob", None, ["c"], ("c", 1)),
            ("bob", 2, ["f"], ("f", 1)),
        ],
        "user string, day int, items array<string>, last struct<item: string, n: int>",
    )
    assert_same(pipeline.snapshots.state("baskets"), expected)
    assert pipeline.snapshots.latest().state_keys == 4  # type: ignore[union-attr]


def test_continuous_query_processes_available_data_and_restarts(
    spark: SparkSession, tmp_path: Path
) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS[:2])
    pipeline = word_pipeline(inputs, tmp_path / "root", commit_mode="async")
    query = pipeline.start(processing_time="100 milliseconds")
    query.process_all_available()
    query.stop()
    assert not query.is_active
    assert query.pending_epochs == 0
    write_epochs(tmp_path / "in", EPOCHS)
    query = word_pipeline(inputs, tmp_path / "root", commit_mode="async").start()
    query.process_all_available()
    query.stop()
    assert_word_counts(spark, tmp_path / "root", EPOCHS)


def test_spark_defaults_and_pipeline_file_configure_the_same(spark: SparkSession) -> None:
    conf = Path(__file__).parents[2] / "conf"
    lines = (conf / "spark-defaults.conf").read_text().splitlines()
    pairs = [line.split(None, 1) for line in lines if line.startswith("spark.abs.")]
    try:
        for key, value in pairs:
            spark.conf.set(key, value.strip())
        from_spark = AbsConfig.from_spark_conf(spark)
    finally:
        for key, _ in pairs:
            spark.conf.unset(key)
    assert len(pairs) >= 3
    assert from_spark == AbsConfig.from_file(conf / "pipeline.toml")
