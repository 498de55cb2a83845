"""The per-key-group core: both operator forms, diffs, tombstones, timeouts, and errors."""

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pyspark_abs import (
    Clock,
    KeyGroupContext,
    KeyGroupResult,
    KeyState,
    TimeoutMode,
    operator,
    vectorized_operator,
)
from pyspark_abs.errors import (
    InvalidTimeoutError,
    OperatorError,
    SchemaMismatchError,
    StateTooLargeError,
)
from pyspark_abs.operators.key_group import run_key_group
from pyspark_abs.operators.per_key import PerKeyAdapter
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.schema import STATELESS_COLUMN
from pyspark_abs.operators.state_diff import apply_changes
from pyspark_abs.operators.task import epoch_changes
from tests.support.inputs import arrow_schema
from tests.support.key_groups import (
    CLOCK,
    EPOCHS,
    INPUT,
    LIMIT,
    OUTPUT,
    rows,
    run_epochs,
    sort,
    vectorized,
    word_plan,
)


def per_key(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
    count = state.get({"count": 0})["count"] + len(rows)
    if count > LIMIT:
        state.remove()
        return None
    state.update({"count": count})
    return {"word": key[0], "count": count}


def plan_for(
    per_key_fn: Any = None,
    vectorized_fn: Any = None,
    timeout: TimeoutMode = TimeoutMode.NONE,
    outputs: tuple[tuple[str, pa.Schema], ...] = OUTPUT,
) -> OperatorPlan:
    function = PerKeyAdapter(per_key_fn, ("word",), timeout) if per_key_fn else vectorized_fn
    return word_plan(function, timeout, outputs=outputs)


@pytest.mark.parametrize("form", ["per_key", "vectorized"])
def test_changes_hold_only_changed_keys_and_tombstones(form: str) -> None:
    plan = plan_for(per_key, None) if form == "per_key" else plan_for(None, vectorized)
    outcomes = run_epochs(plan, EPOCHS)
    changes = [sort(o.changes) for o in outcomes]
    assert changes[0] == [
        {"word": "a", "count": 2, "_timeout": None, "_deleted": False},
        {"word": "b", "count": 1, "_timeout": None, "_deleted": False},
    ]
    assert changes[2] == [{"word": "c", "count": 2, "_timeout": None, "_deleted": False}]
    assert changes[3] == [
        {"word": "a", "count": None, "_timeout": None, "_deleted": True},
        {"word": "b", "count": 2, "_timeout": None, "_deleted": False},
    ]
    assert [o.keys_delta for o in outcomes] == [2, 1, 0, -1]
    assert sort(outcomes[-1].state) == [
        {"word": "b", "count": 2, "_timeout": None},
        {"word": "c", "count": 2, "_timeout": None},
    ]


@pytest.mark.parametrize("form", ["per_key", "vectorized"])
def test_applying_an_epochs_changes_gives_its_state(form: str) -> None:
    """A replay installs the decided changes: the state equals the one the epoch computed."""
    plan = plan_for(per_key, None) if form == "per_key" else plan_for(None, vectorized)
    state = plan.blob_schema.empty_table()
    for outcome in run_epochs(plan, EPOCHS):
        state = apply_changes(plan, state, outcome.changes)
        assert sort(state) == sort(outcome.state)


def test_a_decided_epochs_changes_are_read_per_key_group(tmp_path: Path) -> None:
    plan = plan_for(per_key, None)
    changes = run_epochs(plan, EPOCHS[:1])[0].changes
    files = []
    for group in (3, 7):
        path = tmp_path / f"part-{group}.parquet"
        pq.write_table(changes.append_column("_key_group", pa.array([group] * 2, pa.int32())), path)
        files.append(str(path))
    assert sort(epoch_changes(plan, 0, tuple(files), 7)) == sort(changes)
    assert epoch_changes(plan, 0, tuple(files), 5).num_rows == 0
    missing = (str(tmp_path / "gone.parquet"),)
    with pytest.raises(OperatorError, match="epoch 1 is decided, but its state changes"):
        epoch_changes(plan, 1, missing, 7)


def test_both_forms_snapshot_identically() -> None:
    by_key = run_epochs(plan_for(per_key, None), EPOCHS)
    by_group = run_epochs(plan_for(None, vectorized), EPOCHS)
    for a, b in zip(by_key, by_group, strict=True):
        assert sort(a.changes) == sort(b.changes)
        assert sort(a.state) == sort(b.state)
        assert sort(a.outputs[0]) == sort(b.outputs[0])


def test_unchanged_upserts_are_not_written() -> None:
    def lazy(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
        new = rows.groupby("word").size().rename("count").reset_index()
        return KeyGroupResult(
            state=pd.concat([state[["word", "count"]], new]).drop_duplicates("word", keep="last")
        )

    outcomes = run_epochs(plan_for(None, lazy), [rows("a", "b"), rows("c")])
    assert sort(outcomes[1].changes) == [
        {"word": "c", "count": 1, "_timeout": None, "_deleted": False}
    ]
    assert outcomes[1].state.num_rows == 3


def test_several_outputs_per_key() -> None:
    outputs = (
        ("counts", arrow_schema(("word", pa.string()), ("count", pa.int64()))),
        ("firsts", arrow_schema(("word", pa.string()))),
    )

    def fn(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
        first = not state.exists
        state.update({"count": len(rows)})
        result: dict[str, Any] = {"counts": {"word": key[0], "count": len(rows)}}
        if first:
            result["firsts"] = [{"word": key[0]}]
        return result

    plan = plan_for(fn, None, outputs=outputs)
    outcome = run_key_group(plan, 0, rows("x", "y", "x"), plan.blob_schema.empty_table(), CLOCK, 0)
    assert sort(outcome.outputs[0]) == [{"word": "x", "count": 2}, {"word": "y", "count": 1}]
    assert sort(outcome.outputs[1]) == [{"word": "x"}, {"word": "y"}]


def test_user_error_names_operator_epoch_key_group_and_key() -> None:
    def broken(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> None:
        raise ZeroDivisionError("boom")

    plan = plan_for(broken, None)
    with pytest.raises(
        OperatorError,
        match=r"operator 'wc', epoch 4, key group 7, key \('a',\).*ZeroDivisionError: boom",
    ):
        run_key_group(plan, 7, rows("a"), plan.blob_schema.empty_table(), CLOCK, 4)


def test_vectorized_user_error_names_key_group() -> None:
    def broken(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
        raise KeyError("nope")

    plan = plan_for(None, broken)
    with pytest.raises(
        OperatorError, match=r"operator 'wc', epoch 2, key group 7: the function raised KeyError"
    ):
        run_key_group(plan, 7, rows("a"), plan.blob_schema.empty_table(), CLOCK, 2)


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (pd.DataFrame({"word": ["a"]}), r"missing column\(s\) \['count'\]"),
        (pd.DataFrame({"word": ["a"], "count": [1], "x": [1]}), r"unexpected column\(s\) \['x'\]"),
        (
            pd.DataFrame({"word": ["a"], "count": ["many"]}),
            r"column 'count' cannot be converted to int64",
        ),
        ("text", "returned str"),
    ],
)
def test_wrong_output_is_a_schema_mismatch(returned: Any, message: str) -> None:
    plan = plan_for(lambda key, rows, state: returned, None)
    with pytest.raises(SchemaMismatchError, match=message):
        run_key_group(plan, 1, rows("a"), plan.blob_schema.empty_table(), CLOCK, 0)


def test_wrong_vectorized_state_is_a_schema_mismatch() -> None:
    def fn(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
        return KeyGroupResult(state=pd.DataFrame({"word": ["a"], "total": [1]}))

    plan = plan_for(None, fn)
    with pytest.raises(
        SchemaMismatchError, match=r"returned state: missing column\(s\) \['count'\]"
    ):
        run_key_group(plan, 1, rows("a"), plan.blob_schema.empty_table(), CLOCK, 0)


def test_non_result_return_is_refused() -> None:
    plan = plan_for(None, lambda rows, state, ctx: rows)
    with pytest.raises(SchemaMismatchError, match="returns a KeyGroupResult"):
        run_key_group(plan, 1, rows("a"), plan.blob_schema.empty_table(), CLOCK, 0)


def test_state_for_keys_outside_the_call_is_refused() -> None:
    def fn(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
        return KeyGroupResult(state=pd.DataFrame({"word": ["stranger"], "count": [1]}))

    plan = plan_for(None, fn)
    with pytest.raises(
        OperatorError, match=r"\[\('stranger',\)\] that have neither rows nor state"
    ):
        run_key_group(plan, 1, rows("a"), plan.blob_schema.empty_table(), CLOCK, 0)


def test_duplicate_and_conflicting_keys_are_refused() -> None:
    def dup(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
        return KeyGroupResult(state=pd.DataFrame({"word": ["a", "a"], "count": [1, 2]}))

    def both(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
        return KeyGroupResult(
            state=pd.DataFrame({"word": ["a"], "count": [1]}), removed=pd.DataFrame({"word": ["a"]})
        )

    for fn, message in [(dup, "more than once"), (both, "both updated and removed")]:
        plan = plan_for(None, fn)
        with pytest.raises(SchemaMismatchError, match=message):
            run_key_group(plan, 1, rows("a"), plan.blob_schema.empty_table(), CLOCK, 0)


def expiring(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
    if state.has_timed_out:
        value = state.get()["count"]
        state.remove()
        return {"word": key[0], "count": -value}
    state.update({"count": state.get({"count": 0})["count"] + len(rows)})
    state.set_timeout_timestamp(int(rows["ts"].max()) + 100)
    return None


def test_event_time_timeouts_fire_below_the_watermark_only_for_idle_keys() -> None:
    plan = plan_for(expiring, None, timeout=TimeoutMode.EVENT_TIME)
    state = plan.blob_schema.empty_table()
    first = run_key_group(plan, 0, rows("a", "b", ts=1000), state, Clock(0, 0), 0)
    assert first.next_timeout_ms == 1100
    assert sort(first.changes)[0]["_timeout"] == 1100
    # Watermark 1100 is not past 1100: nothing fires.
    quiet = run_key_group(plan, 0, rows(ts=0).iloc[0:0], first.state, Clock(0, 1100), 1)
    assert quiet.changes.num_rows == 0
    # Watermark 1101 passes both timeouts, but "b" has rows, so only "a" fires.
    fired = run_key_group(plan, 0, rows("b", ts=1050), first.state, Clock(0, 1101), 2)
    assert sort(fired.outputs[0]) == [{"word": "a", "count": -1}]
    assert sort(fired.changes) == [
        {"word": "a", "count": None, "_timeout": None, "_deleted": True},
        {"word": "b", "count": 2, "_timeout": 1150, "_deleted": False},
    ]
    assert fired.next_timeout_ms == 1150


def test_calling_a_key_clears_its_timeout_unless_set_again() -> None:
    def forgetful(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> None:
        return None

    plan = plan_for(None, forgetful, timeout=TimeoutMode.PROCESSING_TIME)
    state = pa.table(
        {"word": ["a", "b"], "count": [1, 1], "_timeout": [5_000, 6_000]}, schema=plan.blob_schema
    )
    outcome = run_key_group(plan, 0, rows("a"), state, CLOCK, 3)
    assert sort(outcome.changes) == [{"word": "a", "count": 1, "_timeout": None, "_deleted": False}]
    assert outcome.next_timeout_ms == 6_000


def test_vectorized_context_lists_timed_out_keys() -> None:
    seen: list[list[str]] = []

    def fn(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
        seen.append(sorted(ctx.timed_out["word"]))
        return KeyGroupResult(removed=ctx.timed_out)

    plan = plan_for(None, fn, timeout=TimeoutMode.PROCESSING_TIME)
    state = pa.table(
        {"word": ["a", "b", "c"], "count": [1, 1, 1], "_timeout": [500, 900, 5_000]},
        schema=plan.blob_schema,
    )
    outcome = run_key_group(plan, 0, rows("b"), state, CLOCK, 1)
    assert seen == [["a"]]
    assert outcome.keys_delta == -1


@pytest.mark.parametrize(
    ("mode", "timeout", "message"),
    [
        (TimeoutMode.NONE, 2_000, "declared without a timeout"),
        (TimeoutMode.PROCESSING_TIME, 1_000, "must be in the future"),
        (TimeoutMode.EVENT_TIME, 10, "older than the watermark"),
    ],
)
def test_invalid_timeouts_are_refused(mode: TimeoutMode, timeout: int, message: str) -> None:
    def fn(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
        return KeyGroupResult(
            state=pd.DataFrame({"word": ["a"], "count": [1], "_timeout": [timeout]})
        )

    plan = plan_for(None, fn, timeout=mode)
    with pytest.raises(InvalidTimeoutError, match=message):
        run_key_group(plan, 0, rows("a"), plan.blob_schema.empty_table(), Clock(1_000, 500), 0)


def test_key_state_guards_its_timeout_calls() -> None:
    state = KeyState(
        ("a",),
        ["count"],
        None,
        timeout_mode=TimeoutMode.EVENT_TIME,
        clock=Clock(0, 500),
        time_zone="UTC",
        has_timed_out=False,
        timeout_ms=None,
    )
    with pytest.raises(
        InvalidTimeoutError, match="needs an operator declared with timeout='processing_time'"
    ):
        state.set_timeout_duration(10)
    with pytest.raises(InvalidTimeoutError, match="older than the current watermark 500"):
        state.set_timeout_timestamp(499)
    with pytest.raises(SchemaMismatchError, match="missing"):
        state.update({"total": 1})
    assert (state.current_processing_time_ms, state.current_watermark_ms) == (0, 500)


def test_a_processing_time_duration_may_be_a_numpy_integer() -> None:
    state = KeyState(
        ("a",),
        ["count"],
        None,
        timeout_mode=TimeoutMode.PROCESSING_TIME,
        clock=Clock(1_000, 0),
        time_zone="UTC",
        has_timed_out=False,
        timeout_ms=None,
    )
    state.set_timeout_duration(np.int64(250))
    assert state.new_timeout_ms == 1_250
    assert type(state.new_timeout_ms) is int
    for bad in (np.int64(0), np.bool_(True), 2.5, True):
        with pytest.raises(InvalidTimeoutError, match="duration must be a positive number"):
            state.set_timeout_duration(bad)  # type: ignore[arg-type]


def test_null_and_unicode_keys_keep_their_state() -> None:
    plan = plan_for(per_key, None)
    keys = pd.DataFrame({"word": [None, "ü", None, "日本"], "ts": [0, 0, 0, 0]})
    first = run_key_group(plan, 0, keys, plan.blob_schema.empty_table(), CLOCK, 0)
    second = run_key_group(plan, 0, keys.iloc[:1], first.state, CLOCK, 1)
    assert sort(second.changes) == [{"word": None, "count": 3, "_timeout": None, "_deleted": False}]
    assert second.keys_delta == 0


def test_nested_state_values_are_diffed() -> None:
    state_schema = arrow_schema(("tags", pa.list_(pa.string())))
    plan = OperatorPlan(
        "tags",
        ("word",),
        INPUT,
        state_schema,
        OUTPUT,
        TimeoutMode.NONE,
        lambda rows, state, ctx: KeyGroupResult(
            state=pd.DataFrame({"word": ["a", "b"], "tags": [["x"], ["y", "z"]]})
        ),
    )
    first = run_key_group(plan, 0, rows("a", "b"), plan.blob_schema.empty_table(), CLOCK, 0)
    second = run_key_group(plan, 0, rows("a", "b"), first.state, CLOCK, 1)
    assert first.changes.num_rows == 2
    assert second.changes.num_rows == 0


def test_a_key_group_state_above_the_bound_is_refused() -> None:
    plan = dataclasses.replace(plan_for(vectorized_fn=vectorized), max_state_bytes=600)
    small = run_key_group(plan, 3, rows("a", "b"), plan.blob_schema.empty_table(), CLOCK, 0)
    assert len(plan.encode_state(small.state, 3, 0)) <= 600
    words = [f"word-{i}" for i in range(200)]
    large = run_key_group(plan, 3, rows(*words), small.state, CLOCK, 1)
    with pytest.raises(StateTooLargeError) as raised:
        plan.encode_state(large.state, 3, 1)
    message = str(raised.value)
    assert message.startswith("operator 'wc', epoch 1, key group 3: the key group's state holds ")
    assert "(202 keys), above max_key_group_state_bytes=600" in message
    assert "raise key_groups" in message
    assert "raise max_key_group_state_bytes" in message


def test_the_watermark_floor_drops_late_rows_for_event_time_timeouts_only() -> None:
    floored = dataclasses.replace(
        plan_for(per_key, timeout=TimeoutMode.EVENT_TIME),
        event_time="ts",
        watermark_floor_ms=5,
    )
    arrived = pd.DataFrame({"word": ["a", "b", "c", "r"], "ts": [4_999, 5_000, 9_000, None]})
    assert floored.without_late_rows(arrived, 0)["word"].tolist() == ["b", "c", "r"]
    assert floored.watermark(3) == 5
    assert floored.watermark(7) == 7
    assert floored.watermark(None) is None
    no_timers = dataclasses.replace(floored, timeout=TimeoutMode.NONE)
    assert no_timers.without_late_rows(arrived, 0) is arrived
    no_watermark = dataclasses.replace(floored, event_time=None)
    assert no_watermark.without_late_rows(arrived, 0) is arrived
    # after a restore epoch: micro-batch 0 judges rows by the installed epoch's watermark
    restored = dataclasses.replace(floored, watermark_floor_ms=9, first_batch_floor_ms=4)
    assert restored.without_late_rows(arrived, 0)["word"].tolist() == ["a", "b", "c", "r"]
    assert restored.without_late_rows(arrived, 1)["word"].tolist() == ["c", "r"]
    assert restored.watermark(3) == 9


def test_a_stateless_operator_passes_rows_through_and_may_not_keep_state() -> None:
    @vectorized_operator(key="word", output_schema="word string, count long")
    def passing(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
        assert list(state.columns) == ["word", "_stateless", "_timeout"]
        return KeyGroupResult(output=rows.assign(count=1)[["word", "count"]])

    @operator(key="word", output_schema="word string, count long")
    def keeping(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
        state.update({"count": len(rows)})
        return None

    assert passing.stateless
    assert keeping.stateless
    stateless = arrow_schema((STATELESS_COLUMN, pa.bool_()))
    plan = word_plan(passing.function, state_schema=stateless)
    assert plan.stateless
    outcome = run_key_group(plan, 1, rows("a", "b"), plan.blob_schema.empty_table(), CLOCK, 0)
    assert outcome.changes.num_rows == 0
    assert sort(outcome.outputs[0]) == [{"word": "a", "count": 1}, {"word": "b", "count": 1}]

    plan = word_plan(keeping.function, state_schema=stateless)
    with pytest.raises(OperatorError, match="declared without state_schema; declare the state"):
        run_key_group(plan, 1, rows("a"), plan.blob_schema.empty_table(), CLOCK, 0)


def _lookup(state: pd.DataFrame, word: str) -> int:
    counts: dict[str, int] = dict(zip(state["word"], state["count"], strict=True))
    return counts[word]


def test_a_user_error_shows_the_users_own_lines_and_not_the_librarys() -> None:
    def counting(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
        total = _lookup(state, "missing")
        return KeyGroupResult(output=rows.assign(count=total))

    plan = plan_for(None, counting)
    with pytest.raises(OperatorError) as raised:
        run_key_group(plan, 7, rows("a"), plan.blob_schema.empty_table(), CLOCK, 2)
    message = str(raised.value)
    here = Path(__file__)
    assert f"(at {here}:" in message
    assert 'in counting: total = _lookup(state, "missing") -> ' in message
    assert "in _lookup: return counts[word])" in message
    assert "pyspark_abs" not in message
    assert "pandas" not in message
    assert "\n" not in message
