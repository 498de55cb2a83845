"""Spark's own file source, as the example word count reads it: crash, rollback (twice, and to
a restore epoch) and restore into other roots give the uninterrupted run's results, on every
Spark version."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from pyspark_abs import AbsConfig, Pipeline, Snapshots, restore, rollback
from pyspark_abs.errors import InjectedFault, SourceError
from pyspark_abs.examples import wordcount
from pyspark_abs.faults import Fault, FaultStep
from tests.support.docs import block_with
from tests.support.inputs import EPOCHS, write_epochs
from tests.support.pipelines import OP, assert_same, counts_df, user_count
from tests.support.versions import as_batched, shuffle_partitions, sink_of


def native(root: Path, landing: Path, *, key_groups: int = 8, crash: int | None = None) -> Pipeline:
    """The example word count (Spark's own text source, a file per micro-batch); ``crash``
    after PREPARED of that epoch."""
    return wordcount.build(str(landing), str(root), config=settings(key_groups, crash))


def word_count_over(root: Path, source: DataFrame) -> Pipeline:
    """The word count over a streaming DataFrame ``source`` at ``root``."""
    return Pipeline(
        "wordcount",
        source,
        wordcount.word_count,
        root=str(root),
        sinks={"output": sink_of(root)},
        config=settings(),
        transform=wordcount.words_of,
    )


def settings(key_groups: int = 8, crash: int | None = None) -> AbsConfig:
    """Synchronous commits at ``key_groups``; a crash after PREPARED of epoch ``crash``."""
    faults = () if crash is None else (Fault(FaultStep.AFTER_PREPARED, epoch=crash),)
    return AbsConfig(key_groups=key_groups, commit_mode="sync", faults=faults)


@pytest.mark.compat
def test_spark_file_source_rewinds_through_rollbacks_and_restores_as_an_uninterrupted_run(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing, root, clean = tmp_path / "landing", tmp_path / "root", tmp_path / "clean"
    write_epochs(landing, EPOCHS[:2])
    with pytest.raises(InjectedFault):
        native(root, landing, crash=1).run()
    native(root, landing).run()
    native(clean, landing).run()
    write_epochs(landing, EPOCHS[2:], first=2)
    native(root, landing).run()
    native(clean, landing).run()
    snapshots, uninterrupted = Snapshots(str(root), spark), Snapshots(str(clean), spark)
    assert_same(snapshots.state(OP), counts_df(spark, EPOCHS))
    after_first = uninterrupted.sink("output").subtract(uninterrupted.sink("output", 0))

    restore_epoch = rollback(str(root), 0).epoch
    native(root, landing).run()
    assert_same(snapshots.state(OP), uninterrupted.state(OP))
    assert_same(*as_batched(spark, snapshots.sink("output"), uninterrupted.sink("output")))

    rollback(str(root), restore_epoch)  # again, to the restore epoch itself
    native(root, landing).run()
    assert_same(snapshots.state(OP), uninterrupted.state(OP))
    assert_same(*as_batched(spark, snapshots.sink("output"), uninterrupted.sink("output")))

    rollback(str(root), 2)  # read by the first checkpoint, which two rollbacks moved aside
    native(root, landing).run()
    assert_same(snapshots.state(OP), uninterrupted.state(OP))
    assert_same(*as_batched(spark, snapshots.sink("output"), uninterrupted.sink("output")))

    for name, source in (("from-clean", clean), ("from-restore-epoch", root)):
        copy = tmp_path / name
        at = 0 if source == clean else restore_epoch
        restore(str(source), at, str(copy))
        with shuffle_partitions(spark, 3):
            native(copy, landing, key_groups=5).run()
        restored = Snapshots(str(copy), spark)
        assert_same(restored.state(OP), uninterrupted.state(OP))
        assert_same(*as_batched(spark, restored.sink("output"), after_first))


def test_a_rewind_whose_checkpoint_is_gone_is_refused_and_changes_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing, root = tmp_path / "landing", tmp_path / "root"
    write_epochs(landing, EPOCHS[:2])
    native(root, landing).run()
    shutil.rmtree(root / "_checkpoint")
    manifest = Snapshots(str(root), spark).manifest().count()
    with pytest.raises(
        SourceError,
        match=r"cannot rewind Spark's file source to epoch 0 of \S+root: the checkpoint that "
        r"read it \(\S+_checkpoint, query \S+\) is gone.*The root is unchanged",
    ):
        rollback(str(root), 0)
    assert Snapshots(str(root), spark).manifest().count() == manifest


def test_a_spark_dataframe_over_files_is_rewound_only_through_spark_file_source(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing, root, clean = tmp_path / "landing", tmp_path / "root", tmp_path / "clean"
    write_epochs(landing, EPOCHS)
    native(clean, landing).run()
    word_count_over(
        root, spark.readStream.option("maxFilesPerTrigger", "1").text(str(landing))
    ).run()
    rollback(str(root), 1)
    with pytest.raises(SourceError, match=r"Use one as the source \(SparkFileSource for "):
        word_count_over(root, spark.readStream.text(str(landing))).run()
    native(root, landing).run()
    uninterrupted = Snapshots(str(clean), spark)
    assert_same(Snapshots(str(root), spark).state(OP), uninterrupted.state(OP))


def test_the_readme_block_runs_a_pipeline_over_sparks_own_file_source(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing, root = tmp_path / "clicks", tmp_path / "root"
    landing.mkdir()
    clicks = [("ann", "2026-01-01 10:00:00"), ("bob", "2026-01-01 10:01:00"), ("ann", None)]
    (landing / "part-0.json").write_text(
        "\n".join(json.dumps({"user": u, "ts": t}) for u, t in clicks)
    )
    block = block_with('schema="user string, ts timestamp",')
    paths = {"/landing/clicks": landing, "/roots/sessions": root, "/sinks/sessions": tmp_path / "s"}
    for example, here in paths.items():
        block = block.replace(example, str(here))
    scope: dict[str, Any] = {"sessions": user_count}
    exec(compile(block, "docs SparkFileSource", "exec"), scope)
    expected = spark.createDataFrame([("ann", 2), ("bob", 1)], "user string, count long")
    assert_same(Snapshots(str(root), spark).state("user_count").select("user", "count"), expected)
