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


def test_a_run_continued_from_inside_a_run_drops_and_closes_what_the_original_did(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Spark moves the watermark after each batch: the epoch after the one rolled back to ran
    with a higher watermark (120 s) than that epoch's own (100 s), and judged its rows late
    against that epoch's. A continued run does both the same."""
    # f@115 in the fourth batch is late (the third ran with 120 s), c@112 in the third is not
    # (the second ran with 100 s); a's session (timeout 110 s) closes in the third batch
    batches = [[("a", 100)], [("b", 120)], [("c", 112), ("d", 125)], [("f", 115), ("e", 140)]]
    events = event_table(tmp_path / "bronze", batches)
    reference, rolled, copy = tmp_path / "reference", tmp_path / "rolled", tmp_path / "copy"
    session_pipeline(events, reference).run()
    want = Snapshots(str(reference), spark)
    assert [(i.epoch, i.watermark_ms) for i in want.list()][:3] == [
        (0, 0),
        (1, 100_000),
        (2, 120_000),
    ]
    session_pipeline(events, rolled).run()
    rollback(str(rolled), 1)
    session_pipeline(events, rolled).run()
    assert_same_sessions(rolled, reference, spark)
    assert_sink_equal(rolled, "output", want.sink("output"))

    restore(str(reference), 1, str(copy))  # the copy's epochs keep the reference's numbers
    session_pipeline(events, copy).run()
    assert_same_sessions(copy, reference, spark)
    got = Snapshots(str(copy), spark)
    assert [(i.epoch, i.watermark_ms) for i in got.list()] == [
        (i.epoch, i.watermark_ms) for i in want.list() if i.epoch >= 1
    ]
    for epoch in range(2, want.latest().epoch + 1):  # type: ignore[union-attr]
        assert_sink_equal(
            copy, "output", want.sink("output", epoch).subtract(want.sink("output", 1)), epoch=epoch
        )
