"""Savepoints: rollback, restore into another root with rescaling, and written state."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pyspark_abs import (
    AbsConfig,
    DeltaSource,
    EpochStatus,
    KeyGroupContext,
    KeyGroupResult,
    Pipeline,
    Snapshots,
    cli,
    restore,
    rollback,
    vectorized_operator,
    write_state,
)
from pyspark_abs.errors import (
    ConfigError,
    ExternalChangeError,
    InjectedFault,
    PipelineMismatchError,
    SnapshotNotFoundError,
    SnapshotRootError,
    SourceError,
    StateEvolutionError,
    UncommittableEpochError,
)
from pyspark_abs.examples.wordcount import word_count, words_of
from pyspark_abs.faults import Fault, FaultStep
from tests.support.inputs import EPOCHS, running_counts
from tests.support.pipelines import (
    OP,
    STATE_DDL,
    assert_same,
    counts_df,
    event_table,
    session_pipeline,
    sessions,
    word_table,
)
from tests.support.versions import land_and_run, sink_of


@vectorized_operator(key="word", state_schema="count long", output_schema=STATE_DDL, name=OP)
def buggy_count(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    """The word count with a bug shipped at epoch 2: it counts every word twice."""
    weight = 2 if ctx.epoch is not None and ctx.epoch >= 2 else 1
    seen = rows.groupby("word", sort=False).size().rename("seen").reset_index()
    merged = seen.merge(state, on="word", how="left")
    merged["count"] = merged["count"].fillna(0).astype("int64") + weight * merged["seen"]
    updated = merged[["word", "count"]]
    return KeyGroupResult(state=updated, output=updated)


def pipeline(
    root: Path,
    words: str,
    *,
    sink: Path | None = None,
    op: object = word_count,
    key_groups: int = 8,
) -> Pipeline:
    return Pipeline(
        "words",
        DeltaSource(words, max_files_per_trigger=1),
        op,  # type: ignore[arg-type]
        root=str(root),
        sinks={"output": str(sink or root / "sink")},
        config=AbsConfig(key_groups=key_groups, commit_mode="sync"),
    )


@pytest.mark.smoke
def test_rollback_then_fixed_code_equals_a_clean_run(spark: SparkSession, tmp_path: Path) -> None:
    words = word_table(tmp_path / "words", EPOCHS)
    root = tmp_path / "root"
    pipeline(root, words, op=buggy_count).run()
    snapshots = Snapshots(str(root), spark)
    assert [s.epoch for s in snapshots.list()] == [0, 1, 2, 3]

    restored = rollback(str(root), 1)
    assert restored.status is EpochStatus.RESTORED
    assert (restored.epoch, restored.restored_from) == (4, 1)
    assert_same(snapshots.state(OP, 4), counts_df(spark, EPOCHS[:2]))
    assert_same(snapshots.sink("output", 4), snapshots.sink("output", 1))

    query = pipeline(root, words).run()  # the fixed code, same checkpoint location
    assert query.recovered_epochs == []
    assert [s.epoch for s in snapshots.list()] == [0, 1, 2, 3, 4, 5, 6]
    assert_same(snapshots.state(OP), counts_df(spark, EPOCHS))

    clean = tmp_path / "clean"
    pipeline(clean, words).run()
    assert_same(snapshots.sink("output"), Snapshots(str(clean), spark).sink("output"))
    assert list((tmp_path / "root").glob("_checkpoint-superseded-by-epoch-4*"))


def test_restore_into_new_root_with_other_partition_and_key_group_counts(
    spark: SparkSession, tmp_path: Path
) -> None:
    words = word_table(tmp_path / "words", EPOCHS)
    first = tmp_path / "first"
    pipeline(first, words).run()
    original = Snapshots(str(first), spark)

    copy = tmp_path / "copy"
    installed = restore(str(first), 1, str(copy))
    assert (installed.epoch, installed.status) == (1, EpochStatus.RESTORED)
    snapshots = Snapshots(str(copy), spark)
    assert_same(
        snapshots.state(OP, 1, with_metadata=True), original.state(OP, 1, with_metadata=True)
    )

    spark.conf.set("spark.sql.shuffle.partitions", "3")
    try:
        pipeline(copy, words, sink=tmp_path / "copy_sink", key_groups=5).run()
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")
    infos = snapshots.list()
    assert [i.epoch for i in infos] == [1, 2, 3]
    assert snapshots._log().latest(3).num_partitions == 3  # type: ignore[union-attr]
    for epoch in (2, 3):
        assert_same(snapshots.state(OP, epoch), original.state(OP, epoch))
    expected_sink = original.sink("output").subtract(original.sink("output", 1))
    assert_same(snapshots.sink("output"), expected_sink)


def test_edit_state_and_continue(spark: SparkSession, tmp_path: Path) -> None:
    words = tmp_path / "words"
    word_table(words, EPOCHS[:2])
    root = tmp_path / "root"
    pipeline(root, str(words)).run()
    snapshots = Snapshots(str(root), spark)
    state = snapshots.state(OP)
    edited = state.where("word != 'b'").replace(1, 50, subset=["count"])
    info = write_state(edited, str(root), word_count)
    assert (info.epoch, info.status, info.restored_from) == (2, EpochStatus.RESTORED, 1)
    assert_same(snapshots.state(OP), edited)

    word_table(words, EPOCHS[2:])
    pipeline(root, str(words)).run()
    later = Counter(running_counts(EPOCHS[2:])[0])
    expected = Counter(dict(edited.toPandas().itertuples(index=False, name=None)))
    expected.update(later)
    assert_same(snapshots.state(OP), spark.createDataFrame(sorted(expected.items()), STATE_DDL))


def test_writing_empty_state_forgets_every_key_and_the_run_continues(
    spark: SparkSession, tmp_path: Path
) -> None:
    words = tmp_path / "words"
    word_table(words, EPOCHS[:2])
    root = tmp_path / "root"
    pipeline(root, str(words)).run()
    snapshots = Snapshots(str(root), spark)
    info = write_state(snapshots.state(OP).limit(0), str(root), word_count)
    assert (info.epoch, info.status) == (2, EpochStatus.RESTORED)
    assert snapshots.state(OP).count() == 0

    word_table(words, EPOCHS[2:])
    pipeline(root, str(words)).run()
    assert_same(snapshots.state(OP), counts_df(spark, EPOCHS[2:]))


def test_bootstrap_a_new_pipeline_from_a_batch_dataframe(
    spark: SparkSession, tmp_path: Path
) -> None:
    initial = spark.createDataFrame([("a", 10), ("z", 5)], STATE_DDL)
    root = tmp_path / "root"
    info = write_state(initial, str(root), word_count, pipeline="words")
    assert (info.epoch, info.restored_from) == (0, None)
    words = word_table(tmp_path / "words", EPOCHS)
    pipeline(root, words).run()
    assert_same(
        Snapshots(str(root), spark).state(OP),
        counts_df(spark, EPOCHS, Counter({"a": 10, "z": 5})),
    )


def test_a_snapshot_of_a_source_without_offsets_to_start_at_is_refused_before_anything_changes(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"

    def rate_pipeline() -> Pipeline:
        rows = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 5).load()
        return Pipeline(
            "words",
            words_of(rows.select(F.col("value").cast("string").alias("value"))),
            word_count,
            root=str(root),
            sinks={"output": str(root / "sink")},
            config=AbsConfig(key_groups=4, commit_mode="sync"),
        )

    rate_pipeline().run()
    rate_pipeline().run()
    snapshots = Snapshots(str(root), spark)
    manifest = snapshots.manifest().count()
    refused = (
        r"no run can continue after epoch 1 of \S+ \(its recorded offset .*a rate source.*"
        r"Nothing was changed"
    )
    with pytest.raises(SourceError, match=rf"cannot roll back to epoch 1: {refused}"):
        rollback(str(root), 1)
    with pytest.raises(SourceError, match=rf"cannot restore epoch 1 into \S+: {refused}"):
        restore(str(root), 1, str(tmp_path / "copy"))
    with pytest.raises(SourceError, match=r"cannot write state for operator 'word_count': "):
        write_state(snapshots.state("word_count"), str(root), word_count)
    assert cli.main(["rollback", str(root), "1"]) == cli.EXIT_USAGE
    assert "cannot roll back to epoch 1" in capsys.readouterr().err
    assert snapshots.manifest().count() == manifest
    assert not (tmp_path / "copy").exists()

    # the pipeline goes on from its own checkpoint as if nothing had been tried
    rate_pipeline().run()
    epochs = len(snapshots.list())
    expected = spark.createDataFrame(
        [(str(v), 1) for v in range(5 * epochs)], "word string, count long"
    )
    assert_same(snapshots.state("word_count"), expected)


def test_a_rollback_past_a_vacuum_of_a_sink_is_refused_before_anything_changes(
    spark: SparkSession, tmp_path: Path
) -> None:
    """An OPTIMIZE then a VACUUM of a sink deleted the files of its old versions: a rollback
    to a snapshot before them cannot restore the sink, so it is refused before it records an
    epoch it could never finish, and the pipeline goes on as the uninterrupted one."""
    root, clean, landing = tmp_path / "root", tmp_path / "clean", tmp_path / "in"
    for epoch, text in enumerate(EPOCHS):
        land_and_run(tmp_path / "in-clean", clean, [text], first=epoch)
        if epoch < 3:
            land_and_run(landing, root, [text], first=epoch)
    table = DeltaTable(sink_of(root))
    table.optimize.compact()
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    snapshots = Snapshots(str(root), spark)
    manifest = snapshots.manifest().count()
    gone = r"cannot go back to its version \d+ \(as of epoch 0\): \d+ of that version's files"
    with pytest.raises(ExternalChangeError, match=rf"{gone} are gone.*Nothing was changed"):
        rollback(str(root), 0)
    assert snapshots.manifest().count() == manifest

    land_and_run(landing, root, EPOCHS[3:], first=3)
    uninterrupted = Snapshots(str(clean), spark)
    assert_same(snapshots.state("word_count"), uninterrupted.state("word_count"))
    assert_same(snapshots.sink("output"), uninterrupted.sink("output"))


def test_a_rollback_whose_sink_files_a_vacuum_deleted_after_its_decision_is_replaced_by_the_next(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A rollback crashed right after its decision; then an OPTIMIZE and a VACUUM of the sink
    deleted the files its restore needs, so its restore epoch can never finish. The start
    says so and what to do, a rollback to a later snapshot replaces it, and the pipeline goes
    on as the uninterrupted one."""
    root, clean, landing = tmp_path / "root", tmp_path / "clean", tmp_path / "in"
    for epoch, text in enumerate(EPOCHS):
        land_and_run(tmp_path / "in-clean", clean, [text], first=epoch)
        if epoch < 3:
            land_and_run(landing, root, [text], first=epoch)
    crash = AbsConfig(faults=(Fault(FaultStep.AFTER_PREPARED, epoch=3),))
    with pytest.raises(InjectedFault):
        rollback(str(root), 0, config=crash)
    table = DeltaTable(sink_of(root))
    table.optimize.compact()
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)

    stuck = r"epoch 3 can never be committed: \d+ file\(s\) of version \d+ of sink/output .* gone"
    advice = r"roll back to a snapshot, which replaces it: pyspark_abs.rollback\(.*, 2\)"
    with pytest.raises(UncommittableEpochError, match=rf"{stuck}.*{advice}"):
        land_and_run(landing, root, EPOCHS[3:], first=3)
    with pytest.raises(ExternalChangeError, match=r"version \d+ \(as of epoch 0\).*are gone"):
        rollback(str(root), 0)
    replaced = rollback(str(root), 2)
    assert replaced.epoch == 4
    aborted = Snapshots(str(root), spark).list(include_aborted=True)[-2]
    assert (aborted.epoch, aborted.status) == (3, EpochStatus.ABORTED)
    assert re.search(
        r"replaced by restore epoch 4 \(rollback to epoch 2\).*gone", aborted.error or ""
    )

    land_and_run(landing, root, EPOCHS[3:], first=3)
    snapshots, uninterrupted = Snapshots(str(root), spark), Snapshots(str(clean), spark)
    assert_same(snapshots.state("word_count"), uninterrupted.state("word_count"))
    assert_same(snapshots.sink("output"), uninterrupted.sink("output"))


