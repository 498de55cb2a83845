"""The documentation's how-to blocks that are fragments of one story, run in order as a reader would:
the operators, reading snapshots and metrics, a listener, a rollback, a restore at another
scale, named savepoints and written state, on one word count; and the blocks of a job. Each block runs as printed,
with the example's paths and epochs replaced by this run's; the results are checked against
the uninterrupted word count."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pyspark_abs import AbsConfig, FileSource, Job, Operator, Pipeline, Snapshots
from pyspark_abs.examples import medallion
from pyspark_abs.examples.wordcount import words_of
from tests.support.docs import run_block
from tests.support.inputs import EPOCHS, write_epochs
from tests.support.jobs import FILES
from tests.support.pipelines import assert_same, counts_df
from tests.support.versions import shuffle_partitions

MORE = ("a l m", "n a b spam")


def word_count_pipeline(
    root: Path, landing: Path, operator: Operator, **options: object
) -> Pipeline:
    """The documentation's word count over the text files landed in ``landing``."""
    return Pipeline(
        "wordcount",
        FileSource(str(landing), "text"),
        operator,
        root=str(root),
        sinks={"output": f"{root}/sinks/word_counts"},
        config=AbsConfig(key_groups=8, commit_mode="sync"),
        transform=words_of,
        **options,  # type: ignore[arg-type]
    )


def last_counts(sink: DataFrame) -> DataFrame:
    """Each word's last count (the copy's epochs need not be the original's)."""
    return sink.groupBy("word").agg(F.max("count").alias("count"))


