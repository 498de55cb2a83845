"""A catalogue of bad input: each either works, or fails its epoch alone, clearly.

Each failing case runs two epochs, the second holding good records beside the bad one (which
makes the function misbehave), and checks the error's class and message, that the epoch is
ABORTED (so never COMMITTED), that the sink is unchanged since the epoch before, and that a
fixed run then commits every epoch with nothing lost. Cases that must simply work
(malformed records, null and unicode keys, huge rows, an epoch without rows) run through
the same pipeline.

Covered elsewhere and not repeated here: a per-key function that raises and a per-key
output with wrong columns (``test_failures.py``), composite null and unicode keys with nested
state (``test_pipeline.py::test_composite_null_and_unicode_keys_with_nested_state``), an
epoch whose input has no words (``test_pipeline.py::test_epoch_without_words_...``), every
malformed return value of a function (``tests/unit/test_execution.py``).
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import DataFrame, SparkSession

from pyspark_abs import (
    AbsConfig,
    AbsError,
    ArrowContext,
    EpochStatus,
    KeyGroupContext,
    KeyGroupResult,
    KeyState,
    Operator,
    Pipeline,
    Snapshots,
    arrow_operator,
    operator,
    vectorized_operator,
)
from pyspark_abs.errors import (
    InvalidTimeoutError,
    OperatorError,
    SchemaMismatchError,
    StateTooLargeError,
)
from pyspark_abs.storage.store import DeltaStore
from tests.support.pipelines import assert_same

OUTPUT = "word string, total long"
BAD = "bad"
Record = dict[str, Any]
EPOCHS: list[list[Record]] = [
    [{"word": "a", "n": 1}, {"word": "b", "n": 2}],
    [{"word": "a", "n": 3}, {"word": BAD, "n": 4}, {"word": "c", "n": 5}],
]


def per_key(misbehave: Any = None) -> Operator:
    """Sums ``n`` per word; for the word ``bad`` returns what ``misbehave`` returns."""

    @operator(key="word", state_schema="total long", output_schema=OUTPUT, name="summing")
    def summing(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
        if misbehave is not None and key[0] == BAD:
            return misbehave(state)
        total = state.get({"total": 0})["total"] + int(rows["n"].sum())
        state.update({"total": total})
        return {"word": key[0], "total": total}

    return summing


def vectorized(misbehave: Any = None, timeout: str = "none") -> Operator:
    """Sums ``n`` per word; a key group holding ``bad`` returns ``misbehave(rows, state)``."""

    @vectorized_operator(
        key="word", state_schema="total long", output_schema=OUTPUT, name="summing", timeout=timeout
    )
    def summing(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> Any:
        if misbehave is not None and (rows["word"] == BAD).any():
            return misbehave(rows, state)
        seen = rows.groupby("word", dropna=False).agg(n=("n", "sum")).reset_index()
        merged = seen.merge(state[["word", "total"]], on="word", how="left")
        merged["total"] = merged["total"].fillna(0).astype("int64") + merged["n"]
        updated = merged[["word", "total"]]
        return KeyGroupResult(state=updated, output=updated)

    return summing


def arrow_summing(misbehave: Any = None, timeout: str = "none") -> Operator:
    """``vectorized`` in the Arrow form."""

    @arrow_operator(
        key="word", state_schema="total long", output_schema=OUTPUT, name="summing", timeout=timeout
    )
    def summing(rows: pa.Table, state: pa.Table, ctx: ArrowContext) -> Any:
        if misbehave is not None and BAD in rows["word"].to_pylist():
            return misbehave(rows, state)
        seen: Any = rows.group_by("word").aggregate([("n", "sum")])
        at: Any = pc.index_in(seen["word"], value_set=state["word"])
        taken: Any = pc.take(state["total"], at)
        held: Any = pc.fill_null(taken, 0)
        seen_n: Any = pc.fill_null(seen["n_sum"], 0)
        total: Any = pc.add(seen_n, held)
        updated = pa.table({"word": seen["word"], "total": total})
        return KeyGroupResult(state=updated, output=updated)

    return summing


def raise_runtime_error(rows: pd.DataFrame, state: pd.DataFrame) -> Any:
    raise RuntimeError("boom")


def return_keys_of_another_type(rows: pd.DataFrame, state: pd.DataFrame) -> Any:
    frame = pd.DataFrame({"word": [1.5] * len(rows), "total": rows["n"]})
    return KeyGroupResult(state=frame)


def return_a_past_timeout(rows: pd.DataFrame, state: pd.DataFrame) -> Any:
    frame = pd.DataFrame({"word": rows["word"], "total": rows["n"], "_timeout": 1_000})
    return KeyGroupResult(state=frame)


FAILING = {
    "function-raises": (
        vectorized(raise_runtime_error),
        arrow_summing(),  # the Arrow form carries on the pandas form's root
        OperatorError,
        r"operator 'summing', epoch 1, key groups? [\d, ]+: the function raised RuntimeError: boom",
    ),
    "arrow-function-raises": (
        arrow_summing(raise_runtime_error),
        vectorized(),  # the pandas form carries on the Arrow form's root
        OperatorError,
        r"operator 'summing', epoch 1, key groups? [\d, ]+: the function raised RuntimeError: boom",
    ),
    "arrow-key-of-the-wrong-type": (
        arrow_summing(
            lambda rows, state: KeyGroupResult(
                state=pa.table({"word": pa.array([1.5] * len(rows)), "total": rows["n"]})
            )
        ),
        arrow_summing(),
        SchemaMismatchError,
        r"operator 'summing', epoch 1, key groups? [\d, ]+: returned state: column 'word' of type "
        r"double cannot be converted to string",
    ),
    "arrow-timeout-in-the-past": (
        arrow_summing(
            lambda rows, state: KeyGroupResult(
                state=rows.select(["word", "n"])
                .rename_columns(["word", "total"])
                .append_column("_timeout", pa.array([1_000] * len(rows), pa.int64()))
            ),
            timeout="processing_time",
        ),
        arrow_summing(timeout="processing_time"),
        InvalidTimeoutError,
        r"operator 'summing', epoch 1, key groups? [\d, ]+: a key's _timeout 1000 is not after the "
        r"processing time \d+; processing-time timeouts must be in the future",
    ),
    "returns-a-non-frame": (
        per_key(lambda state: "a string"),
        per_key(),
        SchemaMismatchError,
        r"operator 'summing', epoch 1, key groups? [\d, ]+, key \('bad',\): output 'output': "
        r"returned str; return a DataFrame, a dict \(one row\), a list of dicts, or None",
    ),
    "key-of-the-wrong-type": (
        vectorized(return_keys_of_another_type),
        vectorized(),
        SchemaMismatchError,
        r"operator 'summing', epoch 1, key groups? [\d, ]+: returned state: column 'word' cannot "
        r"be converted to string",
    ),
    "state-out-of-range": (
        per_key(lambda state: state.update({"total": 2**70})),
        per_key(),
        SchemaMismatchError,
        r"operator 'summing', epoch 1, key groups? [\d, ]+: returned state: column 'total' "
        r"cannot be converted to int64",
    ),
    "state-with-missing-columns": (
        per_key(lambda state: state.update({"count": 1})),
        per_key(),
        SchemaMismatchError,
        r"operator 'summing', epoch 1, key groups? [\d, ]+, key \('bad',\): state.update for key "
        r"\('bad',\): missing \['total'\], unexpected \['count'\]",
    ),
    "timeout-in-the-past": (
        vectorized(return_a_past_timeout, timeout="processing_time"),
        vectorized(timeout="processing_time"),
        InvalidTimeoutError,
        r"operator 'summing', epoch 1, key groups? [\d, ]+: a key's _timeout 1000 is not after the "
        r"processing time \d+; processing-time timeouts must be in the future",
    ),
    "timeout-without-a-timeout-mode": (
        per_key(lambda state: state.set_timeout_duration(1000)),
        per_key(),
        InvalidTimeoutError,
        r"operator 'summing', epoch 1, key groups? [\d, ]+, key \('bad',\): set_timeout_duration "
        r"for key \('bad',\) needs an operator declared with timeout='processing_time'",
    ),
}


def write_json_epochs(directory: Path, epochs: Sequence[Sequence[Record | str]]) -> Path:
    """One JSON-lines file per epoch (raw strings are written as they are), oldest first."""
    directory.mkdir(parents=True, exist_ok=True)
    for i, records in enumerate(epochs):
        path = directory / f"part-{i:04d}.json"
        lines = (r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in records)
        path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        os.utime(path, (1_700_000_000 + i * 10, 1_700_000_000 + i * 10))
    return directory


def json_pipeline(
    spark: SparkSession, inputs: Path, root: Path, op: Operator, **config: Any
) -> Pipeline:
    records = (
        spark.readStream.schema("word string, n long")
        .option("maxFilesPerTrigger", 1)
        .json(str(inputs))
    )
    return Pipeline(
        "catalogue",
        records,
        op,
        root=str(root),
        sinks=str(root / "sink"),
        config=AbsConfig(key_groups=4, commit_mode="sync", **config),
    )


def expected_outputs(
    spark: SparkSession, epochs: Sequence[Sequence[Record]]
) -> tuple[DataFrame, DataFrame]:
    """The final state and the sink rows of summing ``n`` per word over ``epochs``."""
    totals: dict[str | None, int] = {}
    emitted = []
    for records in epochs:
        for word in dict.fromkeys(r["word"] for r in records):
            seen = sum(r["n"] or 0 for r in records if r["word"] == word)
            totals[word] = totals.get(word, 0) + seen
            emitted.append((word, totals[word]))
    state = spark.createDataFrame(sorted(totals.items(), key=str), OUTPUT)
    return state, spark.createDataFrame(emitted, OUTPUT)


def assert_sums(spark: SparkSession, root: Path, epochs: Sequence[Sequence[Record]]) -> None:
    """Every epoch is committed and state and sink equal the direct sums."""
    snapshots = Snapshots(str(root), spark)
    assert [(i.epoch, i.status) for i in snapshots.list()] == [
        (e, EpochStatus.COMMITTED) for e in range(len(epochs))
    ]
    state, sink = expected_outputs(spark, epochs)
    assert_same(snapshots.state("summing"), state)
    assert_same(snapshots.sink("output"), sink)


RERUN = {
    "function-raises",
    "state-out-of-range",
    "arrow-function-raises",
    "arrow-timeout-in-the-past",
}
"""Cases whose fixed code is run again on the same root (the others end the same way)."""


@pytest.mark.parametrize(("op", "fixed", "error", "message"), FAILING.values(), ids=FAILING.keys())
def test_bad_epoch_fails_alone_and_loses_nothing(
    spark: SparkSession,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    op: Operator,
    fixed: Operator,
    error: type[AbsError],
    message: str,
) -> None:
    inputs = write_json_epochs(tmp_path / "in", EPOCHS)
    root = tmp_path / "root"
    with pytest.raises(error, match=message) as raised:
        json_pipeline(spark, inputs, root, op).run()
    # the one precise message, without Spark's report of it (Java stack traces and all)
    shown = "".join(traceback.format_exception(raised.value))
    assert shown.count(str(raised.value)) == 1, shown
    assert "org.apache.spark" not in shown, shown

    snapshots = Snapshots(str(root), spark)
    statuses = [(i.epoch, i.status) for i in snapshots.list(include_aborted=True)]
    assert statuses == [(0, EpochStatus.COMMITTED), (1, EpochStatus.ABORTED)]  # never COMMITTED
    assert error.__name__ in (snapshots.get(1).error or "")
    sink = DeltaStore().open(str(root / "sink"))
    assert sink.version() == snapshots.get(0).table_versions["sink/output"]

    if request.node.callspec.id in RERUN:
        json_pipeline(spark, inputs, root, fixed).run()
        assert_sums(spark, root, EPOCHS)


def test_malformed_null_unicode_and_huge_records_work(spark: SparkSession, tmp_path: Path) -> None:
    huge = "x" * (5 * 1024 * 1024)
    epochs: list[list[Record | str]] = [
        [{"word": "ünïcødé ✓", "n": 1}, {"word": None, "n": 2}, {"word": "", "n": 3}],
        ['{"word": "a", "n": ', "not json at all", {"word": huge, "n": 4}],
        [],  # an epoch without a single record
        [{"word": "ünïcødé ✓", "n": 5}, {"word": None, "n": 6}, {"word": huge, "n": 7}],
    ]
    inputs = write_json_epochs(tmp_path / "in", epochs)
    root = tmp_path / "root"
    json_pipeline(spark, inputs, root, per_key()).run()
    # Spark reads a malformed line as a record whose fields are all null: the null key.
    as_read: list[list[Record]] = [
        [r if isinstance(r, dict) else {"word": None, "n": None} for r in records]
        for records in epochs
    ]
    assert_sums(spark, root, as_read)


def test_a_key_group_state_above_the_bound_fails_its_epoch_alone(
    spark: SparkSession, tmp_path: Path
) -> None:
    epochs = [
        [{"word": "a", "n": 1}, {"word": "b", "n": 2}],
        [{"word": f"w{i}", "n": i} for i in range(400)],
    ]
    inputs = write_json_epochs(tmp_path / "in", epochs)
    root = tmp_path / "root"
    bounded = json_pipeline(spark, inputs, root, vectorized(), max_key_group_state_bytes=1024)
    with pytest.raises(
        StateTooLargeError,
        match=r"operator 'summing', epoch 1, key group \d+: the key group's state holds [\d,]+ "
        r"bytes of Arrow \([\d,]+ keys\), above max_key_group_state_bytes=1,024; the epoch is "
        r"not committed. Spread the keys over more key groups \(raise key_groups",
    ):
        bounded.run()

    snapshots = Snapshots(str(root), spark)
    statuses = [(i.epoch, i.status) for i in snapshots.list(include_aborted=True)]
    assert statuses == [(0, EpochStatus.COMMITTED), (1, EpochStatus.ABORTED)]
    assert "StateTooLargeError" in (snapshots.get(1).error or "")
    sink = DeltaStore().open(str(root / "sink"))
    assert sink.version() == snapshots.get(0).table_versions["sink/output"]

    json_pipeline(spark, inputs, root, vectorized()).run()
    assert_sums(spark, root, epochs)
