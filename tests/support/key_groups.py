"""Fixtures of the per-key-group unit tests: a word count's schemas, rows and results."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pyarrow as pa

from pyspark_abs.operators.contract import TimeoutMode
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.schema import DELETED
from pyspark_abs.operators.state_diff import KeyGroupOutcome
from tests.support.inputs import arrow_schema

INPUT = arrow_schema(("word", pa.string()), ("ts", pa.int64()))
STATE = arrow_schema(("count", pa.int64()))
OUTPUT = (("output", arrow_schema(("word", pa.string()), ("count", pa.int64()))),)


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