def test_the_operator_snapshot_and_savepoint_blocks_run_as_one_story(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    landing, root, clean = tmp_path / "landing", tmp_path / "root", tmp_path / "clean"
    landing.mkdir()
    ns: dict[str, object] = {"spark": spark, "F": F, "pd": pd, "root": str(root)}

    # Write an operator: per key, then vectorized; both count as the uninterrupted run.
    run_block("def word_count(key: tuple, rows: pd.DataFrame, state) -> dict:", ns, {})
    per_key = word_count_pipeline(tmp_path / "per-key", landing, cast(Operator, ns["word_count"]))
    run_block("def word_count(rows: pa.Table, state: pa.Table, ctx: ArrowContext)", ns, {})
    arrow = word_count_pipeline(tmp_path / "arrow", landing, cast(Operator, ns["word_count"]))
    run_block("def word_count(rows: pd.DataFrame, state: pd.DataFrame, ctx)", ns, {})
    pipeline = ns["pipeline"] = ns["fixed_pipeline"] = word_count_pipeline(
        root, landing, cast(Operator, ns["word_count"])
    )
    uninterrupted = word_count_pipeline(clean, landing, cast(Operator, ns["word_count"]))
    for epoch, text in enumerate(EPOCHS):  # one file an epoch
        write_epochs(landing, [text], first=epoch)
        for each in (per_key, arrow, pipeline, uninterrupted):
            each.run()
    expected = counts_df(spark, EPOCHS)
    assert_same(Snapshots(str(tmp_path / "per-key"), spark).state("word_count"), expected)
    arrow_snapshots, clean_snapshots = (
        Snapshots(str(tmp_path / "arrow"), spark),
        Snapshots(str(clean), spark),
    )
    assert_same(arrow_snapshots.state("word_count"), expected)
    assert_same(arrow_snapshots.sink("output"), clean_snapshots.sink("output"))

    # Read snapshots, metrics and SQL.
    run_block("snapshots = pipeline.snapshots", ns, {})
    assert_same(ns["state"], expected)  # type: ignore[arg-type]
    assert_same(ns["outputs_at_3"], Snapshots(str(clean), spark).sink("output", 3))  # type: ignore[arg-type]
    run_block("metrics = snapshots.metrics()", ns, {})
    assert ns["metrics"].count() == len(EPOCHS)  # type: ignore[attr-defined]

    # A listener hears of each epoch a run commits.
    write_epochs(landing, MORE[:1], first=len(EPOCHS))
    ns.update(word_count_pipeline=word_count_pipeline, ROOT=root, LANDING=landing)
    listened = "word_count_pipeline(ROOT, LANDING, word_count, listeners=[Report()]).run()"
    capsys.readouterr()
    run_block(
        "class Report(SnapshotListener):", ns, {"Pipeline(..., listeners=[Report()])": listened}
    )
    assert capsys.readouterr().out.split()[0] == str(len(EPOCHS))
    uninterrupted.run()

    # Roll back, then run again: the uninterrupted run's state.
    rolled = {'"/data/abs/wordcount"': "root", "100": "2"}
    run_block('rollback("/data/abs/wordcount", 100)', ns, rolled)
    assert_same(
        Snapshots(str(root), spark).state("word_count"), counts_df(spark, [*EPOCHS, *MORE[:1]])
    )

    # Restore into another root at another scale.
    copy = tmp_path / "copy"
    restored = {
        '"/data/abs/wordcount"': "root",
        "100": "2",
        "/data/abs/wordcount-v2": str(copy),
        "/data/tables/word_counts_v2": str(tmp_path / "copy-sink"),
        "    DeltaSource(...),\n    word_count,": (
            '    FileSource(str(LANDING), "text"),\n    word_count,\n    transform=words_of,'
        ),
        '"64"': '"3"',
        "key_groups=1024": "key_groups=5",
    }
    ns.update(Pipeline=Pipeline, FileSource=FileSource, AbsConfig=AbsConfig, words_of=words_of)
    with shuffle_partitions(spark, 4):
        run_block(
            'restore("/data/abs/wordcount", 100, into="/data/abs/wordcount-v2")', ns, restored
        )
    assert_same(
        Snapshots(str(copy), spark).state("word_count"),
        Snapshots(str(clean), spark).state("word_count"),
    )
    # Carry the sinks along: the original's rows up to the restored epoch, then the copy's.
    carried = {'"/data/abs/wordcount"': "root", "100": "2", "/data/abs/wordcount-v2": str(copy)}
    run_block("whole = before.unionByName(after)", ns, carried)
    whole = cast(DataFrame, ns["whole"])
    assert_same(last_counts(whole), last_counts(Snapshots(str(clean), spark).sink("output")))
    assert spark.table("word_counts_v2_whole").count() == whole.count()

    # Named savepoints: stop at one, name another, roll back and restore by name.
    write_epochs(landing, MORE[1:], first=len(EPOCHS) + 1)
    ns["Snapshots"] = Snapshots
    named = {"41": "1", "/data/abs/wordcount-v2": str(tmp_path / "named-copy")}
    run_block('tag(root, 41, "before-backfill")', ns, named)
    tags = Snapshots(str(root)).tags()
    assert set(tags) == {"v1.4"}
    pipeline.run()
    uninterrupted.run()
    assert_same(
        Snapshots(str(root), spark).state("word_count"),
        Snapshots(str(clean), spark).state("word_count"),
    )

    # Edit the state, and bootstrap a new root from a table.
    legacy = tmp_path / "legacy"
    spark.createDataFrame([("a", 7), ("b", 1)], "word string, count long").write.parquet(
        str(legacy)
    )
    edits = {"/data/legacy_counts": str(legacy), "/data/abs/new": str(tmp_path / "new")}
    run_block("write_state(fixed, root, word_count)", ns, edits)
    edited = Snapshots(str(root), spark).state("word_count")
    assert_same(edited, Snapshots(str(clean), spark).state("word_count").where("word != 'spam'"))
    assert_same(Snapshots(str(tmp_path / "new"), spark).state("word_count"), ns["initial"])  # type: ignore[arg-type]


def test_the_job_blocks_run_as_one_story(spark: SparkSession, tmp_path: Path) -> None:
    """The four-stage job of the guide: run, start and stop, read, roll back, restore into
    a new job, name savepoints; each stage as the same job run uninterrupted."""
    landing, root = tmp_path / "landing", tmp_path / "job"
    medallion.write_events(landing, FILES[:2])
    config = AbsConfig(key_groups=4, commit_mode="sync")
    new_job = medallion.build(spark, str(landing), str(tmp_path / "copy"), config=config)
    ns: dict[str, object] = {
        "root": str(root),
        "EVENT_DDL": medallion.EVENT_DDL,
        "land": medallion.land,
        "dedup": medallion.dedup,
        "totals": medallion.totals,
        "check": medallion.audit,
        "new_job": new_job,
    }
    limited = f'FileSource({str(landing)!r}, "json", EVENT_DDL, max_files_per_trigger=1)'
    places = {
        'FileSource("/landing/events", "json", EVENT_DDL)': limited,
        # every stage ran before, so every stage starts at once; stopped, the run has ended
        "query.await_termination(timeout=60)": (
            "assert query.waiting == []\nquery.stop()\nassert query.await_termination(5)"
        ),
        **{f"{call}3": f"{call}1" for call in ("epoch=", "create_views(", "rollback(")},
        "restore_from(root, 3)": "restore_from(root, 1)",
    }
    run_block('job = Job("medallion", root=root, stages=[bronze, silver, gold, audit])', ns, places)
    clean = medallion.build(spark, str(landing), str(tmp_path / "clean"), config=config)
    clean.run()
    job = cast(Job, ns["job"])
    assert [s.epoch for s in job.snapshots()] == [0, 1, 2]  # 2: the rollback's restore epoch
    assert_same(spark.table("gold_state").drop("_timeout"), clean.state("gold", epoch=1))
    new_job.run()
    for stage in medallion.STAGES:
        assert_same(new_job.state(stage), clean.state(stage))
        assert_same(job.state(stage), clean.state(stage))

    medallion.write_events(landing, FILES[2:4])
    run_block('job.tag(3, "before-backfill")', ns, {"job.tag(3,": "job.tag(1,"})
    assert set(Snapshots(str(root / "stages" / "gold")).tags()) == {"before-backfill", "v1.4"}
    job.run()
    clean.run()
    for stage in medallion.STAGES:
        assert_same(job.state(stage), clean.state(stage))
