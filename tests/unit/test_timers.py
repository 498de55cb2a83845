"""Several timers per key (``operator(..., timers=True)``), without Spark.

The generative test runs random schedules through the engine's key-group step and checks
every epoch's outputs and state against a model that keeps each key's timers as a Python
set and fires them by the rule the user guide states.
"""

from __future__ import annotations

import random
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from pyspark_abs import KeyState, TimeoutMode, operator
from pyspark_abs.errors import InvalidTimeoutError, OperatorDefinitionError
from pyspark_abs.operators.contract import Clock
from pyspark_abs.operators.key_group import run_key_group
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.timers import split_due, stored_timers
from tests.support.key_groups import STATE, assert_kept_rows, rows, sort, word_plan
from tests.support.timers import remind

TIMERS_STATE = STATE.append(pa.field("_timers", pa.list_(pa.int64())))
TIMERS_OPERATOR: dict[str, Any] = {
    "key": "word",
    "state_schema": "count long",
    "output_schema": "word string, count long",
    "timeout": "event_time",
    "timers": True,
}
"""The declaration of the test's timers operators."""
FIRST, SECOND = 100, 250
"""Each event at ``ts`` registers timers at ``ts + FIRST`` and ``ts + SECOND``."""


@operator(**TIMERS_OPERATOR)
def reminders(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
    fired = remind(state, [int(t) for t in rows["ts"]], FIRST, SECOND, 7)
    return [{"word": key[0], "count": t} for t in fired]


def plan_of(op: Any) -> OperatorPlan:
    return word_plan(op.function, TimeoutMode.EVENT_TIME, state_schema=TIMERS_STATE)


class Model:
    """Each key's count and set of timers; as in Spark's transformWithState, a timer fires in
    the first micro-batch whose watermark has reached it, with its key's rows, or right after
    them if the rows registered it."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[int, set[int]]] = {}

    def epoch(self, events: list[tuple[str, int]], watermark: int) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        by_key: dict[str, list[int]] = {}
        for word, ts in events:
            by_key.setdefault(word, []).append(ts)
        due = {w for w, (_, timers) in self.keys.items() if any(t <= watermark for t in timers)}
        for word in sorted(set(by_key) | due):
            count, timers = self.keys.get(word, (0, set()))
            times = by_key.get(word, [])
            while True:
                fired = sorted(t for t in timers if t <= watermark)
                timers = timers - set(fired)
                out += [(word, t) for t in fired]
                for ts in times:
                    timers |= {ts + FIRST, ts + SECOND}
                    if ts % 7 == 0:
                        timers = {t for t in timers if t <= ts + FIRST}
                if not times and not timers:
                    self.keys.pop(word, None)
                    break
                count += len(times)
                self.keys[word] = (count, timers)
                if not any(t <= watermark for t in timers):
                    break
                times = []
        return sorted(out)

    def state(self) -> list[dict[str, Any]]:
        return [
            {
                "word": w,
                "count": c,
                "_timers": sorted(t),
                "_timeout": min(t) if t else None,
            }
            for w, (c, t) in sorted(self.keys.items())
        ]


@pytest.mark.parametrize("seed", range(25))
def test_random_schedules_fire_every_timer_once_as_the_model_does(seed: int) -> None:
    rng = random.Random(seed)
    plan = plan_of(reminders)
    state = plan.blob_schema.empty_table()
    model = Model()
    watermark, newest = 0, 0
    for epoch in range(12):
        events = [
            (rng.choice("abcd"), watermark + rng.randrange(0, 300))
            for _ in range(rng.randrange(0, 5))
        ]
        frame = pd.DataFrame(events, columns=["word", "ts"]).astype({"ts": "int64"})
        outcome = run_key_group(plan, 0, frame, state, Clock(0, watermark), epoch)
        assert_kept_rows(state, outcome)
        expected = model.epoch(events, watermark)
        fired = sorted((r["word"], r["count"]) for r in outcome.outputs[0].to_pylist())
        assert fired == expected, f"seed {seed}, epoch {epoch}"
        assert sort(outcome.state) == model.state(), f"seed {seed}, epoch {epoch}"
        pending = [t for _, (_, ts) in model.keys.items() for t in ts]
        assert outcome.next_timeout_ms == (min(pending) if pending else None)
        state = outcome.state
        newest = max([newest, *(ts for _, ts in events)])
        watermark = max(watermark, newest - rng.choice([0, 0, 50]))


def test_a_key_with_rows_gets_its_due_timers_in_the_same_call() -> None:
    plan = plan_of(reminders)
    first = run_key_group(plan, 0, rows("a", ts=1), plan.blob_schema.empty_table(), Clock(0, 0), 0)
    assert sort(first.state) == [{"word": "a", "count": 1, "_timers": [101, 251], "_timeout": 101}]
    second = run_key_group(plan, 0, rows("a", ts=200), first.state, Clock(0, 200), 1)
    assert sort(second.outputs[0]) == [{"word": "a", "count": 101}]
    assert sort(second.state) == [
        {"word": "a", "count": 2, "_timers": [251, 300, 450], "_timeout": 251}
    ]


def test_timers_are_refused_where_they_cannot_work() -> None:
    def fn(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
        state.set_timeout_timestamp(10_000)

    timed = operator(
        key="word",
        state_schema="count long",
        output_schema="word string, count long",
        timeout="event_time",
        timers=True,
    )
    with pytest.raises(InvalidTimeoutError, match=r"declared with timers=True; use state\.reg"):
        run_key_group(plan_of(timed(fn)), 0, rows("a"), empty(), Clock(0, 0), 0)

    def again(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
        state.update({"count": 1})
        state.register_timer(10)  # at or before the clock: due again after every call

    with pytest.raises(InvalidTimeoutError, match=r"before the clock \(50 ms\) in each of 100"):
        run_key_group(plan_of(timed(again)), 0, rows("a"), empty(), Clock(0, 50), 0)

    def stateless_key(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
        state.register_timer(10_000)

    with pytest.raises(InvalidTimeoutError, match=r"registered timers \[10000\] for a key"):
        run_key_group(plan_of(timed(stateless_key)), 0, rows("a"), empty(), Clock(0, 0), 0)

    with pytest.raises(OperatorDefinitionError, match="timers=True needs a clock"):
        operator(key="w", state_schema="n long", output_schema="w string", timers=True)(fn)
    with pytest.raises(OperatorDefinitionError, match="cannot be combined with ttl"):
        operator(
            key="w",
            state_schema="n long",
            output_schema="w string",
            ttl=pd.Timedelta(days=1).to_pytimedelta(),
            timers=True,
        )(fn)
    clashing = StructType([StructField("_timers", LongType())])
    declaring = operator(
        key="w", state_schema=clashing, output_schema="w string", timeout="event_time", timers=True
    )
    with pytest.raises(OperatorDefinitionError, match="'_timers' is where timers=True keeps"):
        declaring(fn)


def test_plain_timeouts_refuse_the_timer_calls() -> None:
    def fn(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
        state.list_timers()

    op = operator(
        key="word", state_schema="count long", output_schema="word string", timeout="event_time"
    )(fn)
    with pytest.raises(InvalidTimeoutError, match="needs an operator declared with timers=True"):
        run_key_group(
            word_plan(op.function, TimeoutMode.EVENT_TIME),
            0,
            rows("a"),
            empty_plain(),
            Clock(0, 0),
            0,
        )


def test_times_computed_from_a_column_are_numpy_integers_and_accepted() -> None:
    @operator(**TIMERS_OPERATOR)
    def numpy_timers(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
        state.update({"count": len(rows)})
        state.register_timer(rows["ts"].max() + 100)  # numpy.int64, not int
        state.delete_timer(rows["ts"].min() + 100)
        state.register_timer(rows["ts"].astype("int32").max() + 300)

    plan = plan_of(numpy_timers)
    frame = pd.DataFrame({"word": ["a", "a"], "ts": [5, 9]})
    result = run_key_group(plan, 0, frame, empty(), Clock(0, 0), 0)
    assert sort(result.state) == [{"word": "a", "count": 2, "_timers": [109, 309], "_timeout": 109}]

    @operator(
        key="word", state_schema="count long", output_schema="word string", timeout="event_time"
    )
    def numpy_timeout(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
        state.update({"count": 1})
        state.set_timeout_timestamp(rows["ts"].max() + 50)

    plain = word_plan(numpy_timeout.function, TimeoutMode.EVENT_TIME)
    result = run_key_group(plain, 0, frame, empty_plain(), Clock(0, 0), 0)
    assert sort(result.state) == [{"word": "a", "count": 1, "_timeout": 59}]


def test_a_stored_timeout_becomes_the_one_timer_of_a_key() -> None:
    assert stored_timers(None, 500) == [500]
    assert stored_timers(None, None) == []
    assert stored_timers([300, 100, 300], 100) == [100, 300]
    assert split_due([300, 100, 200], 200) == ([100, 200], [300])
    assert split_due([100], None) == ([], [100])


def empty() -> pa.Table:
    return plan_of(reminders).blob_schema.empty_table()


def empty_plain() -> pa.Table:
    return word_plan(None).blob_schema.empty_table()


def test_a_timer_at_or_before_the_watermark_fires_after_the_rows_in_the_same_batch() -> None:
    """Spark's EventTimeStatefulProcessor: each event registers a timer at the watermark
    (0 in the first batch), which fires in the same batch, after the rows."""

    def at_watermark(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
        out = [{"word": key[0], "count": len(rows)}] if len(rows) else []
        if len(rows):
            state.update({"count": len(rows)})
            state.register_timer(state.current_watermark_ms or 0)
        return out + [{"word": f"{key[0]}-expired", "count": t} for t in state.expired_timers]

    plan = plan_of(operator(**TIMERS_OPERATOR)(at_watermark))
    first = run_key_group(plan, 0, rows("a"), empty(), Clock(0, 0), 0)
    assert sort(first.outputs[0]) == [{"word": "a", "count": 1}, {"word": "a-expired", "count": 0}]
    assert sort(first.state) == [{"word": "a", "count": 1, "_timers": [], "_timeout": None}]
    second = run_key_group(plan, 0, rows("a"), first.state, Clock(0, 10_000), 1)
    assert sort(second.outputs[0]) == [
        {"word": "a", "count": 1},
        {"word": "a-expired", "count": 10_000},
    ]
