"""Several timers per key against real Spark and Delta, checked against a plain-Python model.

The model keeps each key's count and set of timers. A timer fires in the first micro-batch
whose watermark is past it (the watermark of a batch is the newest event time before it),
and once more after the last batch, when Spark runs a batch without data for the final
watermark. It reuses nothing of the project.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pyspark_abs import (
    AbsConfig,
    DeltaSource,
    EpochStatus,
    KeyState,
    Operator,
    Pipeline,
    StateEvolution,
    operator,
    rollback,
    write_state,
)
from pyspark_abs.errors import StateEvolutionError
from tests.support.docs import run_block
from tests.support.pipelines import assert_same, event_table, session_pipeline
from tests.support.timers import remind

FIRST_MS, SECOND_MS = 5_000, 20_000
OUTPUT = "word string, timer long"
STATE = "word string, count long, _timers array<bigint>"


@operator(
    key="word",
    state_schema="count long",
    output_schema=OUTPUT,
    timeout="event_time",
    timers=True,
    name="reminders",
)
def reminders(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
    times = [int(pd.Timestamp(ts).value // 1_000_000) for ts in rows["ts"]]
    fired = remind(state, times, FIRST_MS, SECOND_MS, 7_000)
    return [{"word": key[0], "timer": t} for t in fired]


@operator(
    key="word",
    state_schema="count long",
    output_schema=OUTPUT,
    timeout="event_time",
    name="reminders",
)
def one_timeout(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
    """The version before timers: one timeout per key, FIRST_MS after its newest event."""
    if state.has_timed_out:
        state.remove()
        return {"word": key[0], "timer": state.timeout_ms}
    state.update({"count": state.get({"count": 0})["count"] + len(rows)})
    newest = int(pd.to_datetime(rows["ts"], utc=True).max().timestamp() * 1000)
    state.set_timeout_timestamp(newest + FIRST_MS)
    return None


class Model:
    def __init__(self) -> None:
        self.keys: dict[str, tuple[int, set[int]]] = {}
        self.fired: list[tuple[str, int]] = []
        self.watermark_s = 0

    def batch(self, events: list[tuple[str, int]]) -> None:
        watermark = self.watermark_s * 1000
        by_key: dict[str, list[int]] = {}
        for word, s in events:
            by_key.setdefault(word, []).append(s * 1000)
        due = {
            w for w, (_, timers) in self.keys.items() if min(timers, default=watermark) < watermark
        }
        for word in set(by_key) | due:
            count, timers = self.keys.get(word, (0, set()))
            gone = {t for t in timers if t < watermark}
            self.fired += [(word, t) for t in gone]
            timers = timers - gone
            for ms in by_key.get(word, []):
                timers |= {ms + FIRST_MS, ms + SECOND_MS}
                if (ms // 1000) % 7 == 0:
                    timers = {t for t in timers if t <= ms + FIRST_MS}
            if word in by_key or timers:
                self.keys[word] = (count + len(by_key.get(word, [])), timers)
            else:
                del self.keys[word]
        self.watermark_s = max([self.watermark_s, *(s for _, s in events)])

    def run(self, batches: list[list[tuple[str, int]]]) -> None:
        for events in batches:
            self.batch(events)
        self.batch([])  # Spark's batch without data for the final watermark

    def state(self) -> list[tuple[str, int, list[int]]]:
        return [(w, c, sorted(t)) for w, (c, t) in self.keys.items()]


def random_batches(seed: int, count: int, start_s: int) -> list[list[tuple[str, int]]]:
    rng = random.Random(seed)
    newest, batches = start_s, []
    for _ in range(count):
        events = [
            (rng.choice("abc"), newest + rng.randrange(1, 30)) for _ in range(rng.randrange(1, 4))
        ]
        newest = max(s for _, s in events)
        batches.append(events)
    return batches


def timer_pipeline(events: str, root: Path, op: Operator = reminders) -> Pipeline:
    return session_pipeline(events, root, op, name="reminders")


def check_against(spark: SparkSession, pipeline: Pipeline, model: Model) -> None:
    snapshots = pipeline.snapshots
    assert_same(snapshots.sink("output"), spark.createDataFrame(model.fired, OUTPUT))
    assert_same(snapshots.state("reminders"), spark.createDataFrame(model.state(), STATE))
    timeouts = snapshots.state("reminders", with_metadata=True).select(
        "word", F.array_min("_timers").alias("earliest"), "_timeout"
    )
    assert timeouts.where("earliest <=> _timeout").count() == timeouts.count()


def test_timers_fire_as_the_model_says_through_a_rollback_and_a_write_state(
    spark: SparkSession, tmp_path: Path
) -> None:
    batches = random_batches(seed=7, count=6, start_s=100)
    events = event_table(tmp_path / "events", batches)
    root = tmp_path / "root"
    pipeline = timer_pipeline(events, root)
    pipeline.run()
    model = Model()
    model.run(batches)
    assert model.fired, "the schedule fires no timer: the test would prove nothing"
    check_against(spark, pipeline, model)

    # A rollback to epoch 2 and a rerun give what the uninterrupted run gave.
    rollback(str(root), 2)
    pipeline.run()
    check_against(spark, pipeline, model)

    # State written back as read keeps every key's timers, and they go on firing.
    restored = write_state(pipeline.snapshots.state("reminders"), str(root), reminders)
    assert pipeline.snapshots.get(restored.epoch).status is EpochStatus.RESTORED
    later = random_batches(seed=8, count=2, start_s=model.watermark_s)
    event_table(tmp_path / "events", later)
    pipeline.run()
    model.run(later)
    check_against(spark, pipeline, model)


def test_a_single_timeout_becomes_a_timer_when_timers_are_turned_on(
    spark: SparkSession, tmp_path: Path
) -> None:
    events = event_table(tmp_path / "events", [[("a", 100)]])
    root = tmp_path / "root"
    timer_pipeline(events, root, one_timeout).run()
    event_table(tmp_path / "events", [[("b", 200)]])
    pipeline = timer_pipeline(events, root)
    pipeline.run()  # no evolution rules: _timers is added, and a's timeout is its one timer
    snapshots = pipeline.snapshots
    assert_same(snapshots.sink("output"), spark.createDataFrame([("a", 105_000)], OUTPUT))
    assert_same(
        snapshots.state("reminders"),
        spark.createDataFrame([("b", 1, [205_000, 220_000])], STATE),
    )

    # Back to one timeout: the rule is asked for, and each key keeps its earliest timer.
    with pytest.raises(StateEvolutionError, match=r"dropped=\['_timers'\]"):
        timer_pipeline(events, root, one_timeout).run()
    dropped = StateEvolution(dropped=["_timers"])
    event_table(tmp_path / "events", [[("c", 300)]])
    back = timer_pipeline(events, root, replace(one_timeout, evolution=dropped))
    back.run()
    assert_same(
        back.snapshots.sink("output"),
        spark.createDataFrame([("a", 105_000), ("b", 205_000)], OUTPUT),
    )
    state = back.snapshots.state("reminders", with_metadata=True).select("word", "_timeout")
    assert_same(state, spark.createDataFrame([("c", 305_000)], "word string, _timeout long"))


class CartModel:
    """The documentation's cart reminders: an hour and a day after each add, until a checkout."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[int, set[int]]] = {}
        self.reminders: list[tuple[str, int]] = []
        self.watermark_s = 0

    def batch(self, events: list[tuple[str, str, int]]) -> None:
        watermark = self.watermark_s * 1000
        by_user: dict[str, list[tuple[int, str]]] = {}
        for user, action, s in events:
            by_user.setdefault(user, []).append((s, action))
        due = {u for u, (_, timers) in self.keys.items() if any(t < watermark for t in timers)}
        for user in set(by_user) | due:
            cart, timers = self.keys.get(user, (0, set()))
            self.reminders += [(user, t) for t in timers if t < watermark]
            timers = {t for t in timers if t >= watermark}
            for s, action in sorted(by_user.get(user, [])):
                if action == "add":
                    cart, timers = cart + 1, timers | {(s + 3600) * 1000, (s + 86400) * 1000}
                else:
                    cart, timers = 0, set()
            if cart or timers:
                self.keys[user] = (cart, timers)
            else:
                self.keys.pop(user, None)
        self.watermark_s = max([self.watermark_s, *(s for _, _, s in events)])


