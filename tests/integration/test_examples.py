"""The documentation's examples under ``docs/examples``, run as files, as a user runs them."""

from __future__ import annotations

import runpy
import sys
from collections import Counter
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from pyspark_abs import EpochStatus
from tests.support.docs import EXAMPLES


@pytest.fixture
def examples_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """``python docs/examples/X.py`` puts the examples' folder first on the path."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.delitem(sys.modules, "first_pipeline", raising=False)


def run_example(name: str) -> dict[str, object]:
    return runpy.run_path(str(EXAMPLES / name), run_name="__main__")


@pytest.mark.usefixtures("examples_on_path")
def test_the_first_pipeline_snapshots_its_first_epoch(spark: SparkSession) -> None:
    scope = run_example("first_pipeline.py")
    assert scope["spark"] is spark
    listed = scope["pipeline"].snapshots.list()  # type: ignore[attr-defined]
    assert [(s.epoch, s.status) for s in listed] == [(0, EpochStatus.COMMITTED)]
    counts = scope["pipeline"].snapshots.state("word_count").collect()  # type: ignore[attr-defined]
    assert sorted((r["word"], r["count"]) for r in counts) == [
        ("be", 2), ("not", 1), ("or", 1), ("to", 2)
    ]  # fmt: skip


def emitted(texts: list[str]) -> list[tuple[str, int]]:
    """The rows a word count emits over ``texts``, one file per epoch: each word of a file
    with its count after that file."""
    counts: Counter[str] = Counter()
    rows = []
    for text in texts:
        seen = Counter(text.split())
        counts.update(seen)
        rows += [(word, counts[word]) for word in seen]
    return rows


@pytest.mark.usefixtures("examples_on_path")
def test_the_crash_and_the_rollback_give_the_uninterrupted_run(spark: SparkSession) -> None:
    """The example asserts the state itself (chispa); here: the epochs it left, and a sink
    holding each row of an uninterrupted run over the two files exactly once."""
    scope = run_example("crash_and_recover.py")
    snapshots = scope["pipeline"].snapshots  # type: ignore[attr-defined]
    statuses = [(s.epoch, s.status, s.restored_from) for s in snapshots.list()]
    assert statuses == [
        (0, EpochStatus.COMMITTED, None),
        (1, EpochStatus.COMMITTED, None),
        (2, EpochStatus.RESTORED, 0),
        (3, EpochStatus.COMMITTED, None),  # Spark's file source re-reads 0.txt: no change
        (4, EpochStatus.COMMITTED, None),  # 1.txt again
    ]
    base = Path(str(scope["base"]))
    texts = [(base / "in" / f"{i}.txt").read_text() for i in range(2)]
    expected = spark.createDataFrame(emitted(texts), "word string, count long")
    assert_df_equality(
        snapshots.sink("output"), expected, ignore_row_order=True, ignore_nullable=True
    )
