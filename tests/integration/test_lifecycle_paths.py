"""Exactly once on lifecycle paths the fault matrix does not walk (issue 15).

Each test walks a path a user can take (a second rollback after a failed start, a new root
pointed at an old sink, a replay of a decided epoch with an order-dependent operator) and
compares the outcome with what an uninterrupted run gives.
"""

from __future__ import annotations

import shutil
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
    KeyGroupContext,
    KeyGroupResult,
    Operator,
    Pipeline,
    Snapshots,
    compact,
    restore,
    rollback,
    tag,
    vectorized_operator,
    write_state,
)
from pyspark_abs.errors import InjectedFault, PipelineMismatchError
from pyspark_abs.examples.wordcount import word_count
from pyspark_abs.faults import Fault, FaultStep
from tests.support.inputs import EPOCHS, running_counts, write_epochs
from tests.support.pipelines import (
    OP,
    STATE_DDL,
    assert_same,
    counts_df,
    expected_sink,
    word_pipeline,
    word_table,
)


def weighted_count(weight: int) -> Operator:
    """A word count adding ``weight`` per word: a new weight is a new version of the code."""

    @vectorized_operator(key="word", state_schema="count long", output_schema=STATE_DDL, name=OP)
    def count(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
        seen = rows.groupby("word", sort=False).size().rename("seen").reset_index()
        merged = seen.merge(state, on="word", how="left")
        merged["count"] = merged["count"].fillna(0).astype("int64") + weight * merged["seen"]
        updated = merged[["word", "count"]]
        return KeyGroupResult(state=updated, output=updated)

    return count


def words_pipeline(
    root: Path,
    words: str,
    sink: Path | None = None,
    op: Operator = word_count,
    **config: object,
) -> Pipeline:
    settings: dict[str, object] = {"key_groups": 8, "commit_mode": "sync"}
    settings.update(config)
    return Pipeline(
        "words",
        DeltaSource(words, max_files_per_trigger=1),
        op,
        root=str(root),
        sinks={"output": str(sink or root / "sink")},
        config=AbsConfig(**settings),  # type: ignore[arg-type]
    )


def test_a_restored_copy_cannot_write_into_the_original_sink(
    spark: SparkSession, tmp_path: Path
) -> None:
    words = word_table(tmp_path / "words", EPOCHS)
    root, copy = tmp_path / "root", tmp_path / "copy"
    words_pipeline(root, words).run()
    restore(str(root), 1, into=str(copy))
    sink = root / "sink"
    version = DeltaTable(str(sink)).version()

    with pytest.raises(PipelineMismatchError) as refused:
        words_pipeline(copy, words, sink=sink).run()
    message = str(refused.value)
    assert "sink sink/output" in message
    assert str(root) in message
    assert str(copy) in message
    assert DeltaTable(str(sink)).version() == version

    own = tmp_path / "own-sink"
    words_pipeline(copy, words, sink=own).run()  # its own sink works
    assert_same(Snapshots(str(copy), spark).state(OP), counts_df(spark, EPOCHS))
    uninterrupted = spark.createDataFrame(DeltaTable(str(own)).to_pandas())

    # The copy's first epoch predates every write to its sink: rolling back to it empties
    # the sink, and the rerun writes what the uninterrupted run wrote, once.
    rollback(str(copy), 1)
    assert DeltaTable(str(own)).to_pyarrow_table().num_rows == 0
    words_pipeline(copy, words, sink=own).run()
    assert_same(spark.createDataFrame(DeltaTable(str(own)).to_pandas()), uninterrupted)


def test_a_fresh_checkpoint_with_snapshots_off_writes_every_epoch(
    spark: SparkSession, tmp_path: Path
) -> None:
    first = write_epochs(tmp_path / "in", EPOCHS[:2])
    root = tmp_path / "root"
    word_pipeline(first, root, snapshots=False).run()
    shutil.rmtree(root / "_checkpoint")
    write_epochs(first, EPOCHS)
    word_pipeline(first, root, snapshots=False).run()  # reads all files again

    sink = spark.read.parquet(*DeltaTable(str(root / "sinks" / "word_counts")).file_uris())
    expected = expected_sink(spark, EPOCHS[:2]).unionByName(expected_sink(spark, EPOCHS))
    assert_same(sink, expected)


def test_second_rollback_after_a_failed_first_batch_sets_the_checkpoint_aside(
    spark: SparkSession, tmp_path: Path
) -> None:
    words = word_table(tmp_path / "words", EPOCHS)
    root = tmp_path / "root"
    words_pipeline(root, words).run()
    assert rollback(str(root), 2).epoch == 4
    failing = words_pipeline(root, words, faults=(Fault(FaultStep.AFTER_ALIGN, epoch=5),))
    with pytest.raises(InjectedFault):
        failing.run()  # micro-batch 0 of the new checkpoint fails before PREPARED
    second = rollback(str(root), 0)
    words_pipeline(root, words).run()

    snapshots = Snapshots(str(root), spark)
    assert_same(snapshots.state(OP), counts_df(spark, EPOCHS))
    clean = tmp_path / "clean"
    words_pipeline(clean, words).run()
    assert_same(snapshots.sink("output"), Snapshots(str(clean), spark).sink("output"))
    assert list(root.glob(f"_checkpoint-superseded-by-epoch-{second.epoch}*"))


def test_a_query_stopped_while_spark_wrote_its_first_offsets_starts_again(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Spark 4.1+ refuses to run micro-batch 0 unless its checkpoint's offsets log is empty.

    A stop that interrupts the write of micro-batch 0's offsets leaves the file's temporary
    copy (seen when a job's stage failed and the job stopped stages still in their first
    micro-batch). The first run here starts on no input, so Spark writes the checkpoint's
    metadata and plans nothing; the leftover is added as Spark leaves it.
    """
    files = tmp_path / "in"
    files.mkdir()
    root = tmp_path / "root"
    word_pipeline(files, root).run()
    offsets = root / "_checkpoint" / "offsets"
    assert (root / "_checkpoint" / "metadata").exists()
    offsets.mkdir(exist_ok=True)
    leftover = ".0.0a760bad-6f86-4c57-815a-3312a9dbc9d3.tmp"
    for name in (leftover, f".{leftover}.crc"):
        (offsets / name).write_bytes(b"")
    write_epochs(files, EPOCHS)

    word_pipeline(files, root).run()

    assert [p.name for p in offsets.iterdir() if ".tmp" in p.name] == []
    clean = tmp_path / "clean"
    word_pipeline(write_epochs(tmp_path / "clean-in", EPOCHS), clean).run()
    snapshots, uninterrupted = Snapshots(str(root), spark), Snapshots(str(clean), spark)
    assert_same(snapshots.state(OP), uninterrupted.state(OP))
    assert_same(snapshots.sink("output"), uninterrupted.sink("output"))


@pytest.mark.parametrize("commit_mode", ["sync", "async"])
def test_a_replayed_decided_epoch_installs_the_decided_state(
    spark: SparkSession, tmp_path: Path, commit_mode: str
) -> None:
    """Spark replays epoch 1 after a crash after PREPARED, under other code: its state stays."""
    words = word_table(tmp_path / "words", EPOCHS)
    root = tmp_path / "root"
    crash = (Fault(FaultStep.AFTER_PREPARED, epoch=1),)
    first = words_pipeline(root, words, op=weighted_count(1), commit_mode=commit_mode, faults=crash)
    with pytest.raises(InjectedFault):
        first.run()
    query = words_pipeline(root, words, op=weighted_count(10), commit_mode=commit_mode).run()
    assert query.recovered_epochs == [1]

    expected = Counter(running_counts(EPOCHS[:2])[0])
    for word, count in running_counts(EPOCHS[2:])[0].items():
        expected[word] += 10 * count
    snapshots = Snapshots(str(root), spark)
    assert_same(snapshots.state(OP, 1), counts_df(spark, EPOCHS[:2]))
    assert_same(snapshots.state(OP), spark.createDataFrame(sorted(expected.items()), STATE_DDL))


def test_rollback_to_written_state_restores_the_sinks(spark: SparkSession, tmp_path: Path) -> None:
    """A write_state snapshot keeps the sinks' versions, so a rollback to it rewinds them."""
    words = word_table(tmp_path / "words", EPOCHS[:2])
    root = tmp_path / "root"
    words_pipeline(root, words).run()
    snapshots = Snapshots(str(root), spark)
    edited = snapshots.state(OP).withColumn("count", F.col("count") + 100)
    written = write_state(edited, str(root), word_count)
    word_table(tmp_path / "words", EPOCHS[2:])
    words_pipeline(root, words).run()
    sink, state = snapshots.sink("output").collect(), snapshots.state(OP).collect()

    rolled = rollback(str(root), written.epoch)
    assert_same(snapshots.sink("output", rolled.epoch), snapshots.sink("output", written.epoch))
    words_pipeline(root, words).run()  # the same input again, from the written state
    assert_same(snapshots.sink("output"), spark.createDataFrame(sink, STATE_DDL))
    assert_same(snapshots.state(OP), spark.createDataFrame(state, STATE_DDL))


def test_a_root_copied_as_a_directory_rolls_back_its_own_tables_never_the_originals(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Its manifest names the original's table locations: a rollback of the copy must go to
    the copy's own tables (state and the sink copied with it), and leave the original as it
    was; both then go on to what an uninterrupted run gives."""
    inputs = write_epochs(tmp_path / "in", EPOCHS[:3])
    root, copy = tmp_path / "root", tmp_path / "copy"
    word_pipeline(inputs, root, bronze=True).run()
    shutil.copytree(root, copy)
    tables = [root / "state" / "word_count", root / "sinks" / "word_counts"]
    before = [DeltaTable(str(t)).version() for t in tables]
    rollback(str(copy), 1)
    assert [DeltaTable(str(t)).version() for t in tables] == before
    assert_same(Snapshots(str(copy), spark).state("word_count"), counts_df(spark, EPOCHS[:2]))
    write_epochs(tmp_path / "in", EPOCHS)
    for each in (root, copy):
        word_pipeline(inputs, each, bronze=True).run()
        snapshots = Snapshots(str(each), spark)
        assert_same(snapshots.state("word_count"), counts_df(spark, EPOCHS))
        assert_same(snapshots.sink("output"), expected_sink(spark, EPOCHS))


def test_a_copied_roots_snapshots_read_its_own_tables_when_the_original_is_gone(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A root copied away (``cp -r``, ``aws s3 sync``) and the original's place reused for
    another root: every snapshot of the copy reads the copy's tables, never the new root's,
    also by a name given before the copy and after the copy is compacted."""
    root, copy = tmp_path / "root", tmp_path / "copy"
    word_pipeline(write_epochs(tmp_path / "in", EPOCHS[:3]), root, bronze=True).run()
    tag(str(root), 1, "before-copy")
    shutil.copytree(root, copy)
    shutil.rmtree(root)
    others = ["x y z", "x x", "z"]
    word_pipeline(write_epochs(tmp_path / "other", others), root, bronze=True).run()
    snapshots = Snapshots(str(copy), spark)
    assert [s.epoch for s in snapshots.list()] == [0, 1, 2]
    for epoch in range(3):
        assert_same(snapshots.state("word_count", epoch), counts_df(spark, EPOCHS[: epoch + 1]))
    assert_same(snapshots.sink("output"), expected_sink(spark, EPOCHS[:3]))
    assert_same(snapshots.state("word_count", "before-copy"), counts_df(spark, EPOCHS[:2]))
    compact(str(copy))
    assert_same(snapshots.state("word_count"), counts_df(spark, EPOCHS[:3]))
    assert_same(snapshots.sink("output"), expected_sink(spark, EPOCHS[:3]))
    assert_same(Snapshots(str(root), spark).state("word_count"), counts_df(spark, others))
