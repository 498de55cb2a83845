"""The documentation's tumbling and session windows against real Spark and Delta.

Each run is checked against the plain model in ``tests.support.windows_model``: the windows
the sink holds, and the open windows (and timeouts) the state holds, after a run, after a
rollback and rerun, and in a copy restored at another key-group count that reads on.
"""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pyspark_abs import (
    AbsConfig,
    DeltaSource,
    Job,
    KeyGroupResult,
    Operator,
    Pipeline,
    StateEvolution,
    restore,
    rollback,
    tumbling_window,
    vectorized_operator,
)
from pyspark_abs.errors import OperatorDefinitionError, StateEvolutionError
from tests.support.docs import run_block
from tests.support.pipelines import assert_same
from tests.support.windows_model import Model

SINK = "user string, start long, end long, clicks long, paid long, spent double, biggest double"
STATE = (
    "user string, window_start array<bigint>, window_end array<bigint>, clicks array<bigint>, "
    "paid array<bigint>, spent array<double>, biggest array<double>"
)
Event = tuple[str | None, int, float | None]


def readme_windows() -> dict[str, Any]:
    ns: dict[str, Any] = {}
    run_block("spend_per_5m = tumbling_window(", ns, {})
    return ns


def batches(rng: random.Random, count: int, watermark_s: int, *, late: bool) -> list[list[Event]]:
    """Events in seconds after the watermark, and with ``late`` some before it."""
    out = []
    for _ in range(count):
        batch: list[Event] = []
        for _ in range(rng.randrange(1, 5)):
            before = late and rng.random() < 0.25
            at = (
                watermark_s - rng.randrange(1, 600)
                if before
                else watermark_s + rng.randrange(1, 2400)
            )
            batch.append((rng.choice(["ann", "bob", None]), at, rng.choice([None, 1.0, 2.5, 10.0])))
        watermark_s = max([watermark_s, *(t for _, t, _ in batch)])
        out.append(batch)
    return out


def append(path: Path, events: list[list[Event]]) -> None:
    for batch in events:
        users, seconds, amounts = (list(c) for c in zip(*batch, strict=True))
        table = pa.table(
            {
                "user": pa.array(users, pa.string()),
                "ts": pa.array(seconds, pa.int64()),
                "amount": pa.array(amounts, pa.float64()),
            }
        )
        write_deltalake(str(path), table, mode="append")


def feed(model: Model, events: list[list[Event]], watermark_s: int) -> tuple[list[Any], int]:
    """Run the model over the batches and Spark's last batch without data."""
    closed: list[Any] = []
    for batch in [*events, []]:
        closed += model.epoch([(u, t * 1000, a) for u, t, a in batch], watermark_s * 1000)
        watermark_s = max([watermark_s, *(t for _, t, _ in batch)])
    return closed, watermark_s


def window_pipeline(
    events: Path, root: Path, op: Operator, key_groups: int, sinks: str = "sink"
) -> Pipeline:
    return Pipeline(
        "windows",
        DeltaSource(str(events), max_files_per_trigger=1),
        op,
        root=str(root),
        sinks=str(root / sinks),
        config=AbsConfig(key_groups=key_groups, commit_mode="sync"),
        transform=lambda df: df.selectExpr(
            "user", "timestamp_seconds(ts) AS ts", "amount"
        ).withWatermark("ts", "0 seconds"),
    )


def sink_rows(frame: Any) -> Any:
    return frame.select(
        "user",
        F.unix_millis("window_start").alias("start"),
        F.unix_millis("window_end").alias("end"),
        "clicks",
        "paid",
        "spent",
        "biggest",
    )


def check(
    spark: SparkSession, pipeline: Pipeline, op: Operator, closed: list[Any], model: Model
) -> None:
    snapshots = pipeline.snapshots
    assert_same(sink_rows(snapshots.sink("output")), spark.createDataFrame(closed, SINK))
    state = snapshots.state(op.name, with_metadata=True).select(
        "user", "window_start", "window_end", "clicks", "paid", "spent", "biggest", "_timeout"
    )
    assert_same(state, spark.createDataFrame(model.state(), f"{STATE}, _timeout long"))


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ("user, timestamp_seconds(ts) AS at, amount", r"no column\(s\) \['ts'\]"),
        ("user, timestamp_seconds(ts) AS ts, CAST(amount AS string) AS amount", "not a number"),
    ],
)
def test_a_source_that_does_not_fit_the_windows_is_refused_before_anything_runs(
    spark: SparkSession, tmp_path: Path, columns: str, message: str
) -> None:
    append(tmp_path / "events", [[("ann", 1_800_000_000, 1.0)]])
    watermarked = "at" if " at," in columns else "ts"
    for kind in ("spend_per_5m", "visits"):
        op = readme_windows()[kind]
        with pytest.raises(
            OperatorDefinitionError, match=f"pipeline 'windows': operator.*{message}"
        ):
            Pipeline(
                "windows",
                DeltaSource(str(tmp_path / "events")),
                op,
                root=str(tmp_path / "root"),
                sinks=str(tmp_path / "sink"),
                transform=lambda df: df.selectExpr(*columns.split(", ")).withWatermark(
                    watermarked, "0 seconds"
                ),
            )
    assert not (tmp_path / "root").exists()


def test_windows_over_a_column_without_the_watermark_are_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    append(tmp_path / "events", [[("ann", 1_800_000_000, 1.0)]])
    with pytest.raises(OperatorDefinitionError, match=r"the source's watermark is on 'seen'"):
        Pipeline(
            "windows",
            DeltaSource(str(tmp_path / "events")),
            readme_windows()["visits"],
            root=str(tmp_path / "root"),
            sinks=str(tmp_path / "sink"),
            transform=lambda df: df.selectExpr(
                "user", "timestamp_seconds(ts) AS ts", "timestamp_seconds(ts) AS seen", "amount"
            ).withWatermark("seen", "0 seconds"),
        )