def test_errors_name_the_problem(spark: SparkSession, tmp_path: Path) -> None:
    words = word_table(tmp_path / "words", EPOCHS[:2])
    root = tmp_path / "root"
    pipeline(root, words).run()
    with pytest.raises(
        SnapshotNotFoundError, match=r"epoch 7 .* not in the manifest; readable epochs are 0..1"
    ):
        rollback(str(root), 7)
    with pytest.raises(SnapshotNotFoundError, match="not a pyspark-abs snapshot root"):
        rollback(str(tmp_path / "nothing"), 0)
    with pytest.raises(SnapshotRootError, match=r"into another root; .* use rollback"):
        restore(str(root), 0, str(root))
    restore(str(root), 0, str(tmp_path / "copy"))
    with pytest.raises(SnapshotRootError, match="already holds epochs"):
        restore(str(root), 1, str(tmp_path / "copy"))
    with pytest.raises(ConfigError, match="holds state in 8 key groups"):
        pipeline(root, words, key_groups=16).run()
    with pytest.raises(PipelineMismatchError, match="rollback"):
        Pipeline(
            "words",
            DeltaSource(words),
            word_count,
            root=str(root),
            checkpoint=str(tmp_path / "other_checkpoint"),
            sinks={"output": str(root / "sink")},
            config=AbsConfig(key_groups=8),
        ).run()


