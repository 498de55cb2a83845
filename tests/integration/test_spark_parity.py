"""Same answers as Spark: a short differential schedule (``scripts/harnesses/spark_parity.py``).

Each seed runs one per-key logic through Spark's own ``applyInPandasWithState`` and through
pyspark-abs operators (per key, and in the Arrow form) on the same Parquet files, over a state schema drawn from every scalar
Spark SQL type with nulls and extremes, and compares every call's output (the typed state it
read and its ``repr``) with chispa; and the documentation's example of nulls. Longer schedules: ``python scripts/harnesses/spark_parity.py
--seeds 200``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import cast

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from pyspark_abs import AbsConfig, FileSource, Operator, Pipeline, operator
from tests.support.docs import run_block

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts" / "harnesses"))

import spark_parity


@pytest.mark.parametrize("seed", [0, 1, pytest.param(2, marks=pytest.mark.smoke)])
def test_per_key_state_and_outputs_match_spark(
    spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    spark_parity.check(spark, seed, tmp_path)


def test_the_readme_function_sees_none_and_exact_integers(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The documentation's example of nulls: a key whose amount is null shares a key group with a
    key paying 2**60 + 1 (one key group); both totals are exact, and null is None."""
    big = 2**60 + 1
    batches = [
        [("a", big), ("b", None)],
        [("a", 1), ("b", None), ("c", 5)],
        [("b", 3), ("a", None)],
    ]
    landing = tmp_path / "in"
    landing.mkdir()
    for i, rows in enumerate(batches):
        path = landing / f"{i}.json"
        path.write_text("".join(json.dumps({"user": u, "amount": a}) + "\n" for u, a in rows))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    ns: dict[str, object] = {"operator": operator}
    run_block('total = old["total"]  # None, never NaN', ns, {})
    pipeline = Pipeline(
        "totals",
        FileSource(
            str(landing), "json", schema="user string, amount long", max_files_per_trigger=1
        ),
        cast(Operator, ns["totals"]),
        root=str(tmp_path / "root"),
        sinks={"output": str(tmp_path / "sink")},
        config=AbsConfig(commit_mode="sync", key_groups=1),
    )
    pipeline.run()
    # the model: plain Python over the same batches
    total: dict[str, int | None] = {}
    rows_out = []
    for rows in batches:
        seen: dict[str, list[int | None]] = {}
        for user, amount in rows:
            seen.setdefault(user, []).append(amount)
        for user, amounts in seen.items():
            paid = [a for a in amounts if a is not None]
            if paid:
                total[user] = (total.get(user) or 0) + sum(paid)
            rows_out.append((user, total.get(user), amounts[-1]))
    expected = spark.createDataFrame(rows_out, "user string, total long, last long")
    assert_df_equality(
        pipeline.snapshots.sink("output"), expected, ignore_row_order=True, ignore_nullable=True
    )