@pytest.mark.parametrize("kind", ["spend_per_5m", "visits"])
def test_windows_match_the_model_through_rollback_and_a_restore_at_another_scale(
    spark: SparkSession, tmp_path: Path, kind: str
) -> None:
    op: Operator = readme_windows()[kind]
    rng = random.Random(11)
    # late rows before and after the epoch rolled back to
    first = batches(rng, 6, 1_800_000_000, late=True)
    newest = [max(t for _, t, _ in batch) for batch in first]
    assert any(t < max(newest[:i]) for i in (1, 2) for _, t, _ in first[i]), "no late row"
    assert any(t < max(newest[:i]) for i in (3, 4, 5) for _, t, _ in first[i]), "no late row"
    append(tmp_path / "events", first)
    model = Model(kind == "visits", (30 if kind == "visits" else 5) * 60_000)
    closed, watermark_s = feed(model, first, 0)
    assert closed, "the schedule closes no window: the test would prove nothing"
    assert model.open, "the schedule leaves no window open: the rollback would prove little"
    root = tmp_path / "root"
    pipeline = window_pipeline(tmp_path / "events", root, op, key_groups=4)
    pipeline.run()
    check(spark, pipeline, op, closed, model)

    rollback(str(root), 2)
    pipeline.run()
    check(spark, pipeline, op, closed, model)  # as the uninterrupted run

    restored = tmp_path / "restored"
    latest = pipeline.snapshots.latest()
    assert latest is not None
    restore(str(root), latest.epoch, str(restored))
    more = batches(rng, 3, watermark_s, late=False)
    append(tmp_path / "events", more)
    copy = window_pipeline(tmp_path / "events", restored, op, key_groups=8)
    copy.run()
    later, _ = feed(model, more, watermark_s)
    check(spark, copy, op, later, model)  # a restored copy's sinks start empty


def test_an_aggregate_added_later_counts_what_came_after_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    start = 1_800_000_000 - 1_800_000_000 % 300
    events = tmp_path / "events"
    append(events, [[("ann", start + 10, 2.0)]])

    def version(aggregates: dict[str, str], evolution: StateEvolution | None) -> Pipeline:
        op = tumbling_window(
            key={"user": "string"},
            time="ts",
            size=dt.timedelta(minutes=5),
            aggregates=aggregates,
            name="w",
            evolution=evolution,
        )
        # a sink with another schema is a new table
        sinks = "sink-v2" if "spent" in aggregates else "sink"
        return window_pipeline(events, tmp_path / "root", op, key_groups=4, sinks=sinks)

    version({"clicks": "count(*)"}, None).run()
    both = {"clicks": "count(*)", "spent": "sum(amount)"}
    with pytest.raises(StateEvolutionError, match="spent"):
        version(both, None).run()
    append(events, [[("ann", start + 20, 3.0)], [("bob", start + 400, 1.0)]])
    pipeline = version(both, StateEvolution(added={"spent": None}))
    pipeline.run()
    closed = pipeline.snapshots.sink("output").select(
        "user", F.unix_seconds("window_start").alias("start"), "clicks", "spent"
    )
    expected = [("ann", start, 2, 3.0)]  # ann's window saw 2.0 before spent existed
    assert_same(
        closed,
        spark.createDataFrame(expected, "user string, start long, clicks long, spent double"),
    )
    state = pipeline.snapshots.state("w").select("user", "window_start", "clicks", "spent")
    open_ = [("bob", [(start + 300) * 1000], [1], [1.0])]
    schema = "user string, window_start array<bigint>, clicks array<bigint>, spent array<double>"
    assert_same(state, spark.createDataFrame(open_, schema))


def test_a_window_stage_of_a_job_rolls_back_with_the_job(
    spark: SparkSession, tmp_path: Path
) -> None:
    visits: Operator = readme_windows()["visits"]
    rng = random.Random(5)
    first = batches(rng, 4, 1_800_000_000, late=False)
    append(tmp_path / "events", first)
    closed_schema = ", ".join(
        f"{name} {kind}"
        for name, kind in [
            ("user", "string"),
            ("window_start", "timestamp"),
            ("window_end", "timestamp"),
            ("clicks", "long"),
            ("paid", "long"),
            ("spent", "double"),
            ("biggest", "double"),
        ]
    )

    @vectorized_operator(key="user", output_schema=closed_schema, name="archive")
    def archive(rows: Any, state: Any, ctx: Any) -> KeyGroupResult:
        return KeyGroupResult(output=rows)

    sessions = window_pipeline(tmp_path / "events", tmp_path / "visits", visits, key_groups=4)
    archived = Pipeline(
        "archive",
        sessions.channel(),
        archive,
        root=str(tmp_path / "archive"),
        sinks=str(tmp_path / "archive" / "sink"),
        config=AbsConfig(key_groups=2, commit_mode="sync"),
    )
    job = Job("visits", root=str(tmp_path / "job"), stages=[sessions, archived])
    job.run()
    model = Model(True, 30 * 60_000)
    closed, _ = feed(model, first, 0)
    assert closed, "the schedule closes no session: the test would prove nothing"
    expected = spark.createDataFrame(closed, SINK)
    assert_same(sink_rows(job.sink("archive")), expected)
    job.rollback(1)
    job.run()  # as the uninterrupted job
    assert_same(sink_rows(job.sink("archive")), expected)
    state = job.state("windows").select(
        "user", "window_start", "window_end", "clicks", "paid", "spent", "biggest"
    )
    assert_same(state, spark.createDataFrame([r[:-1] for r in model.state()], STATE))
