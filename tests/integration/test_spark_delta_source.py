"""Spark's own Delta source over tables delta-spark writes, and delta-spark writers racing
pyspark-abs's commits: crash, rollback and restore give the uninterrupted run's results.

Marker ``delta_jvm``: ``scripts/test_spark_versions`` runs them on the oldest and the newest
Spark that has a Delta Lake release, with Delta's jars on the session.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pyspark_abs import (
    AbsConfig,
    Job,
    Pipeline,
    Snapshots,
    SparkDeltaSource,
    restore,
    rollback,
    validate,
)
from pyspark_abs.errors import ExternalChangeError, InjectedFault, SourceError
from pyspark_abs.examples import wordcount
from pyspark_abs.faults import Fault, FaultStep
from pyspark_abs.storage.spark import spark_reads_delta
from tests.support.docs import block_with
from tests.support.inputs import EPOCHS
from tests.support.jobs import assert_same_words_and_updates, words_and_updates
from tests.support.pipelines import OP, assert_same, counts_df
from tests.support.versions import as_batched, older, shuffle_partitions, sink_of

pytestmark = pytest.mark.delta_jvm


def append_lines(spark: SparkSession, table: Path, texts: Sequence[str], files: int = 1) -> None:
    """One delta-spark commit per text, its lines as ``value`` rows in ``files`` files."""
    for text in texts:
        rows = [(line,) for line in text.split()]
        frame = spark.createDataFrame(rows, "value string").repartition(files)
        frame.write.format("delta").mode("append").save(str(table))


def native(
    root: Path, table: Path, *, key_groups: int = 8, crash: int | None = None, **options: str
) -> Pipeline:
    """The word count over Spark's own Delta source, a file per micro-batch (so a version per
    epoch when a commit writes one file, as in an uninterrupted run); ``crash`` after
    PREPARED of that epoch."""
    faults = () if crash is None else (Fault(FaultStep.AFTER_PREPARED, epoch=crash),)
    return Pipeline(
        "wordcount",
        SparkDeltaSource(path=str(table), options={"maxFilesPerTrigger": "1", **options}),
        wordcount.word_count,
        root=str(root),
        sinks={"output": sink_of(root)},
        config=AbsConfig(key_groups=key_groups, commit_mode="sync", faults=faults),
        transform=wordcount.words_of,
    )


def test_spark_delta_source_survives_a_crash_a_rollback_and_a_restore_as_an_uninterrupted_run(
    delta_spark: SparkSession, tmp_path: Path
) -> None:
    spark = delta_spark
    table, root, clean = tmp_path / "lines", tmp_path / "root", tmp_path / "clean"
    append_lines(spark, table, EPOCHS[:1])
    native(root, table).run()
    native(clean, table).run()
    append_lines(spark, table, EPOCHS[1:2])
    with pytest.raises(InjectedFault):
        native(root, table, crash=1).run()
    native(root, table).run()
    native(clean, table).run()
    append_lines(spark, table, EPOCHS[2:])
    native(root, table).run()
    native(clean, table).run()
    snapshots, uninterrupted = Snapshots(str(root), spark), Snapshots(str(clean), spark)
    assert_same(snapshots.state(OP), counts_df(spark, EPOCHS))

    rollback(str(root), 0)
    native(root, table).run()
    assert_same(snapshots.state(OP), uninterrupted.state(OP))
    assert_same(*as_batched(spark, snapshots.sink("output"), uninterrupted.sink("output")))

    copy = tmp_path / "copy"
    restore(str(clean), 0, str(copy))
    other = tmp_path / "other"
    append_lines(spark, other, EPOCHS[:1])
    with pytest.raises(SourceError, match=r"is table \S+, but the snapshot read table \S+"):
        native(copy, other).run()
    with pytest.raises(SourceError, match=r"\(\S+missing\): cannot read the Delta table .*check"):
        native(copy, tmp_path / "missing")
    with shuffle_partitions(spark, 3):
        native(copy, table, key_groups=5).run()
    restored = Snapshots(str(copy), spark)
    assert_same(restored.state(OP), uninterrupted.state(OP))
    after_snapshot = uninterrupted.sink("output").subtract(uninterrupted.sink("output", 0))
    assert_same(*as_batched(spark, restored.sink("output"), after_snapshot))


def test_an_epoch_ending_inside_a_delta_version_is_refused_and_a_boundary_rolls_back(
    delta_spark: SparkSession, tmp_path: Path
) -> None:
    spark = delta_spark
    table, root = tmp_path / "lines", tmp_path / "root"
    append_lines(spark, table, EPOCHS[:2], files=2)
    native(root, table).run()
    epochs = [(s.epoch, s.source_offsets) for s in Snapshots(str(root), spark).list()]
    inside = [e for e, offsets in epochs if '"index":-1' not in (offsets or "")]
    boundary = [e for e, offsets in epochs if '"index":-1' in (offsets or "")]
    assert inside, epochs
    assert boundary, epochs
    manifest = Snapshots(str(root), spark).manifest().count()
    with pytest.raises(
        SourceError,
        match=rf"cannot roll back to epoch {inside[0]}: no run can continue after epoch "
        rf"{inside[0]} .*stopped inside version \d+ .*Nothing was changed",
    ):
        rollback(str(root), inside[0])
    assert Snapshots(str(root), spark).manifest().count() == manifest
    rollback(str(root), boundary[0])
    native(root, table).run()
    assert_same(Snapshots(str(root), spark).state(OP), counts_df(spark, EPOCHS[:2]))


def test_delta_spark_optimize_and_delete_racing_the_pipeline_lose_nothing(
    delta_spark: SparkSession, tmp_path: Path
) -> None:
    spark = delta_spark
    table, root, clean = tmp_path / "lines", tmp_path / "root", tmp_path / "clean"
    sink = sink_of(root)
    for text in EPOCHS[:2]:
        append_lines(spark, table, [text])
        native(root, table).run()
        native(clean, table).run()
    spark.sql(f"OPTIMIZE delta.`{sink}`")
    stop = threading.Event()

    def optimize_until_stopped() -> None:
        while not stop.is_set():
            spark.sql(f"OPTIMIZE delta.`{sink}`")
            spark.sql(f"OPTIMIZE delta.`{table}`")

    racer = threading.Thread(target=optimize_until_stopped)
    racer.start()
    try:
        for text in EPOCHS[2:]:
            append_lines(spark, table, [text])
            native(root, table).run()
            native(clean, table).run()
    finally:
        stop.set()
        racer.join(timeout=120)
    operations = [r.operation for r in spark.sql(f"DESCRIBE HISTORY delta.`{sink}`").collect()]
    assert "OPTIMIZE" in operations
    assert validate(str(root)) == []
    uninterrupted = Snapshots(str(clean), spark)
    assert_same(Snapshots(str(root), spark).sink("output"), uninterrupted.sink("output"))

    # a person's rows erased by delta-spark: kept by the pipeline and by any later rollback
    spark.sql(f"DELETE FROM delta.`{sink}` WHERE word = 'a'")
    last = len(EPOCHS) - 1
    erased = uninterrupted.sink("output", last).where(F.col("word") == "a")
    for text in ("a z", "z y"):
        append_lines(spark, table, [text])
        native(root, table).run()
        native(clean, table).run()
    with pytest.raises(ExternalChangeError, match=r"DELETE at version \d+\), and going back"):
        rollback(str(root), last)
    rollback(str(root), last + 1)
    native(root, table).run()
    current = spark.read.format("delta").load(sink)
    assert_same(current, uninterrupted.sink("output").subtract(erased))
    assert validate(str(root)) == []


def test_the_readme_block_runs_a_pipeline_over_delta_lakes_own_source(
    delta_spark: SparkSession, tmp_path: Path
) -> None:
    table, root = tmp_path / "clicks", tmp_path / "root"
    words = delta_spark.createDataFrame([(w,) for w in EPOCHS[0].split()], "word string")
    words.write.format("delta").save(str(table))
    block = block_with('SparkDeltaSource(path="/bronze/clicks"')
    paths = {"/bronze/clicks": table, "/roots/sessions": root, "/sinks/sessions": tmp_path / "sink"}
    for example, here in paths.items():
        block = block.replace(example, str(here))
    scope: dict[str, Any] = {"sessions": wordcount.word_count}
    exec(compile(block, "docs SparkDeltaSource", "exec"), scope)
    assert_same(Snapshots(str(root), delta_spark).state(OP), counts_df(delta_spark, EPOCHS[:1]))


def test_a_job_whose_head_reads_delta_lakes_own_source_rolls_back_as_an_uninterrupted_job(
    delta_spark: SparkSession, tmp_path: Path
) -> None:
    if older(delta_spark):
        pytest.skip("jobs need Spark 4.2")
    spark, table = delta_spark, tmp_path / "lines"

    def job_at(base: Path) -> Job:
        return words_and_updates(base, native(base / "words", table))

    rolled, clean = tmp_path / "rolled", tmp_path / "clean"
    for text in EPOCHS:
        append_lines(spark, table, [text])
        job_at(rolled).run()
        job_at(clean).run()
    job_at(rolled).rollback(1)
    job_at(rolled).run()
    assert_same_words_and_updates(spark, rolled, clean)


def test_without_delta_lakes_jars_the_source_says_what_to_add(
    spark: SparkSession, tmp_path: Path
) -> None:
    if spark_reads_delta(spark):
        pytest.skip("this session has Delta Lake's jars")
    with pytest.raises(SourceError, match=r"Delta Lake's jars are not on the session .*--packages"):
        SparkDeltaSource(path=str(tmp_path)).load(spark)
