"""Helpers for integration tests: word-count pipelines over real Spark and Delta tables."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable, Sequence
from functools import reduce
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
from chispa import assert_df_equality
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pyspark_abs import (
    AbsConfig,
    DeltaSource,
    KeyGroupContext,
    KeyGroupResult,
    KeyState,
    Operator,
    Pipeline,
    Snapshots,
    operator,
    vectorized_operator,
)
from pyspark_abs.examples import wordcount
from pyspark_abs.manifest.entries import SNAPSHOT_STATUSES
from tests.support.inputs import running_counts

STATE_DDL = "word string, count long"
SESSION_DDL = "word string, events long, closed boolean"
GAP_MS = 10_000


@operator(key="word", state_schema="count long", output_schema=STATE_DDL, name="word_count")
def word_count_per_key(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
    count = state.get({"count": 0})["count"] + len(rows)
    state.update({"count": count})
    return {"word": key[0], "count": count}


@operator(
    key="word",
    state_schema="count long",
    output_schema=f"{STATE_DDL}, frozen long",
    name="word_count",
)
def word_count_seeing_the_heap(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
    """The word count, each output row with the objects its worker's heap had frozen."""
    count = state.get({"count": 0})["count"] + len(rows)
    state.update({"count": count})
    return {"word": key[0], "count": count, "frozen": gc.get_freeze_count()}


def word_pipeline(
    input_dir: Path,
    root: Path,
    *,
    op: Operator = wordcount.word_count,
    bronze: bool = False,
    **config: Any,
) -> Pipeline:
    """The example word count over ``input_dir`` with small key-group counts for speed.

    Spark's own text source reads the files (a ``SparkFileSource``); with ``bronze``, a
    ``DeltaSource`` reads them from a bronze Delta table (see :func:`bronze_table`).
    """
    settings: dict[str, Any] = {"key_groups": 8, "commit_mode": "sync"}
    settings.update(config)
    if not bronze:
        return wordcount.build(str(input_dir), str(root), config=AbsConfig(**settings), operator=op)
    return Pipeline(
        "wordcount",
        DeltaSource(bronze_table(input_dir), max_files_per_trigger=1),
        op,
        root=str(root),
        sinks={"output": f"{root}/sinks/word_counts"},
        config=AbsConfig(**settings),
        transform=wordcount.words_of,
    )


def bronze_table(input_dir: Path) -> str:
    """A Delta table beside ``input_dir`` with one version per text file, in reading order.

    Files that are not in the table yet are appended (one ``value`` row per line), as a
    landing job would.
    """
    table = f"{input_dir}-bronze"
    landed = DeltaTable(table).version() + 1 if DeltaTable.is_deltatable(table) else 0
    for path in wordcount.input_files(str(input_dir))[landed:]:
        lines = path.read_text().splitlines()
        write_deltalake(table, pa.table({"value": pa.array(lines, pa.string())}), mode="append")
    return table


