"""A root that an older pyspark-abs wrote reads, continues, rolls back and restores at another
scale under this one, as a root this code wrote alone: its state with nulls, its pending timers
and its sink. The old code called the operator once per key group; a checkpoint this code
begins calls it once per shuffle partition."""

from __future__ import annotations

import tarfile
from pathlib import Path

from pyspark.sql import SparkSession

from pyspark_abs import Snapshots, restore, rollback
from tests.support.old_roots import ARCHIVE, BATCHES, OLD_BATCHES, append, pipeline, run_batches
from tests.support.pipelines import assert_same


def assert_same_roots(spark: SparkSession, old: Path, new: Path) -> None:
    ours, theirs = Snapshots(str(old / "root"), spark), Snapshots(str(new / "root"), spark)
    assert [s.epoch for s in ours.list()] == [s.epoch for s in theirs.list()]
    assert_same(ours.state("ledger"), theirs.state("ledger"))
    assert_same(ours.sink("output"), theirs.sink("output"))


def test_a_root_written_before_exact_types_continues_as_one_written_by_this_code(
    spark: SparkSession, tmp_path: Path
) -> None:
    with tarfile.open(ARCHIVE) as archive:
        archive.extractall(tmp_path / "old", filter="data")
    old, new = tmp_path / "old" / "ledger", tmp_path / "new" / "ledger"
    run_batches(new, range(OLD_BATCHES))
    assert_same_roots(spark, old, new)

    first = [s.epoch for s in Snapshots(str(old / "root"), spark).list()][-1]
    for batch in range(OLD_BATCHES, len(BATCHES)):
        for base in (old, new):
            append(base, batch)
            pipeline(base).run()
    assert_same_roots(spark, old, new)

    for base in (old, new):  # back to the old code's last epoch, and the same input again
        rollback(str(base / "root"), first)
        pipeline(base).run()
    assert_same_roots(spark, old, new)
    assert Snapshots(str(old / "root"), spark).state("ledger").where("last_amount IS NULL").count()

    # a restore of the old code's epoch at another key-group count continues the same way
    restore(str(old / "root"), first, into=str(old / "copy"))
    pipeline(old, root="copy", sink="copy-sink", key_groups=3).run()
    ours, copy = Snapshots(str(old / "root"), spark), Snapshots(str(old / "copy"), spark)
    assert_same(copy.state("ledger"), ours.state("ledger"))
    after_first = ours.sink("output").exceptAll(ours.sink("output", first))
    assert_same(copy.sink("output"), after_first)
