"""Offset planning of the Delta stream source: pure functions over per-version row counts."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from decimal import Decimal

import pyarrow as pa
import pytest

from pyspark_abs.errors import ConfigError
from pyspark_abs.sources import DeltaSource
from pyspark_abs.sources.delta.files import partition_array
from pyspark_abs.sources.delta.offsets import (
    Offset,
    Planned,
    RowSlice,
    VersionRows,
    plan_next,
    plan_slices,
)

# Version 0: files of 3 and 2 rows; version 1: nothing appended; version 2: one file of 4.
TABLE = (VersionRows(0, (3, 2)), VersionRows(1, ()), VersionRows(2, (4,)))


def from_version(versions: Sequence[VersionRows], start: Offset) -> list[VersionRows]:
    return [v for v in versions if v.version >= start.version]


def batches(
    versions: Sequence[VersionRows],
    start: Offset,
    max_rows: int | None = None,
    max_files: int | None = None,
) -> list[tuple[Offset, list[RowSlice]]]:
    """Every micro-batch from ``start`` until no more data: (end, slices)."""
    result: list[tuple[Offset, list[RowSlice]]] = []
    while True:
        planned = plan_next(
            from_version(versions, start), start, max_rows=max_rows, max_files=max_files
        )
        assert planned.blocked is None
        if planned.end == start:
            return result
        result.append((planned.end, plan_slices(from_version(versions, start), start, planned.end)))
        start = planned.end


def test_everything_available_ends_after_the_last_version() -> None:
    start = Offset(0, 0)
    assert plan_next(TABLE, start) == Planned(Offset(3, 0))
    assert plan_slices(TABLE, start, Offset(3, 0)) == [
        RowSlice(0, 0, 0, 3),
        RowSlice(0, 1, 0, 2),
        RowSlice(2, 0, 0, 4),
    ]


def test_no_new_versions_returns_the_start_offset() -> None:
    assert plan_next([], Offset(3, 0)) == Planned(Offset(3, 0))
    assert plan_slices([], Offset(3, 0), Offset(3, 0)) == []


def test_max_rows_splits_files_and_skips_empty_versions() -> None:
    planned = batches(TABLE, Offset(0, 0), max_rows=2)
    assert [end for end, _ in planned] == [
        Offset(0, 2),
        Offset(0, 4),
        Offset(2, 1),
        Offset(2, 3),
        Offset(3, 0),
    ]
    assert [slices for _, slices in planned] == [
        [RowSlice(0, 0, 0, 2)],
        [RowSlice(0, 0, 2, 3), RowSlice(0, 1, 0, 1)],
        [RowSlice(0, 1, 1, 2), RowSlice(2, 0, 0, 1)],
        [RowSlice(2, 0, 1, 3)],
        [RowSlice(2, 0, 3, 4)],
    ]


def test_max_files_takes_the_rest_of_a_file_as_one_file() -> None:
    assert [end for end, _ in batches(TABLE, Offset(0, 0), max_files=1)] == [
        Offset(0, 3),
        Offset(1, 0),
        Offset(3, 0),
    ]
    assert plan_next(TABLE, Offset(0, 1), max_files=1) == Planned(Offset(0, 3))
    assert plan_slices(TABLE, Offset(0, 1), Offset(0, 3)) == [RowSlice(0, 0, 1, 3)]
    assert plan_next(TABLE, Offset(0, 1), max_files=2) == Planned(Offset(1, 0))


def test_a_limit_reached_at_the_end_of_a_version_does_not_read_the_next() -> None:
    def exploding() -> Iterator[VersionRows]:
        yield VersionRows(0, (2,))
        raise AssertionError("read a version beyond the limit")

    assert plan_next(exploding(), Offset(0, 0), max_rows=2) == Planned(Offset(1, 0))
    assert plan_next(exploding(), Offset(0, 0), max_files=1) == Planned(Offset(1, 0))


def test_a_blocked_version_stops_planning_after_the_rows_before_it() -> None:
    versions = [VersionRows(0, (2,)), VersionRows(1, blocked="version 1 removes data")]
    assert plan_next(versions, Offset(0, 0)) == Planned(Offset(1, 0), "version 1 removes data")
    assert plan_slices(versions, Offset(0, 0), Offset(1, 0)) == [RowSlice(0, 0, 0, 2)]
    assert plan_next(versions[1:], Offset(1, 0)) == Planned(Offset(1, 0), "version 1 removes data")
    with pytest.raises(ValueError, match="version 1 removes data"):
        plan_slices(versions, Offset(0, 0), Offset(2, 0))


def test_zero_row_files_are_never_sliced_nor_counted() -> None:
    versions = [VersionRows(0, (0, 2, 0, 1))]
    assert plan_next(versions, Offset(0, 0), max_files=1) == Planned(Offset(0, 2))
    assert plan_slices(versions, Offset(0, 0), Offset(1, 0)) == [
        RowSlice(0, 1, 0, 2),
        RowSlice(0, 3, 0, 1),
    ]


@pytest.mark.parametrize("seed", range(20))
def test_any_limit_reads_every_row_exactly_once(seed: int) -> None:
    rng = random.Random(seed)
    versions = [
        VersionRows(v, tuple(rng.choice([0, 1, 2, 5, 7]) for _ in range(rng.randint(0, 3))))
        for v in range(rng.randint(1, 6))
    ]
    start_version = rng.randrange(len(versions))
    start = Offset(start_version, rng.randint(0, sum(versions[start_version].files)))
    max_rows = rng.choice([None, 1, 3, 8])
    max_files = rng.choice([None, 1, 2]) if max_rows is None else None

    read: list[tuple[int, int, int]] = []
    for _, slices in batches(versions, start, max_rows, max_files):
        if max_rows is not None:
            assert sum(s.stop - s.start for s in slices) <= max_rows
        if max_files is not None:
            assert len(slices) <= max_files
        read += [(s.version, s.file, row) for s in slices for row in range(s.start, s.stop)]

    expected = []
    for entry in versions[start.version :]:
        position = 0
        for number, rows in enumerate(entry.files):
            for row in range(rows):
                if entry.version > start.version or position + row >= start.index:
                    expected.append((entry.version, number, row))
            position += rows
    assert read == expected


def test_the_same_range_always_plans_the_same_slices() -> None:
    first = plan_slices(TABLE, Offset(0, 1), Offset(2, 3))
    assert first == plan_slices(TABLE, Offset(0, 1), Offset(2, 3))
    assert first == [RowSlice(0, 0, 1, 3), RowSlice(0, 1, 0, 2), RowSlice(2, 0, 0, 3)]


def test_inconsistent_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="expected version 0"):
        plan_next([VersionRows(1, (1,))], Offset(0, 0))
    with pytest.raises(ValueError, match="beyond the 5 rows of version 0"):
        plan_next(TABLE, Offset(0, 6))
    with pytest.raises(ValueError, match="beyond the 5 rows of version 0"):
        plan_slices(TABLE, Offset(0, 0), Offset(0, 6))
    with pytest.raises(ValueError, match="before start"):
        plan_slices(TABLE, Offset(2, 0), Offset(0, 1))
    with pytest.raises(ValueError, match="stop at 0"):
        plan_slices(TABLE[:1], Offset(0, 0), Offset(2, 1))
    with pytest.raises(ValueError, match="max_rows must be at least 1"):
        plan_next(TABLE, Offset(0, 0), max_rows=0)


def test_offsets_round_trip_through_json() -> None:
    offset = Offset(4, 17)
    text = json.dumps(offset.to_dict())
    assert text == '{"source": "pyspark_abs_delta", "version": 4, "index": 17}'
    assert DeltaSource.offset_of(text) == offset.to_dict()
    assert Offset.parse(DeltaSource.offset_of(text)) == offset
    assert Offset(1, 5) < Offset(2, 0) < Offset(2, 1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "is not an offset"),
        ('{"logOffset": 3}', "not an offset of the pyspark_abs_delta source"),
        ('{"source": "pyspark_abs_delta", "version": 1}', "exactly the keys"),
        ('{"source": "pyspark_abs_delta", "version": -1, "index": 0}', "version must be"),
        ('{"source": "pyspark_abs_delta", "version": 1, "index": "2"}', "index must be"),
        ('{"source": "pyspark_abs_delta", "version": true, "index": 0}', "version must be"),
    ],
)
def test_foreign_offsets_are_rejected(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DeltaSource.offset_of(text)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_rows_per_trigger": 0}, "max_rows_per_trigger must be a positive integer"),
        ({"max_files_per_trigger": -2}, "max_files_per_trigger must be a positive integer"),
        ({"max_rows_per_trigger": 5, "max_files_per_trigger": 1}, "not both"),
        ({"starting_version": -1}, "starting_version must be an integer >= 0"),
        ({"starting_version": 3, "ending_version": 2}, "ending_version 2 is before"),
        ({"path": ""}, "path must be a non-empty string"),
        ({"skip_change_commits": True, "ignore_changes": True}, "not both"),
        ({"ignore_changes": "yes"}, "ignore_changes must be a bool"),
    ],
)
def test_bad_options_raise_config_errors(options: dict[str, object], message: str) -> None:
    settings: dict[str, object] = {"path": "/tmp/table"}
    settings.update(options)
    with pytest.raises(ConfigError, match=message):
        DeltaSource(**settings)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "kind", "expected"),
    [
        ("a b", pa.string(), ["a b", "a b"]),
        ("7", pa.int32(), [7, 7]),
        ("", pa.int64(), [None, None]),
        (None, pa.string(), [None, None]),
        ("true", pa.bool_(), [True, True]),
        ("12.50", pa.decimal128(5, 2), [Decimal("12.50")] * 2),
    ],
)
def test_partition_values_are_typed(
    value: str | None, kind: pa.DataType, expected: list[object]
) -> None:
    column = partition_array(value, kind, 2)
    assert column.type == kind
    assert column.to_pylist() == expected


def test_partition_timestamps_without_offset_are_utc() -> None:
    column = partition_array("2024-01-02 03:04:05", pa.timestamp("us", "UTC"), 1)
    assert column.type == pa.timestamp("us", "UTC")
    assert str(column[0].as_py()) == "2024-01-02 03:04:05+00:00"
    with pytest.raises(ValueError, match="is not a int32"):
        partition_array("x", pa.int32(), 1)