@operator(key="word", state_schema="events long", output_schema=SESSION_DDL, timeout="event_time")
def sessions(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
    """Sessions per word with an event-time gap of ``GAP_MS``: emitted open and when closed."""
    if state.has_timed_out:
        events = state.get()["events"]
        state.remove()
        return {"word": key[0], "events": events, "closed": True}
    events = state.get({"events": 0})["events"] + len(rows)
    state.update({"events": events})
    last = int(pd.to_datetime(rows["ts"], utc=True).max().timestamp() * 1000)
    state.set_timeout_timestamp(last + GAP_MS)
    return {"word": key[0], "events": events, "closed": False}


def event_table(path: Path, batches: Sequence[Sequence[tuple[str, int]]]) -> str:
    """Append ``(word, seconds)`` events to a Delta table, one version per batch."""
    for batch in batches:
        words, seconds = zip(*batch, strict=True)
        table = pa.table(
            {"word": pa.array(words, pa.string()), "ts": pa.array(seconds, pa.int64())}
        )
        write_deltalake(str(path), table, mode="append")
    return str(path)


def with_event_time(df: DataFrame) -> DataFrame:
    """An :func:`event_table`'s rows as ``(word, ts)`` with event time ``ts``, watermark delay 0."""
    return df.selectExpr("word", "timestamp_seconds(ts) AS ts").withWatermark("ts", "0 seconds")


def session_pipeline(
    events: str,
    root: Path,
    op: Operator = sessions,
    name: str = "sessions",
    transform: Callable[[DataFrame], DataFrame] = with_event_time,
    **config: Any,
) -> Pipeline:
    """``op`` (:func:`sessions`) over an :func:`event_table`, one version per epoch, its rows
    through ``transform``; 4 key groups and sync commits unless ``config`` says otherwise."""
    settings: dict[str, Any] = {"key_groups": 4, "commit_mode": "sync"}
    settings.update(config)
    return Pipeline(
        name,
        DeltaSource(events, max_files_per_trigger=1),
        op,
        root=str(root),
        sinks=str(root / "sink"),
        config=AbsConfig(**settings),
        transform=transform,
    )


def assert_same(actual: DataFrame, expected: DataFrame) -> None:
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def expected_state(spark: SparkSession, epochs: Sequence[str]) -> DataFrame:
    counts, _ = running_counts(epochs)
    return spark.createDataFrame(sorted(counts.items()), STATE_DDL)


def expected_sink(spark: SparkSession, epochs: Sequence[str]) -> DataFrame:
    _, emitted = running_counts(epochs)
    return spark.createDataFrame(emitted, STATE_DDL)


def state_history(snapshots: Snapshots, operator: str = "word_count") -> DataFrame:
    """The operator's state as of every readable epoch, with an ``as_of`` column."""
    frames = [
        snapshots.state(operator, info.epoch).withColumn("as_of", F.lit(info.epoch))
        for info in snapshots.list()
        if info.status in SNAPSHOT_STATUSES
    ]
    return reduce(DataFrame.unionByName, frames)


def expected_history(spark: SparkSession, epochs: Sequence[str]) -> DataFrame:
    rows = []
    for epoch in range(len(epochs)):
        counts, _ = running_counts(epochs[: epoch + 1])
        rows += [(word, count, epoch) for word, count in counts.items()]
    return spark.createDataFrame(rows, f"{STATE_DDL}, as_of int")


def assert_word_counts(spark: SparkSession, root: Path, epochs: Sequence[str]) -> None:
    """State after every epoch and the sink equal what the input says, exactly once."""
    snapshots = Snapshots(str(root), spark)
    listed = [(s.epoch, s.status.value) for s in snapshots.list()]
    assert [e for e, _ in listed] == list(range(len(epochs))), listed
    assert_same(state_history(snapshots), expected_history(spark, epochs))
    assert_same(snapshots.sink("output"), expected_sink(spark, epochs))


OP = "word_count"


def word_table(path: Path, epochs: Sequence[str]) -> str:
    """A Delta table of words with one append (version) per epoch's text."""
    for text in epochs:
        write_deltalake(
            str(path), pa.table({"word": pa.array(text.split(), pa.string())}), mode="append"
        )
    return str(path)


def counts_df(spark: SparkSession, texts: Sequence[str], extra: Counter[str] | None = None):  # type: ignore[no-untyped-def]
    counts = Counter(running_counts(texts)[0])
    counts.update(extra or {})
    return spark.createDataFrame(sorted(counts.items()), STATE_DDL)


@vectorized_operator(key="user", state_schema="count long", output_schema="user string, count long")
def user_count(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    """Count each user's clicks."""
    seen = rows.groupby("user", sort=False).size().rename("seen").reset_index()
    merged = seen.merge(state[["user", "count"]], on="user", how="left")
    merged["count"] = merged["count"].fillna(0).astype("int64") + merged["seen"]
    updated = merged[["user", "count"]]
    return KeyGroupResult(state=updated, output=updated)