def test_restored_event_time_timeouts_fire_in_the_new_checkpoint(
    spark: SparkSession, tmp_path: Path
) -> None:
    batches = [[("a", 100), ("b", 101)], [("a", 105)], [("c", 130)], [("d", 131)]]
    events = event_table(tmp_path / "events", batches)
    original = tmp_path / "original"
    session_pipeline(events, original).run()
    reference = Snapshots(str(original), spark)
    copy = tmp_path / "copy"
    restore(str(original), 1, str(copy))
    timeouts = Snapshots(str(copy), spark).state("sessions", 1, with_metadata=True)
    assert sorted(r["_timeout"] for r in timeouts.collect()) == [111_000, 115_000]

    session_pipeline(events, copy).run()
    restored = Snapshots(str(copy), spark)
    closed = restored.sink("output").where("closed")
    assert sorted(r["word"] for r in closed.collect()) == ["a", "b"]
    assert_same(
        restored.sink("output"),
        reference.sink("output").subtract(reference.sink("output", 1)),
    )


def test_write_state_of_an_event_time_operator_keeps_its_timers(
    spark: SparkSession, tmp_path: Path
) -> None:
    batches = [[("a", 100), ("b", 101)], [("a", 105)], [("c", 130)], [("d", 131)]]
    uninterrupted = tmp_path / "uninterrupted"
    session_pipeline(event_table(tmp_path / "all", batches), uninterrupted).run()

    events = event_table(tmp_path / "events", batches[:2])
    root = tmp_path / "root"
    session_pipeline(events, root).run()
    state = Snapshots(str(root), spark).state("sessions", with_metadata=True)
    info = write_state(state, str(root), sessions)  # the same state and timers, written back
    assert info.epoch == 2
    event_table(tmp_path / "events", batches[2:])
    session_pipeline(events, root).run()
    assert_same(
        Snapshots(str(root), spark).sink("output"),
        Snapshots(str(uninterrupted), spark).sink("output"),
    )


