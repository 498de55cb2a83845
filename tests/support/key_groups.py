"""Fixtures of the per-key-group unit tests: a word count's schemas, rows and results."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pyarrow as pa

from pyspark_abs.operators.contract import Clock, KeyGroupContext, KeyGroupResult, TimeoutMode
from pyspark_abs.operators.key_group import run_key_group
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.schema import DELETED
from pyspark_abs.operators.state_diff import KeyGroupOutcome
from tests.support.inputs import arrow_schema

INPUT = arrow_schema(("word", pa.string()), ("ts", pa.int64()))
STATE = arrow_schema(("count", pa.int64()))
OUTPUT = (("output", arrow_schema(("word", pa.string()), ("count", pa.int64()))),)
CLOCK = Clock(processing_time_ms=1_000, watermark_ms=None)
LIMIT = 4
"""The count above which the word counts here drop a word's state."""


def word_plan(
    function: Any, timeout: TimeoutMode = TimeoutMode.NONE, **fields: Any
) -> OperatorPlan:
    """A word count's plan (operator ``wc``) running ``function``; ``fields`` override."""
    settings: dict[str, Any] = {"outputs": OUTPUT, "state_schema": STATE, **fields}
    return OperatorPlan(
        name="wc",
        key_columns=("word",),
        input_schema=INPUT,
        timeout=timeout,
        function=function,
        **settings,
    )


def rows(*words: str, ts: int = 0) -> pd.DataFrame:
    """Input rows of the words, all at event time ``ts``."""
    return pd.DataFrame({"word": list(words), "ts": [ts] * len(words)})


def sort(table: pa.Table) -> list[dict[str, Any]]:
    """A table's rows as dicts, by word."""
    return sorted(table.to_pylist(), key=lambda r: str(r["word"]))


def assert_kept_rows(before: pa.Table, outcome: KeyGroupOutcome) -> None:
    """What change files rely on: the new state is the rows of ``before`` that
    ``outcome.kept`` selects, in their order, then the live rows of ``outcome.changes``."""
    assert len(outcome.kept) == before.num_rows
    kept = before.filter(pa.array(outcome.kept))
    assert outcome.state.slice(0, kept.num_rows).to_pylist() == kept.to_pylist()
    live = [r for r in outcome.changes.to_pylist() if not r.pop(DELETED)]
    added = outcome.state.slice(kept.num_rows).to_pylist()
    assert sorted(map(repr, added)) == sorted(map(repr, live))


def vectorized(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    """A vectorized word count that drops a word's state once its count passes LIMIT."""
    seen = rows.groupby("word").size().rename("n").reset_index()
    merged = seen.merge(state[["word", "count"]], on="word", how="left")
    merged["count"] = merged["count"].fillna(0).astype("int64") + merged["n"]
    over = merged["count"] > LIMIT
    kept = merged.loc[~over, ["word", "count"]]
    return KeyGroupResult(state=kept, removed=merged.loc[over, ["word"]], output=kept)


def run_epochs(plan: OperatorPlan, epochs: list[pd.DataFrame]) -> list[KeyGroupOutcome]:
    """Run key group 7 over the epochs, each from the state the one before left."""
    state = plan.blob_schema.empty_table()
    outcomes = []
    for epoch, frame in enumerate(epochs):
        outcome = run_key_group(plan, 7, frame, state, CLOCK, epoch)
        assert_kept_rows(state, outcome)
        outcomes.append(outcome)
        state = outcome.state
    return outcomes


EPOCHS = [rows("a", "b", "a"), rows("a", "c"), rows("c"), rows("a", "a", "b")]
"""Four epochs of words; the last drops "a" (five counts)."""