def test_the_readme_cart_reminders_fire_as_the_model_says(
    spark: SparkSession, tmp_path: Path
) -> None:
    ns: dict[str, Any] = {"operator": operator, "pd": pd}
    run_block("def carts(key, rows, state):", ns, {})
    rng = random.Random(3)
    clock, batches = 1_800_000_000, []
    for _ in range(6):
        batch = []
        for _ in range(rng.randrange(1, 5)):
            clock += rng.randrange(600, 40_000)
            batch.append(
                (rng.choice(["ann", "bob"]), rng.choice(["add", "add", "checkout"]), clock)
            )
        batches.append(batch)
    events = str(tmp_path / "carts")
    for batch in batches:
        users, actions, seconds = (list(c) for c in zip(*batch, strict=True))
        table = pa.table({"user": users, "action": actions, "ts": pa.array(seconds, pa.int64())})
        write_deltalake(events, table, mode="append")
    pipeline = Pipeline(
        "carts",
        DeltaSource(events, max_files_per_trigger=1),
        ns["carts"],
        root=str(tmp_path / "root"),
        sinks=str(tmp_path / "sink"),
        config=AbsConfig(key_groups=4, commit_mode="sync"),
        transform=lambda df: df.selectExpr(
            "user", "action", "timestamp_seconds(ts) AS ts"
        ).withWatermark("ts", "0 seconds"),
    )
    pipeline.run()
    model = CartModel()
    for batch in [*batches, []]:
        model.batch(batch)
    assert model.reminders, "the schedule fires no reminder: the test would prove nothing"
    reminders = pipeline.snapshots.sink("output").select(
        "user", F.unix_millis("reminder").alias("ms")
    )
    assert_same(reminders, spark.createDataFrame(model.reminders, "user string, ms long"))
    state = pipeline.snapshots.state("carts").select("user", "cart", F.size("_timers").alias("n"))
    expected = [(u, c, len(t)) for u, (c, t) in model.keys.items()]
    assert_same(state, spark.createDataFrame(expected, "user string, cart long, n int"))
