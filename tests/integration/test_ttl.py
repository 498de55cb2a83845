"""State TTL against real Spark and Delta: every snapshot is exactly the live state.

The model is plain Python: a count per key, which lapses once the watermark passes the key's
newest event at its last write plus the TTL. It reuses nothing of the project.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pyspark_abs import (
    AbsConfig,
    EpochStatus,
    Job,
    KeyGroupContext,
    KeyGroupResult,
    Operator,
    Pipeline,
    Snapshots,
    check,
    compact,
    operator,
    restore,
    rollback,
    tag,
    testing,
    vacuum,
    vectorized_operator,
    write_state,
)
from pyspark_abs.errors import InjectedFault
from pyspark_abs.examples import retry
from pyspark_abs.faults import Fault, FaultStep
from tests.support.jobs import run_streaming
from tests.support.pipelines import assert_same, event_table
from tests.support.ttl import (
    BATCHES,
    DDL,
    as_frame,
    count_words,
    forever,
    model,
    recent,
    recent_arrow,
    state_of,
    ttl_pipeline,
    watermarks_of,
)


@pytest.mark.parametrize("op", [recent, recent_arrow], ids=["per-key", "arrow"])
def test_every_snapshot_holds_exactly_the_keys_whose_ttl_has_not_lapsed_and_restore_keeps_clocks(
    spark: SparkSession, tmp_path: Path, op: Operator
) -> None:
    events, root = event_table(tmp_path / "events", BATCHES), tmp_path / "root"
    ttl_pipeline(events, root, op).run()
    snapshots = Snapshots(str(root), spark)
    expected = model(BATCHES, watermarks_of(BATCHES))
    assert [i.epoch for i in snapshots.list()] == list(range(len(expected)))
    for epoch, state in enumerate(expected):
        assert_same(state_of(snapshots, epoch), as_frame(spark, state))
    # b lapsed before its rows of batch 2 arrived: it counts from 1 again
    assert expected[2]["b"][0] == 1

    # a copy restored after batch 1 keeps the clocks and ends where the original did
    copy = tmp_path / "copy"
    restore(str(root), 1, str(copy))
    assert_same(state_of(Snapshots(str(copy), spark), 1), as_frame(spark, expected[1]))
    ttl_pipeline(events, copy, op).run()
    restored = Snapshots(str(copy), spark)
    assert_same(
        state_of(restored, restored.list()[-1].epoch), state_of(snapshots, len(expected) - 1)
    )


@pytest.mark.parametrize("before", [1, 2], ids=["watermark-0", "watermark-100"])
def test_a_ttl_added_to_a_running_operator_starts_every_keys_clock_at_the_upgrade(
    spark: SparkSession, tmp_path: Path, before: int
) -> None:
    """The clocks start at the newest snapshot's watermark, also when that is still 0."""
    events, root = str(tmp_path / "events"), tmp_path / "root"
    event_table(Path(events), BATCHES[:before])
    ttl_pipeline(events, root, forever).run()
    keys = len({w for batch in BATCHES[:before] for w, _ in batch})
    report = check(ttl_pipeline(events, root, recent))
    assert (report.exit_code, report.items[0].details) == (
        3,
        (f"ttl clocks start for {keys} key(s) without one",),
    )

    event_table(Path(events), BATCHES[before:])
    ttl_pipeline(events, root, recent).run()
    snapshots = Snapshots(str(root), spark)
    upgrade = snapshots.list()[before]
    assert f"ttl clocks started for {keys} key(s)" in (upgrade.origin or "")
    # the run after the upgrade starts its watermark at the snapshot's
    first = watermarks_of(BATCHES[:before])
    after = watermarks_of(BATCHES[before:], floor=first[before - 1])
    expected = model(BATCHES, [*first[:before], *after], ttl_from=before)
    epochs = [i.epoch for i in snapshots.list()]
    assert epochs == [*range(before), before, *range(before + 1, before + 1 + len(after))]
    for epoch, state in zip(epochs[before + 1 :], expected[before:], strict=True):
        assert_same(state_of(snapshots, epoch), as_frame(spark, state))
    assert check(ttl_pipeline(events, root, recent)).exit_code == 0


def test_a_processing_time_ttl_shorter_than_an_epoch_keeps_only_each_epochs_keys(
    spark: SparkSession, tmp_path: Path
) -> None:
    # a TTL of 1 ms lapses before the next micro-batch starts, whatever the wall clock says
    brief = operator(
        key="word",
        state_schema="count long",
        output_schema=DDL,
        name="recent",
        ttl=dt.timedelta(milliseconds=1),
    )(count_words)
    events, root = event_table(tmp_path / "events", BATCHES), tmp_path / "root"
    ttl_pipeline(events, root, brief, lambda df: df.select("word")).run()
    snapshots = Snapshots(str(root), spark)
    # the stop after the idle epoch may cut the next micro-batch short: left for recovery
    committed = [i for i in snapshots.list() if i.status is EpochStatus.COMMITTED]
    states = [snapshots.state("recent", i.epoch) for i in committed]
    for epoch, batch in enumerate(BATCHES):
        counts: dict[str, int] = {}
        for word, _ in batch:
            counts[word] = counts.get(word, 0) + 1
        expected = spark.createDataFrame(sorted(counts.items()), DDL)
        assert_same(states[epoch], expected)
    # after the input, an epoch with no rows removes every key, and the run stops idle
    assert states[len(BATCHES)].count() == 0
    assert committed[-1].state_keys == 0