def test_crash_inside_rollback_is_finished_by_the_next_start(
    spark: SparkSession, tmp_path: Path
) -> None:
    words = word_table(tmp_path / "words", EPOCHS)
    root = tmp_path / "root"
    pipeline(root, words).run()
    crash = AbsConfig(faults=(Fault(FaultStep.BETWEEN_TABLE_COMMITS, epoch=4),))
    with pytest.raises(
        InjectedFault,
        match=r"^rollback of \S+ to epoch 1 \(restore epoch 4\): .*'between_table_commits' of "
        r"epoch 4",
    ):
        rollback(str(root), 1, config=crash)
    snapshots = Snapshots(str(root), spark)
    assert snapshots.get(4).status is EpochStatus.PREPARED

    query = pipeline(root, words).run()
    assert query.recovered_epochs == [4]
    assert snapshots.get(4).status is EpochStatus.RESTORED
    assert_same(snapshots.state(OP), counts_df(spark, EPOCHS))
    clean = tmp_path / "clean"
    pipeline(clean, words).run()
    assert_same(snapshots.sink("output"), Snapshots(str(clean), spark).sink("output"))


@vectorized_operator(
    key="word", state_schema="count long, doubled long", output_schema=STATE_DDL, name="stats"
)
def word_stats(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    """A new version of the word count whose state has one more column."""
    seen = rows.groupby("word", sort=False).size().rename("seen").reset_index()
    merged = seen.merge(state, on="word", how="left")
    merged["count"] = merged["count"].fillna(0).astype("int64") + merged["seen"]
    merged["doubled"] = 2 * merged["count"]
    return KeyGroupResult(
        state=merged[["word", "count", "doubled"]], output=merged[["word", "count"]]
    )


def test_write_state_changes_the_state_schema_into_a_new_root_or_in_place(
    spark: SparkSession, tmp_path: Path
) -> None:
    words = word_table(tmp_path / "words", EPOCHS[:2])
    root = tmp_path / "root"
    pipeline(root, words).run()
    old = Snapshots(str(root), spark).state(OP)
    migrated = old.selectExpr("word", "count", "count * 2 AS doubled")
    new_root = tmp_path / "v2"
    info = write_state(migrated, str(new_root), word_stats, pipeline="words-v2")
    assert info.status is EpochStatus.RESTORED
    assert_same(Snapshots(str(new_root), spark).state("stats"), migrated)

    stats = dataclasses.replace(word_stats, name=OP)
    write_state(migrated, str(root), stats)
    snapshots = Snapshots(str(root), spark)
    assert_same(snapshots.state(OP), migrated)
    assert snapshots.state(OP, 1).columns == ["word", "count"]  # the old snapshot keeps its own
    with pytest.raises(StateEvolutionError, match=r"doubled: refused \(stored column"):
        pipeline(root, words).start(available_now=True)
    word_table(tmp_path / "words", EPOCHS[2:])
    pipeline(root, words, op=stats).run()
    assert_same(snapshots.state(OP).drop("doubled"), counts_df(spark, EPOCHS))
