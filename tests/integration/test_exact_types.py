"""Exact values where they meet the lifecycle: integers beyond 2**53 beside nulls in one key
group, in scalar and nested state, through a restore at another key-group count, a
compaction, a rollback and a write_state, each continued as the uninterrupted run.

The reference is plain Python over the same batches; it reuses nothing of the project.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
from deltalake import write_deltalake
from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F

from pyspark_abs import (
    AbsConfig,
    DeltaSource,
    KeyState,
    Pipeline,
    Snapshots,
    compact,
    operator,
    restore,
    rollback,
    write_state,
)
from tests.support.pipelines import assert_same

BIG = 2**60 + 1
BATCHES: tuple[tuple[tuple[str, int | None], ...], ...] = (
    (("a", BIG), ("b", None), ("c", 3)),
    (("a", None), ("b", BIG + 2), ("d", None), ("a", 5)),
    (("a", 1), ("c", None), ("d", -BIG)),
    (("b", None), ("c", BIG), ("e", 7)),
)
STATE = (
    "total long, last long, amounts array<bigint>, seen map<string,bigint>, "
    "first struct<amount:bigint,batch:int>"
)
OUTPUT = "user string, batch int, total long, amounts array<bigint>"


@operator(key="user", state_schema=STATE, output_schema=OUTPUT, name="exact")
def exact(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> list[dict[str, Any]]:
    """Per user: the paid total, the last amount, every amount, the last per batch, the
    first; the state is read back as Spark's GroupState gives it (list, dict, Row). One row
    out per batch the call's rows came from (a rerun after a rollback reads several)."""
    old = state.get({"total": None, "last": None, "amounts": [], "seen": {}, "first": None})
    total, amounts, seen, first = (
        old["total"],
        list(old["amounts"]),
        dict(old["seen"]),
        old["first"],
    )
    outputs: list[dict[str, Any]] = []
    for value, batch in rows.sort_values("seq")[["amount", "batch"]].itertuples(index=False):
        amount = None if pd.isna(value) else int(value)
        amounts.append(amount)
        seen[str(batch)] = amount
        total = total if amount is None else (total or 0) + amount
        first = first if first is not None else Row(amount=amount, batch=int(batch))
        if outputs and outputs[-1]["batch"] == batch:
            outputs.pop()
        outputs.append({"user": key[0], "batch": int(batch), "total": total, "amounts": amounts[:]})
    new = {"total": total, "last": amounts[-1], "amounts": amounts, "seen": seen, "first": first}
    state.update(new)
    return outputs


def model(batches: range) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The state after ``batches`` and the rows they output, in plain Python."""
    state: dict[str, dict[str, Any]] = {}
    output = []
    for batch in batches:
        for user in dict.fromkeys(u for u, _ in BATCHES[batch]):
            s = state.setdefault(user, {"total": None, "amounts": [], "seen": {}, "first": None})
            for amount in (a for u, a in BATCHES[batch] if u == user):
                s["amounts"].append(amount)
                s["seen"][str(batch)] = amount
                if amount is not None:
                    s["total"] = (s["total"] or 0) + amount
                if s["first"] is None:
                    s["first"] = (amount, batch)
            output.append((user, batch, s["total"], list(s["amounts"])))
    rows = [
        (u, s["total"], s["amounts"][-1], s["amounts"], s["seen"], s["first"])
        for u, s in state.items()
    ]
    return rows, output


def append(table: Path, batch: int) -> None:
    users, amounts = zip(*BATCHES[batch], strict=True)
    rows: dict[str, pa.Array[Any]] = {
        "user": pa.array(users, pa.string()),
        "amount": pa.array(amounts, pa.int64()),
        "batch": pa.array([batch] * len(users), pa.int32()),
        "seq": pa.array([batch * 100 + i for i in range(len(users))], pa.int64()),
    }
    write_deltalake(str(table), pa.table(rows), mode="append")


def pipeline(base: Path, root: str, key_groups: int = 2) -> Pipeline:
    return Pipeline(
        "exact",
        DeltaSource(str(base / "input")),
        exact,
        root=str(base / root),
        sinks={"output": str(base / f"{root}-sink")},
        config=AbsConfig(commit_mode="sync", key_groups=key_groups),
    )


def assert_model(spark: SparkSession, snapshots: Snapshots, batches: range, sunk: range) -> None:
    state, output = model(batches)
    _, before = model(range(sunk.start))
    expected_state = spark.createDataFrame(state, f"user string, {STATE}")
    actual_state = snapshots.state("exact").select(*expected_state.columns)
    # rows cannot be sorted by a map: compare its entries, sorted
    entries = F.array_sort(F.map_entries("seen")).alias("seen")
    assert_same(
        actual_state.withColumn("seen", entries), expected_state.withColumn("seen", entries)
    )
    expected_sink = spark.createDataFrame(output[len(before) :], OUTPUT)
    assert_same(snapshots.sink("output"), expected_sink)


def test_exact_values_survive_restore_compaction_rollback_and_write_state(
    spark: SparkSession, tmp_path: Path
) -> None:
    for batch in range(2):
        append(tmp_path / "input", batch)
        pipeline(tmp_path, "root").run()
    root = str(tmp_path / "root")
    epochs = [s.epoch for s in Snapshots(root, spark).list()]
    assert_model(spark, Snapshots(root, spark), range(2), range(2))

    # a restore at another key-group count continues as the uninterrupted run
    restore(root, epochs[-1], str(tmp_path / "copy"))
    for batch in range(2, 4):
        append(tmp_path / "input", batch)
    pipeline(tmp_path, "copy", key_groups=5).run()
    assert_model(spark, Snapshots(str(tmp_path / "copy"), spark), range(4), range(2, 4))

    # compaction, a rollback to the first batch, the same input again, then the state
    # read back and written unchanged: the original root ends as the uninterrupted run
    compact(root)
    rollback(root, epochs[0])
    pipeline(tmp_path, "root").run()
    snapshots = Snapshots(root, spark)
    assert_model(spark, snapshots, range(4), range(4))
    write_state(snapshots.state("exact"), root, exact)
    assert_model(spark, snapshots, range(4), range(4))
