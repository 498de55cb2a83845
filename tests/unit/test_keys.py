import random

import pyarrow as pa
import pytest

from pyspark_abs.operators.keys import contains, key_arrays, positions, repeated


def test_single_column_keys_match_nulls_and_nan() -> None:
    state = pa.table({"k": [1.0, None, float("nan"), 4.0]})
    found = pa.table({"k": [None, 4.0, 9.0, float("nan")]})
    state_keys, found_keys = key_arrays([state, found], ["k"])
    assert positions(found_keys, state_keys).tolist() == [1, 3, -1, 2]
    assert contains(found_keys, state_keys).tolist() == [True, True, False, True]


def test_composite_keys_are_coded_jointly() -> None:
    a = pa.table({"x": [1, 1, 2, None], "y": ["p", "q", "p", "p"]})
    b = pa.table({"x": [2, 1, None, 1], "y": ["p", "p", "p", "r"]})
    a_keys, b_keys = key_arrays([a, b], ["x", "y"])
    assert positions(b_keys, a_keys).tolist() == [2, 0, 3, -1]


def test_repeated_keys() -> None:
    keys = pa.array(["a", "b", "a", None, None, "c"])
    assert repeated(keys).tolist() == [True, False, True, True, True, False]
    assert not repeated(pa.array([1, 2, 3])).any()
    assert positions(pa.array([1]), pa.array([], pa.int64())).tolist() == [-1]


@pytest.mark.parametrize("seed", range(30))
def test_positions_match_a_dictionary_lookup(seed: int) -> None:
    """Both ways of looking up (few keys among many rows, or not), repeated keys and nulls."""
    rng = random.Random(seed)
    among = rng.sample(range(1000), rng.randint(0, 300)) + [None] * rng.randint(0, 1)
    rng.shuffle(among)
    keys = [rng.choice([*range(1000), None]) for _ in range(rng.randint(0, 80))]
    row = {k: i for i, k in enumerate(among)}
    expected = [row.get(k, -1) for k in keys]
    assert positions(pa.array(keys, pa.int64()), pa.array(among, pa.int64())).tolist() == expected
