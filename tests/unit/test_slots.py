"""Slots: one call of the function serving several key groups, as if each were called alone."""

import random
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from pyspark_abs import Clock, KeyGroupContext, KeyGroupResult, TimeoutMode
from pyspark_abs.errors import OperatorError, StateEncodingError
from pyspark_abs.operators.key_group import run_key_group, run_key_groups
from pyspark_abs.operators.partitioning import murmur3_int, slot_of, slot_values
from pyspark_abs.operators.state_codec import SlotEntry, decode_slot, encode_slot
from tests.support.key_groups import assert_kept_rows, rows, sort, word_plan

GROUPS = (1, 5, 9, 13)
"""The key groups of one slot (slot 1 of 4)."""


def counting(
    rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext, *, timeouts: bool
) -> KeyGroupResult:
    """Counts words; a word expires 100 ms per letter after its last row (unless a ttl
    keeps expiries); every third count is removed. Each key's fate depends on it alone."""
    seen = rows.astype({"word": object}).groupby("word").size().rename("n").reset_index()
    merged = seen.merge(state[["word", "count"]], on="word", how="left")
    merged["count"] = merged["count"].fillna(0).astype("int64") + merged["n"]
    gone = merged["count"] % 3 == 0
    kept = merged.loc[~gone, ["word", "count"]].copy()
    if timeouts:
        kept["_timeout"] = ctx.clock.processing_time_ms + 100 * kept["word"].str.len()
    removed = pd.concat([merged.loc[gone, ["word"]], ctx.timed_out[["word"]]])
    return KeyGroupResult(state=kept, removed=removed, output=merged[["word", "count"]])


def group_of(word: str) -> int:
    """A word's key group among GROUPS (any fixed assignment will do here)."""
    return GROUPS[sum(map(ord, word)) % len(GROUPS)]


@pytest.mark.parametrize("seed", range(12))
def test_one_call_for_a_slot_equals_one_call_per_key_group(seed: int) -> None:
    draw = random.Random(seed)
    ttl = draw.random() < 0.3
    plan = word_plan(
        partial(counting, timeouts=not ttl),
        TimeoutMode.PROCESSING_TIME,
        **({"ttl_ms": 250} if ttl else {}),
    )
    words = ["a", "bb", "ccc", "dd", "e", "fff", "gggg", "h", "ii"]
    alone = {k: plan.blob_schema.empty_table() for k in GROUPS}
    together = dict(alone)
    time = 1_000
    for epoch in range(10):
        time += draw.choice([0, 50, 150, 400])
        clock = Clock(time, None)
        batch = rows(*draw.choices(words, k=draw.randint(0, 8)))
        batch = batch.sample(frac=1, random_state=seed).reset_index(drop=True)
        batch_groups = np.array([group_of(w) for w in batch["word"]], dtype=np.int64)
        expected = {}
        for k in GROUPS:
            mine = batch[batch_groups == k].reset_index(drop=True)
            expected[k] = run_key_group(plan, k, mine, alone[k], clock, epoch)
            assert_kept_rows(alone[k], expected[k])
        sizes = [together[k].num_rows for k in GROUPS]
        state = pa.concat_tables([together[k] for k in GROUPS])
        outputs, outcomes = run_key_groups(
            plan, GROUPS, sizes, batch, batch_groups, state, clock, epoch
        )
        assert sort(outputs[0]) == sort(pa.concat_tables([expected[k].outputs[0] for k in GROUPS]))
        for k, outcome in zip(GROUPS, outcomes, strict=True):
            want = expected[k]
            assert_kept_rows(together[k], outcome)
            assert outcome.state.to_pylist() == want.state.to_pylist(), (epoch, k)
            assert sort(outcome.changes) == sort(want.changes), (epoch, k)
            assert outcome.keys_delta == want.keys_delta
            assert outcome.next_timeout_ms == want.next_timeout_ms
            together[k] = outcome.state
            alone[k] = want.state


def test_a_call_of_several_key_groups_says_so() -> None:
    calls: list[KeyGroupContext] = []

    def failing(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> Any:
        calls.append(ctx)
        raise ValueError("no")

    plan = word_plan(failing)
    batch = rows("a", "bb")
    groups = np.array([1, 5], dtype=np.int64)
    empty = plan.blob_schema.empty_table()
    with pytest.raises(OperatorError, match=r"epoch 3, key groups 1, 5, 9, 13: the function"):
        run_key_groups(plan, GROUPS, [0] * 4, batch, groups, empty, Clock(0, None), 3)
    assert (calls[0].key_group, calls[0].key_groups) == (1, GROUPS)
    many = tuple(range(0, 40, 4))
    with pytest.raises(OperatorError, match=r"key groups 0, 4, 8, 12, 16, 20 and 4 more:"):
        run_key_groups(plan, many, [0] * 10, batch, groups, empty, Clock(0, None), 3)


def test_a_slot_keeps_each_key_groups_value_and_timeout() -> None:
    entries = {
        7: SlotEntry(b"ABSM" + bytes(range(40)), 1_700_000_000_000),
        3: SlotEntry(b"", None),
        -1: SlotEntry(b"x" * 300, -5),
    }
    assert decode_slot(encode_slot(entries)) == entries
    assert decode_slot(encode_slot({})) == {}


@pytest.mark.parametrize("cut", [1, 9, 20, 40])
def test_a_damaged_slot_is_refused(cut: int) -> None:
    value = encode_slot({1: SlotEntry(b"m" * 30, 5), 2: SlotEntry(b"n" * 3, None)})
    with pytest.raises(StateEncodingError, match=r"cut short|magic bytes"):
        decode_slot(value[:-cut])
    with pytest.raises(StateEncodingError, match="checkpoint is damaged"):
        decode_slot(value + b"!")
    with pytest.raises(StateEncodingError, match="another layout"):
        decode_slot(b"ABS3" + value[4:])


@pytest.mark.parametrize("slots", [1, 2, 3, 4, 8, 200])
def test_each_slot_lands_on_its_own_partition(slots: int) -> None:
    values = slot_values(slots)
    assert len(set(values)) == slots
    assert [murmur3_int(v) % slots for v in values] == list(range(slots))
    assert {slot_of(k, slots) for k in range(256)} == set(range(min(slots, 256)))
