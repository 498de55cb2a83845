"""One call of the operator per shuffle partition and epoch, however many key groups it holds.

A new checkpoint groups its key groups into one slot per shuffle partition; Spark calls the
operator once per slot, and each key group keeps its own state, snapshot rows and timeout.
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pyspark_abs import KeyGroupContext, KeyGroupResult, vectorized_operator
from pyspark_abs.examples.wordcount import word_count
from pyspark_abs.operators.partitioning import murmur3_int, slot_values
from tests.support.inputs import write_epochs
from tests.support.pipelines import STATE_DDL, assert_word_counts, word_pipeline
from tests.support.versions import shuffle_partitions


def test_spark_sends_each_slot_to_a_partition_of_its_own(spark: SparkSession) -> None:
    values = spark.range(-3000, 3000).select(F.col("id").cast("int").alias("v"))
    hashed = values.select("v", F.hash("v").alias("h")).collect()
    assert [murmur3_int(r.v) for r in hashed] == [r.h for r in hashed]
    for slots in (2, 4, 7):
        slot = spark.createDataFrame([(v,) for v in slot_values(slots)], "v int")
        placed = slot.repartition(slots, "v").select("v", F.spark_partition_id().alias("p"))
        where = {r.v: r.p for r in placed.collect()}
        assert [where[v] for v in slot_values(slots)] == list(range(slots))


def calls_logged_in(folder: Path) -> Counter[int]:
    """Calls of the operator per epoch, as the operator below logged them."""
    return Counter(int(p.read_text().split()[0]) for p in folder.iterdir())


def test_one_call_serves_every_key_group_of_a_partition(
    spark: SparkSession, tmp_path: Path
) -> None:
    calls = tmp_path / "calls"
    calls.mkdir()
    groups_seen = tmp_path / "groups"
    groups_seen.mkdir()

    @vectorized_operator(
        key="word", state_schema="count long", output_schema=STATE_DDL, name="word_count"
    )
    def logged(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
        call = uuid.uuid4().hex
        (calls / call).write_text(f"{ctx.epoch}")
        (groups_seen / call).write_text(f"{len(ctx.key_groups) or 1}")
        return word_count.function(rows, state, ctx)  # type: ignore[return-value]

    words = [f"w{i}" for i in range(200)]
    epochs = [" ".join(words[i::3]) for i in range(3)]
    inputs = write_epochs(tmp_path / "in", epochs)
    with shuffle_partitions(spark, 2):
        word_pipeline(inputs, tmp_path / "root", op=logged, key_groups=64).run()
    assert_word_counts(spark, tmp_path / "root", epochs)
    per_epoch = calls_logged_in(calls)
    assert sorted(per_epoch) == [0, 1, 2]
    assert max(per_epoch.values()) <= 2
    assert max(int(p.read_text()) for p in groups_seen.iterdir()) > 16

    # Restarted with another shuffle-partition setting, the checkpoint keeps its slots.
    more = [" ".join(words[i::5]) for i in range(2)]
    write_epochs(inputs, more, first=len(epochs))
    with shuffle_partitions(spark, 5):
        word_pipeline(inputs, tmp_path / "root", op=logged, key_groups=64).run()
    assert_word_counts(spark, tmp_path / "root", [*epochs, *more])
    per_epoch = calls_logged_in(calls)
    assert sorted(per_epoch) == [0, 1, 2, 3, 4]
    assert max(per_epoch.values()) <= 2
