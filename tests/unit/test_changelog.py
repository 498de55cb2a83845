import pyarrow as pa

from pyspark_abs.operators.changelog import duplicate_changes, latest_per_key


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
