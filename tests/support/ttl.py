"""An operator with an event-time TTL over an event table, and a model of its live state.

The model is plain Python: a count per key, which lapses once the watermark passes the key's
newest event at its last write plus the TTL. It reuses nothing of the project.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from pyspark_abs import (
    KeyState,
    Operator,
    Pipeline,
    Snapshots,
    arrow_operator,
    operator,
)
from tests.support.inputs import count_words_arrow
from tests.support.pipelines import session_pipeline, with_event_time

TTL_S = 10
BATCHES: list[list[tuple[str, int]]] = [
    [("a", 100), ("b", 101)],
    [("a", 105), ("c", 120)],
    [("b", 125), ("d", 126)],
    [("a", 140)],
]
DDL = "word string, count long"


def count_words(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
    count = state.get({"count": 0})["count"] + len(rows)
    state.update({"count": count})
    return {"word": key[0], "count": count}


COUNTS: dict[str, Any] = {"key": "word", "state_schema": "count long", "output_schema": DDL}
RECENT: dict[str, Any] = {
    **COUNTS,
    "name": "recent",
    "ttl": dt.timedelta(seconds=TTL_S),
    "ttl_clock": "event_time",
}
"""The declaration of ``recent``: a count per word that lapses TTL_S after its last event."""
recent = operator(**RECENT)(count_words)


recent_arrow = arrow_operator(**RECENT)(count_words_arrow)
"""``recent`` in the Arrow form: the engine, not the function, keeps the TTL."""


forever = operator(**COUNTS, name="recent")(count_words)


def ttl_pipeline(
    events: str,
    root: Path,
    op: Operator,
    transform: Callable[[DataFrame], DataFrame] = with_event_time,
    local_state_dir: str = "",
) -> Pipeline:
    return session_pipeline(events, root, op, "recent", transform, local_state_dir=local_state_dir)


def model(
    batches: Sequence[Sequence[tuple[str, int]]],
    watermarks: Sequence[int],
    ttl_from: int = 0,
) -> list[dict[str, tuple[int, int]]]:
    """Live state ``{word: (count, expiry s)}`` after each batch, the last one a batch without
    rows at the final watermark. Writes before batch ``ttl_from`` set no expiry; batch
    ``ttl_from`` gives those keys one TTL after the previous batch's watermark."""
    state: dict[str, tuple[int, int | None]] = {}
    history = []
    for i, (batch, watermark) in enumerate(zip([*batches, []], watermarks, strict=True)):
        if i == ttl_from and i:
            start = watermarks[i - 1] + TTL_S
            state = {w: (c, start if e is None else e) for w, (c, e) in state.items()}
        state = {w: (c, e) for w, (c, e) in state.items() if e is None or e >= watermark}
        for word in sorted({w for w, _ in batch}):
            newest = max(t for w, t in batch if w == word)
            count = state.get(word, (0, None))[0] + sum(1 for w, _ in batch if w == word)
            state[word] = (count, max(watermark, newest) + TTL_S if i >= ttl_from else None)
        history.append(dict(state))
    return history  # type: ignore[return-value]


def watermarks_of(batches: Sequence[Sequence[tuple[str, int]]], floor: int = 0) -> list[int]:
    """Spark's watermark (delay 0) in each batch and in the batch without rows after them."""
    marks, seen = [], floor
    for batch in [*batches, []]:
        marks.append(seen)
        seen = max([seen, *(t for _, t in batch)])
    return marks


def as_frame(spark: SparkSession, state: dict[str, tuple[int, int]]) -> DataFrame:
    rows = [(w, c, e * 1000) for w, (c, e) in sorted(state.items())]
    return spark.createDataFrame(rows, f"{DDL}, _timeout long")


def state_of(snapshots: Snapshots, epoch: int) -> DataFrame:
    return snapshots.state("recent", epoch, with_metadata=True).select("word", "count", "_timeout")