@vectorized_operator(
    key="word", state_schema="emitted long", output_schema="word string, emitted long"
)
def tally(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    """How many counts the TTL stage has emitted per word."""
    seen = rows.groupby("word").size().rename("new").reset_index()
    merged = seen.merge(state, on="word", how="left")
    merged["emitted"] = merged["emitted"].fillna(0).astype("int64") + merged["new"]
    return KeyGroupResult(state=merged[["word", "emitted"]], output=merged[["word", "emitted"]])


def ttl_job(events: str, base: Path) -> Job:
    """The TTL stage at the head of a job, and a stage tallying what it emits."""
    head = ttl_pipeline(events, base / "recent", recent)
    counted = Pipeline(
        "tally",
        head.channel(),
        tally,
        root=str(base / "tally"),
        sinks=str(base / "tally" / "sink"),
        config=AbsConfig(key_groups=2, commit_mode="sync"),
    )
    return Job("ttl", str(base / "job"), [head, counted])


def test_a_ttl_stage_in_a_job_rolled_back_twice_and_started_streaming_ends_as_the_whole_job(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The rollback brings back each key's clock and the watermark with the state."""
    events = event_table(tmp_path / "events", BATCHES)
    job = ttl_job(events, tmp_path)
    job.run()
    expected = model(BATCHES, watermarks_of(BATCHES))
    head = Snapshots(str(tmp_path / "recent"), spark)
    assert_same(state_of(head, head.list()[-1].epoch), as_frame(spark, expected[-1]))
    # what the uninterrupted job ended with, kept as rows (the rollback rewinds the tables)
    whole = {
        f"{stage} {what}": spark.createDataFrame(frame.collect(), frame.schema)
        for stage in ("recent", "tally")
        for what, frame in (("sink", job.sink(stage)), ("state", job.state(stage)))
    }

    after_batch_1 = next(s.epoch for s in job.snapshots() if s.stages["recent"] == 1)
    for _ in range(2):  # the second time to the same snapshot, from before the first rollback
        job.rollback(after_batch_1)
        assert run_streaming(job) == ["tally"]  # a fresh checkpoint waits for its epoch
        # the restore epoch installs batch 1's state; the epochs after it run batches 2 and
        # 3 and the epoch without rows, where b (and later a and c) lapse as they did before
        restored = [i.epoch for i in head.list()][-len(expected) + 1 :]
        for epoch, state in zip(restored, expected[1:], strict=True):
            assert_same(state_of(head, epoch), as_frame(spark, state))
        for stage in ("recent", "tally"):
            assert_same(job.sink(stage), whole[f"{stage} sink"])
            assert_same(job.state(stage), whole[f"{stage} state"])


def test_a_ttl_savepoint_on_a_compacted_table_keeps_its_clocks_through_vacuum_and_rollback(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Compaction keeps each key's expiry, a named snapshot that reads the compacted file
    keeps it through vacuum, and the run after a rollback to it lapses keys exactly where the
    uninterrupted run did."""
    events, root = str(tmp_path / "events"), tmp_path / "root"
    event_table(Path(events), BATCHES[:2])
    ttl_pipeline(events, root, recent).run()  # epochs 0 and 1, then 2 without rows
    assert compact(str(root)), "compaction rewrote nothing: the test would prove nothing"
    event_table(Path(events), BATCHES[2:])
    ttl_pipeline(events, root, recent).run()  # epochs 3 and 4, then 5 without rows
    tag(str(root), 3, "after-batch-2")  # c's row (and expiry) is in the compacted file only
    report = vacuum(str(root), keep_last=1, min_age_seconds=0)
    assert report.deleted, "vacuum deleted nothing: the test would prove nothing"
    snapshots = Snapshots(str(root), spark)
    kept = [i.epoch for i in snapshots.list() if i.status is EpochStatus.COMMITTED]
    assert kept == [3, 5]
    expected = model(BATCHES, watermarks_of(BATCHES))
    assert_same(state_of(snapshots, 3), as_frame(spark, expected[2]))

    rollback(str(root), "after-batch-2")
    ttl_pipeline(events, root, recent).run()
    # after the restore epoch: batch 3, then the epoch without rows, where c lapses
    after = [i.epoch for i in snapshots.list()][-2:]
    for epoch, state in zip(after, expected[3:], strict=True):
        assert_same(state_of(snapshots, epoch), as_frame(spark, state))
    assert "c" in expected[3]
    assert "c" not in expected[4]


def test_state_written_with_its_expiry_lapses_by_the_written_clock(
    spark: SparkSession, tmp_path: Path
) -> None:
    """write_state keeps the ``_timeout`` it is given: an edited count lives until the
    edited expiry, and the other keys lapse as in the uninterrupted run."""
    events, root = str(tmp_path / "events"), tmp_path / "root"
    event_table(Path(events), BATCHES[:2])
    ttl_pipeline(events, root, recent).run()  # epochs 0 and 1, then 2 without rows
    snapshots = Snapshots(str(root), spark)
    state = snapshots.state("recent", with_metadata=True)
    is_c = F.col("word") == "c"
    edited = state.withColumn("count", F.when(is_c, 50).otherwise(F.col("count"))).withColumn(
        "_timeout", F.when(is_c, 150_000).otherwise(F.col("_timeout"))
    )
    write_state(edited, str(root), recent)
    event_table(Path(events), BATCHES[2:])
    ttl_pipeline(events, root, recent).run()

    expected = model(BATCHES, watermarks_of(BATCHES))
    assert "c" not in expected[4], "c lapses unedited: the test would prove nothing"
    after = [i.epoch for i in snapshots.list()][-3:]  # batches 2 and 3, the epoch without rows
    for epoch, state_then in zip(after, expected[2:], strict=True):
        assert_same(state_of(snapshots, epoch), as_frame(spark, {**state_then, "c": (50, 150)}))


@pytest.mark.parametrize(
    "zones", [("UTC", "UTC"), ("Asia/Kolkata", "America/New_York")], ids=["utc", "two-zones"]
)
def test_a_ttl_operator_on_empty_local_disks_rebuilds_every_keys_expiry(
    spark: SparkSession, tmp_path: Path, zones: tuple[str, str]
) -> None:
    """A new cluster (other, empty local disks) rebuilds the live state from the snapshot
    with each key's expiry, and lapses keys as the uninterrupted run did, also when each run
    has another session time zone (event times reach the operator as the zone's wall-clock
    times, while expiries and the watermark are instants)."""
    events, root = str(tmp_path / "events"), tmp_path / "root"
    before = spark.conf.get("spark.sql.session.timeZone") or "UTC"
    try:
        for zone, batches, disk in zip(
            zones, (BATCHES[:3], BATCHES[3:]), ("first", "second"), strict=True
        ):
            spark.conf.set("spark.sql.session.timeZone", zone)
            event_table(Path(events), batches)
            ttl_pipeline(events, root, recent, local_state_dir=str(tmp_path / disk)).run()
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    snapshots = Snapshots(str(root), spark)
    expected = model(BATCHES, watermarks_of(BATCHES))
    # b and d, written in batch 2, lapse in the last epoch, from rebuilt expiries
    assert {"b", "d"} <= set(expected[3]) - set(expected[4])
    epochs = [i.epoch for i in snapshots.list()]
    # batches 0 to 2 of the first run; batch 3 and the epoch without rows of the second
    for epoch, state in zip([*epochs[:3], *epochs[-2:]], expected, strict=True):
        assert_same(state_of(snapshots, epoch), as_frame(spark, state))


def test_a_ttl_in_a_feedback_loop_forgets_attempts_and_loses_no_retry_in_flight(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A 1 ms TTL forgets each job's attempts before its retry comes back round the loop, so
    every state write counts one attempt, while the retries in flight (not state) survive a
    crash after epoch 1 is PREPARED: every job ends once, where its attempt numbers send it."""
    jobs, root = str(tmp_path / "jobs"), tmp_path / "root"
    retry.write_jobs(jobs, 12)
    config = AbsConfig(key_groups=4, commit_mode="async")
    brief = dt.timedelta(milliseconds=1)
    crashing = replace(config, faults=(Fault(FaultStep.AFTER_PREPARED, epoch=1),))
    with pytest.raises(InjectedFault):
        retry.build(spark, jobs, str(root), config=crashing, ttl=brief).run_until_quiescent()
    assert Snapshots(str(root)).in_flight_table("retry", 0).num_rows > 0
    retry.build(spark, jobs, str(root), config=config, ttl=brief).run_until_quiescent()
    # job j succeeds on its (j % 5 + 1)-th try; the third failed try dead-letters it
    done = [(j, f"job-{j}", 1) for j in range(12) if j % 5 < 3]
    dead = [(j, f"job-{j}", 1, "service failed 1 time(s)") for j in range(12) if j % 5 >= 3]
    testing.assert_sink_equal(
        root, "done", spark.createDataFrame(done, "job_id long, payload string, attempts int")
    )
    dead_ddl = "job_id long, payload string, attempts int, error string"
    testing.assert_sink_equal(root, "dead_letter", spark.createDataFrame(dead, dead_ddl))
    assert Snapshots(str(root)).in_flight_table("retry").num_rows == 0
