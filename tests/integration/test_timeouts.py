"""Key timeouts in a running query: they fire, emit, and are part of every snapshot."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pyspark_abs import AbsConfig, FileSource, KeyState, Operator, Pipeline, operator, write_state
from pyspark_abs.errors import SchemaMismatchError
from tests.support.pipelines import (
    SESSION_DDL,
    assert_same,
    event_table,
    session_pipeline,
    sessions,
)


def write_events(directory: Path, epochs: list[list[tuple[str, int]]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for i, events in enumerate(epochs):
        path = directory / f"events-{i:04d}.json"
        path.write_text("".join(json.dumps({"word": w, "ts": s}) + "\n" for w, s in events))
        os.utime(path, (1_700_000_000 + i * 10, 1_700_000_000 + i * 10))
    return directory


def test_event_time_timeouts_fire_after_the_watermark(spark: SparkSession, tmp_path: Path) -> None:
    # Event times in seconds; Spark drops events at or below the watermark, which starts at 0.
    batches = [[("a", 100), ("b", 101)], [("a", 105)], [("c", 130)], [("d", 131)]]
    pipeline = session_pipeline(event_table(tmp_path / "events", batches), tmp_path / "root")
    pipeline.run()
    snapshots = pipeline.snapshots
    open_at_2 = snapshots.state("sessions", 2, with_metadata=True).select(
        "word", "events", "_timeout"
    )
    assert_same(
        open_at_2,
        spark.createDataFrame(
            [("a", 2, 115_000), ("b", 1, 111_000), ("c", 1, 140_000)],
            "word string, events long, _timeout long",
        ),
    )
    # Epoch 3 runs with the watermark at 130 s: the sessions of a and b close.
    assert snapshots.get(3).watermark_ms == 130_000
    assert_same(
        snapshots.state("sessions", 3),
        spark.createDataFrame([("c", 1), ("d", 1)], "word string, events long"),
    )
    closed = snapshots.sink("output").where("closed")
    assert_same(closed, spark.createDataFrame([("a", 2, True), ("b", 1, True)], SESSION_DDL))

    # The edit pattern keeps the timers: read with metadata, change a column, write back.
    root = str(tmp_path / "root")
    read = snapshots.state("sessions", 3, with_metadata=True)
    write_state(read.withColumn("events", F.col("events") + 10), root, sessions)
    timers = spark.createDataFrame(
        [("c", 11, 140_000), ("d", 11, 141_000)], "word string, events long, _timeout long"
    )
    edited = snapshots.state("sessions", with_metadata=True).select("word", "events", "_timeout")
    assert_same(edited, timers)
    # ... and the edited sessions still close when the watermark passes their timers.
    event_table(tmp_path / "events", [[("e", 200)]])
    pipeline.run()
    closed = snapshots.sink("output").where("closed")
    assert_same(
        closed,
        spark.createDataFrame(
            [("a", 2, True), ("b", 1, True), ("c", 11, True), ("d", 11, True)], SESSION_DDL
        ),
    )
    with pytest.raises(SchemaMismatchError, match=r"no '_timeout' column, but the operator"):
        write_state(snapshots.state("sessions", 3), root, sessions)
    write_state(read, root, sessions, clear_timeouts=True)
    cleared = snapshots.state("sessions", with_metadata=True).select("word", "events", "_timeout")
    assert_same(
        cleared,
        timers.withColumn("events", F.lit(1).cast("long")).withColumn(
            "_timeout", F.lit(None).cast("long")
        ),
    )


@operator(
    key="word", state_schema="events long", output_schema=SESSION_DDL, timeout="processing_time"
)
def idle(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
    if state.has_timed_out:
        events = state.get()["events"]
        state.remove()
        return {"word": key[0], "events": events, "closed": True}
    state.update({"events": state.get({"events": 0})["events"] + len(rows)})
    state.set_timeout_duration(1)
    return None


def test_processing_time_timeouts_fire_in_a_later_epoch(
    spark: SparkSession, tmp_path: Path
) -> None:
    inputs = write_events(tmp_path / "in", [[("a", 0), ("b", 0)], [("a", 1)], [("c", 2)]])
    events = (
        spark.readStream.schema("word string, ts long")
        .option("maxFilesPerTrigger", 1)
        .json(str(inputs))
    )
    pipeline = Pipeline(
        "idle",
        events,
        idle,
        root=str(tmp_path / "root"),
        sinks=str(tmp_path / "sink"),
        config=AbsConfig(key_groups=4),
    )
    pipeline.run()  # stops at the first micro-batch with no input and no change
    snapshots = pipeline.snapshots
    # No-data micro-batches that fire no timeout change nothing and are not recorded.
    assert all(info.rows for info in snapshots.list()[3:])
    assert_same(
        snapshots.sink("output", 1),
        spark.createDataFrame([("b", 1, True)], SESSION_DDL),
    )
    assert_same(
        snapshots.sink("output", 2),
        spark.createDataFrame([("b", 1, True), ("a", 2, True)], SESSION_DDL),
    )
    [open_key] = snapshots.state("idle", 2, with_metadata=True).collect()
    assert open_key["word"] == "c"
    recorded = snapshots.get(2).recorded_at.timestamp() * 1000
    assert abs(open_key["_timeout"] - recorded) < 60_000


@operator(
    key="word",
    state_schema="events long",
    output_schema="word string, events long",
    ttl=dt.timedelta(minutes=10),
    name="kept",
)
def kept(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
    events = state.get({"events": 0})["events"] + len(rows)
    state.update({"events": events})
    return {"word": key[0], "events": events}


@pytest.mark.parametrize("operator_", [idle, kept], ids=["timeout", "ttl"])
def test_a_run_reads_what_landed_even_after_a_batch_the_last_run_left_planned(
    spark: SparkSession, tmp_path: Path, operator_: Operator
) -> None:
    """A run of an operator with processing-time timeouts (or a TTL) stops at its first
    micro-batch that reads nothing; a stop can leave the next micro-batch planned, which the
    next run replays first, with no input. That replay must not end the next run before it
    read what landed (it did, in 1 to 2 of 4 runs, as the uninterrupted state shows here)."""
    inputs = tmp_path / "in"
    root = tmp_path / "root"

    def pipeline() -> Pipeline:
        return Pipeline(
            "landing",
            FileSource(str(inputs), "json", schema="word string, ts long"),
            operator_,
            root=str(root),
            sinks=str(tmp_path / "sink"),
            config=AbsConfig(key_groups=4, commit_mode="sync"),
        )

    landed: list[list[tuple[str, int]]] = []
    for i in range(3):
        landed.append([(f"w{i}", i)])
        write_events(inputs, landed)
        offsets = root / "_checkpoint" / "offsets"
        if offsets.exists():
            last = max(int(p.name) for p in offsets.iterdir() if p.name.isdigit())
            if (root / "_checkpoint" / "commits" / str(last)).exists():
                # what a stop right after Spark planned the next batch leaves
                shutil.copy(offsets / str(last), offsets / str(last + 1))
        pipeline().run()
        snapshots = pipeline().snapshots
        # a timed-out key has left the state for the sink: together they hold every word read
        read = snapshots.state(operator_.name).select("word")
        read = read.union(snapshots.sink("output").select("word")).distinct()
        expected = spark.createDataFrame([(f"w{j}",) for j in range(i + 1)], "word string")
        assert_same(read, expected)
