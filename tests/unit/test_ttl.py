"""State TTL in the per-key-group core: expiry stamping, lapsing, tombstones, refusals."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pandas as pd
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
from pyspark_abs.errors import InvalidTimeoutError, OperatorDefinitionError
from pyspark_abs.operators.key_group import run_key_group
from pyspark_abs.operators.per_key import PerKeyAdapter
from pyspark_abs.operators.plan import OperatorPlan
from tests.support.key_groups import assert_kept_rows, rows, sort, word_plan

TTL_MS = 10_000


def count(key: tuple[Any, ...], frame: pd.DataFrame, state: KeyState) -> Any:
    total = state.get({"count": 0})["count"] + len(frame)
    state.update({"count": total})
    return {"word": key[0], "count": total}


def ttl_plan(clock: TimeoutMode, fn: Any = None) -> OperatorPlan:
    function = fn or PerKeyAdapter(count, ("word",), TimeoutMode.NONE)
    return word_plan(function, clock, event_time="ts", ttl_ms=TTL_MS)


def test_a_processing_time_ttl_removes_keys_not_written_for_longer() -> None:
    plan = ttl_plan(TimeoutMode.PROCESSING_TIME)
    empty = plan.blob_schema.empty_table()
    first = run_key_group(plan, 0, rows("a", "b"), empty, Clock(1_000, None), 0)
    assert {r["word"]: r["_timeout"] for r in first.changes.to_pylist()} == {
        "a": 11_000,
        "b": 11_000,
    }
    assert first.next_timeout_ms == 11_000
    # a is written again at 5 s: its clock starts again; b is left alone
    second = run_key_group(plan, 0, rows("a"), first.state, Clock(5_000, None), 1)
    assert sort(second.changes) == [
        {"word": "a", "count": 2, "_timeout": 15_000, "_deleted": False}
    ]
    # at 11 s exactly b has not lapsed; past it b is tombstoned, without a call
    assert (
        run_key_group(plan, 0, rows()[:0], second.state, Clock(11_000, None), 2).changes.num_rows
        == 0
    )
    lapsed = run_key_group(plan, 0, rows()[:0], second.state, Clock(11_001, None), 3)
    assert_kept_rows(second.state, lapsed)
    assert sort(lapsed.changes) == [
        {"word": "b", "count": None, "_timeout": None, "_deleted": True}
    ]
    assert lapsed.outputs[0].num_rows == 0
    assert lapsed.keys_delta == -1
    assert sort(lapsed.state) == [{"word": "a", "count": 2, "_timeout": 15_000}]


def test_an_expired_key_with_new_rows_starts_again_from_empty_state() -> None:
    plan = ttl_plan(TimeoutMode.PROCESSING_TIME)
    first = run_key_group(
        plan, 0, rows("a", "a"), plan.blob_schema.empty_table(), Clock(0, None), 0
    )
    again = run_key_group(plan, 0, rows("a"), first.state, Clock(20_000, None), 1)
    assert sort(again.outputs[0]) == [{"word": "a", "count": 1}]
    assert sort(again.changes) == [{"word": "a", "count": 1, "_timeout": 30_000, "_deleted": False}]
    assert again.keys_delta == 0


def test_an_event_time_ttl_counts_from_the_keys_newest_event() -> None:
    plan = ttl_plan(TimeoutMode.EVENT_TIME)
    frame = pd.DataFrame({"word": ["a", "b", "a"], "ts": [3_000_000, 1_000_000, 7_000_000]})
    first = run_key_group(plan, 0, frame, plan.blob_schema.empty_table(), Clock(0, 2_000), 0)
    # event times are microseconds: a's newest is 7 s, b's 1 s is below the watermark 2 s
    assert {r["word"]: r["_timeout"] for r in first.changes.to_pylist()} == {
        "a": 17_000,
        "b": 12_000,
    }
    lapsed = run_key_group(plan, 0, rows()[:0], first.state, Clock(0, 12_001), 1)
    assert [r["word"] for r in lapsed.changes.to_pylist() if r["_deleted"]] == ["b"]


def test_a_function_that_removes_or_keeps_state_interacts_with_the_ttl() -> None:
    def fn(frame: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
        # expired keys are not shown, and no timeouts fire with a TTL
        assert ctx.timed_out.empty
        assert set(state["word"]) <= {"b"}
        return KeyGroupResult(removed=frame[["word"]].drop_duplicates())

    plan = ttl_plan(TimeoutMode.PROCESSING_TIME)
    first = run_key_group(
        plan, 0, rows("a", "b"), plan.blob_schema.empty_table(), Clock(0, None), 0
    )
    plan = dataclasses.replace(plan, function=fn)
    # past 10 s both have lapsed: a by its TTL although it has rows, so the function's
    # removal of a finds nothing to remove, and b because nothing wrote it
    gone = run_key_group(plan, 0, rows("a"), first.state, Clock(10_001, None), 1)
    assert_kept_rows(first.state, gone)
    assert sorted(r["word"] for r in gone.changes.to_pylist() if r["_deleted"]) == ["a", "b"]
    assert gone.state.num_rows == 0


def test_state_that_sets_its_own_timeout_is_refused_under_a_ttl() -> None:
    def fn(frame: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
        return KeyGroupResult(state=pd.DataFrame({"word": ["a"], "count": [1], "_timeout": [9]}))

    plan = ttl_plan(TimeoutMode.PROCESSING_TIME, fn)
    with pytest.raises(InvalidTimeoutError, match="has a ttl"):
        run_key_group(plan, 0, rows("a"), plan.blob_schema.empty_table(), Clock(0, None), 0)


def noop(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> None:
    return None


def test_a_ttl_is_declared_with_a_clock_and_not_with_timeouts() -> None:
    @operator(
        key="word",
        state_schema="count long",
        output_schema="word string",
        ttl=dt.timedelta(hours=1),
    )
    def hourly(key: Any, frame: Any, state: Any) -> None:
        return None

    assert (hourly.ttl_ms, hourly.timeout) == (3_600_000, TimeoutMode.PROCESSING_TIME)
    declared: dict[str, Any] = {
        "key": "word",
        "state_schema": "count long",
        "output_schema": "word string",
    }
    assert vectorized_operator(**declared)(noop).ttl_ms is None
    refused: list[tuple[dict[str, Any], str]] = [
        ({"ttl": dt.timedelta(0)}, "positive datetime.timedelta"),
        ({"ttl": 5}, "positive datetime.timedelta"),
        ({"ttl": dt.timedelta(seconds=1), "timeout": "event_time"}, "cannot be combined"),
        ({"ttl": dt.timedelta(seconds=1), "ttl_clock": "none"}, "ttl_clock must be one of"),
    ]
    for kwargs, message in refused:
        with pytest.raises(OperatorDefinitionError, match=message):
            vectorized_operator(**declared, **kwargs)(noop)


def test_a_row_without_an_event_time_counts_as_the_watermark() -> None:
    plan = ttl_plan(TimeoutMode.EVENT_TIME)
    frame = pd.DataFrame(
        {"word": ["a", "b"], "ts": pd.to_datetime(["NaT", "1970-01-01 00:00:09"], utc=True)}
    )
    first = run_key_group(plan, 0, frame, plan.blob_schema.empty_table(), Clock(0, 5_000), 0)
    assert {r["word"]: r["_timeout"] for r in first.changes.to_pylist()} == {
        "a": 15_000,
        "b": 19_000,
    }


def read_only(key: tuple[Any, ...], frame: pd.DataFrame, state: KeyState) -> Any:
    """Writes a key's state on its first call only, then just reads it."""
    if not state.exists:
        state.update({"count": len(frame)})
    return {"word": key[0], "count": state.get()["count"]}


@pytest.mark.parametrize("clock", [TimeoutMode.PROCESSING_TIME, TimeoutMode.EVENT_TIME])
def test_a_call_that_only_reads_a_key_leaves_its_ttl_clock_alone(clock: TimeoutMode) -> None:
    """As Spark's TTL state: the clock restarts on an update, not on every call."""
    plan = ttl_plan(clock, PerKeyAdapter(read_only, ("word",), TimeoutMode.NONE))
    empty = plan.blob_schema.empty_table()
    first = run_key_group(plan, 0, rows("a", ts=1_000_000), empty, Clock(1_000, 1_000), 0)
    [written] = first.state.to_pylist()
    assert written["_timeout"] == 1_000 + TTL_MS  # the clock or the event time, 1 s
    second = run_key_group(plan, 0, rows("a", ts=5_000_000), first.state, Clock(5_000, 5_000), 1)
    assert second.changes.num_rows == 0
    assert second.state.to_pylist() == [written]
    assert sort(second.outputs[0]) == [{"word": "a", "count": 1}]
