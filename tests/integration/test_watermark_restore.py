"""The watermark is part of the snapshot: a rolled-back or restored job drops the same late
rows and closes the same sessions as the job that was never rolled back.

Spark starts the watermark of a fresh checkpoint at 0, so without the snapshot's watermark a
row that the original run dropped as late would reopen its session after a rollback.
"""

from __future__ import annotations

from pathlib import Path

from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession

from pyspark_abs import SnapshotInfo, Snapshots, restore, rollback, write_state
from pyspark_abs.testing import assert_sink_equal
from tests.support.pipelines import event_table, session_pipeline, sessions

# Event times in seconds, one Delta version (one micro-batch) per list.
FIRST_RUN = [[("a", 100), ("b", 101)], [("a", 105)], [("c", 130)]]
# After the first run the watermark is 130 s: a@102 and b@125 are late, e@131 is not.
SECOND_RUN = [[("a", 102), ("e", 131), ("b", 125)], [("d", 150)]]


def latest(root: Path, spark: SparkSession) -> SnapshotInfo:
    info = Snapshots(str(root), spark).latest()
    assert info is not None, f"{root} has no snapshot"
    return info


def sessions_with_timers(root: Path, spark: SparkSession) -> DataFrame:
    state = Snapshots(str(root), spark).state("sessions", with_metadata=True)
    return state.select("word", "events", "_timeout")


def assert_same_sessions(root: Path, reference: Path, spark: SparkSession) -> None:
    assert_df_equality(
        sessions_with_timers(root, spark),
        sessions_with_timers(reference, spark),
        ignore_row_order=True,
    )


def test_rollback_restore_and_write_state_keep_the_watermark(
    spark: SparkSession, tmp_path: Path
) -> None:
    bronze = tmp_path / "bronze"
    events = event_table(bronze, FIRST_RUN)
    reference, rolled = tmp_path / "reference", tmp_path / "rolled"
    session_pipeline(events, reference).run()
    session_pipeline(events, rolled).run()
    end_of_first_run = latest(reference, spark)
    assert end_of_first_run.watermark_ms == 130_000
    event_table(bronze, SECOND_RUN)
    session_pipeline(events, reference).run()
    want = Snapshots(str(reference), spark)

    session_pipeline(events, rolled).run()
    rollback(str(rolled), end_of_first_run.epoch)
    session_pipeline(events, rolled).run()
    assert_same_sessions(rolled, reference, spark)
    assert_sink_equal(rolled, "output", want.sink("output"))
    assert latest(rolled, spark).watermark_ms == latest(reference, spark).watermark_ms

    copy = tmp_path / "copy"
    restore(str(reference), end_of_first_run.epoch, str(copy))
    session_pipeline(events, copy).run()
    assert_same_sessions(copy, reference, spark)
    second_run = want.sink("output").subtract(want.sink("output", end_of_first_run.epoch))
    assert_sink_equal(copy, "output", second_run)

    # write_state continues from the newest snapshot: its watermark stays in force
    edited = tmp_path / "edited"
    restore(str(reference), end_of_first_run.epoch, str(edited))
    write_state(
        Snapshots(str(edited), spark).state("sessions", with_metadata=True), str(edited), sessions
    )
    session_pipeline(events, edited).run()
    assert_same_sessions(edited, reference, spark)
