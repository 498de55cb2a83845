import random

import numpy as np
import pyarrow as pa
import pytest

from pyspark_abs.operators.changelog import duplicate_changes, latest_per_key, stable_order


def changelog(rows: list[tuple[str | None, int, int, bool]]) -> pa.Table:
    keys, values, epochs, deleted = zip(*rows, strict=True)
    return pa.table(
        {
            "k": pa.array(keys, pa.string()),
            "v": pa.array(values, pa.int64()),
            "_epoch": pa.array(epochs, pa.int64()),
            "_deleted": pa.array(deleted, pa.bool_()),
        }
    )


ROWS = [
    ("a", 1, 0, False),
    ("b", 5, 0, False),
    ("a", 2, 1, False),
    (None, 7, 1, False),
    ("b", 5, 2, True),
    ("a", 3, 3, False),
]


def as_dict(table: pa.Table) -> dict[object, object]:
    return dict(zip(table["k"].to_pylist(), table["v"].to_pylist(), strict=True))


def test_latest_per_key_as_of_each_epoch() -> None:
    changes = changelog(ROWS)
    assert as_dict(latest_per_key(changes, ["k"], 0)) == {"a": 1, "b": 5}
    assert as_dict(latest_per_key(changes, ["k"], 1)) == {"a": 2, "b": 5, None: 7}
    assert as_dict(latest_per_key(changes, ["k"], 2)) == {"a": 2, None: 7}
    assert as_dict(latest_per_key(changes, ["k"])) == {"a": 3, None: 7}
    for newest_or_later in (3, 9):
        assert as_dict(latest_per_key(changes, ["k"], newest_or_later)) == {"a": 3, None: 7}


def test_latest_per_key_can_keep_tombstones() -> None:
    latest = latest_per_key(changelog(ROWS), ["k"], 2, keep_deleted=True)
    assert dict(zip(latest["k"].to_pylist(), latest["_deleted"].to_pylist(), strict=True)) == {
        "a": False,
        "b": True,
        None: False,
    }


def test_latest_per_key_of_nothing() -> None:
    assert latest_per_key(changelog(ROWS), ["k"], -1).num_rows == 0


def test_duplicate_changes_finds_a_key_changed_twice_in_one_epoch() -> None:
    assert duplicate_changes(changelog(ROWS), ["k"]).num_rows == 0
    doubled = changelog([*ROWS, ("a", 2, 1, False)])
    found = duplicate_changes(doubled, ["k"])
    assert found["k"].to_pylist() == ["a", "a"]
    assert found["_epoch"].to_pylist() == [1, 1]


KEY_TYPES: dict[str, tuple[pa.DataType, list[object]]] = {
    "string": (pa.string(), ["a", "b", "c", "d"]),
    "int64": (pa.int64(), [-(2**63), -1, 0, 7, 2**63 - 1]),
    "uint64": (pa.uint64(), [0, 1, 2**63, 2**64 - 1]),
    "int8": (pa.int8(), [-128, 0, 127]),
    "int64_wide": (pa.int64(), [-(10**9), 0, 70_000, 10**12]),
}


@pytest.mark.parametrize("with_nulls", [False, True])
@pytest.mark.parametrize("key_type", sorted(KEY_TYPES))
@pytest.mark.parametrize("seed", range(25))
def test_random_changelogs_give_the_latest_change_of_each_key_as_a_model_does(
    seed: int, key_type: str, with_nulls: bool
) -> None:
    """Keys of one column and of two, each epoch changing a key at most once, in any row
    order or in epoch order; the model keeps, per key, the row of the highest epoch up to the one asked."""
    rng = random.Random(seed)
    arrow_type, values = KEY_TYPES[key_type]

    def key() -> object:
        return None if with_nulls and rng.random() < 0.2 else rng.choice(values)

    for keys in (["k"], ["k", "j"]):
        rows: dict[tuple[object, str, int], tuple[int, bool]] = {}
        seen = set()
        for epoch in range(rng.randint(0, 6)):
            for _ in range(rng.randint(0, 6)):
                k, j = key(), rng.choice("xy")
                name = (k,) if keys == ["k"] else (k, j)
                if (name, epoch) not in seen:  # a key changes at most once per epoch
                    seen.add((name, epoch))
                    rows[(k, j, epoch)] = (rng.randint(0, 99), rng.random() < 0.3)
        order = list(rows)
        if rng.random() < 0.7:  # else in epoch order, as most tables read
            rng.shuffle(order)
        table = pa.table(
            {
                "k": pa.array([k for k, _, _ in order], arrow_type),
                "j": pa.array([j for _, j, _ in order], pa.string()),
                "v": pa.array([rows[r][0] for r in order], pa.int64()),
                "_epoch": pa.array([e for _, _, e in order], pa.int64()),
                "_deleted": pa.array([rows[r][1] for r in order], pa.bool_()),
            }
        )
        for as_of in (None, *range(-1, 7)):
            model: dict[tuple[object, ...], tuple[int, int, bool]] = {}
            for (k, j, epoch), (value, deleted) in rows.items():
                name = (k,) if keys == ["k"] else (k, j)
                if (as_of is None or epoch <= as_of) and epoch >= model.get(name, (-1,))[0]:
                    model[name] = (epoch, value, deleted)
            want = {name: v for name, (_, v, deleted) in model.items() if not deleted}
            latest = latest_per_key(table, keys, as_of)
            got = {tuple(row[c] for c in keys): row["v"] for row in latest.to_pylist()}
            assert len(got) == latest.num_rows
            assert got == want, (keys, as_of)


@pytest.mark.parametrize("span", [1, 3, 2**16 - 1, 2**16, 2**20, 2**40, 2**62, 2**64 - 1])
@pytest.mark.parametrize("seed", range(5))
def test_stable_order_sorts_as_a_stable_argsort_at_every_span(seed: int, span: int) -> None:
    """Each of its three ways (16-bit radix, values packed with row numbers, the plain
    stable argsort) must give numpy's stable order, duplicates in row order."""
    rng = random.Random(seed)
    low = rng.randint(-(2**63), 2**63 - 1 - span)
    picks = [low + rng.randint(0, span) for _ in range(rng.randint(0, 40))]
    values = np.array([*picks, *rng.choices(picks, k=len(picks))], dtype=np.int64)
    assert stable_order(values).tolist() == np.argsort(values, kind="stable").tolist()


def test_stable_order_of_an_array_sorted_in_two_halves() -> None:
    """From a million rows the packed sort runs on two threads and merges their halves."""
    rng = np.random.default_rng(7)
    values = rng.integers(-(2**30), 2**30, (1 << 20) + 3) * 1009
    values[::5] = values[1::5][: len(values[::5])]  # duplicates, for the stability
    assert np.array_equal(stable_order(values), np.argsort(values, kind="stable"))
