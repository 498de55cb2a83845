"""Instants between Spark, the operator and Arrow: exact in every time zone, or a clear error."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from pyspark_abs.errors import InvalidTimeoutError, SchemaMismatchError
from pyspark_abs.operators.schema import frame_to_arrow, instant_columns, localize
from pyspark_abs.operators.timers import to_epoch_ms

NEW_YORK = "America/New_York"
UTC = dt.UTC
# 2026-11-01: New York goes from EDT (-4) back to EST (-5) at 06:00Z; 01:30 happens twice.
FIRST_0130 = dt.datetime(2026, 11, 1, 5, 30, tzinfo=UTC)
SECOND_0130 = dt.datetime(2026, 11, 1, 6, 30, tzinfo=UTC)
SCHEMA = pa.schema([pa.field("ts", pa.timestamp("us", tz="UTC"))])


def micros(*stamps: dt.datetime) -> pd.Series:
    return pd.Series([int(s.timestamp()) * 1_000_000 for s in stamps], name="ts")


def test_instants_from_spark_become_aware_in_the_session_zone_and_convert_back_exactly() -> None:
    frame = localize(pd.DataFrame({"ts": micros(FIRST_0130, SECOND_0130)}), ["ts"], NEW_YORK)
    assert str(frame["ts"].dtype) == f"datetime64[ns, {NEW_YORK}]"
    assert [t.strftime("%H:%M%z") for t in frame["ts"]] == ["01:30-0400", "01:30-0500"]
    table = frame_to_arrow(frame, SCHEMA, "output", NEW_YORK)
    assert table.column("ts").to_pylist() == [FIRST_0130, SECOND_0130]


def test_whole_and_nullable_microseconds_localize_alike() -> None:
    """Without nulls a column of microseconds takes a faster path: the same instants, unit
    and zone as the nullable one, before 1970 too, and an instant beyond what pandas holds
    in nanoseconds is refused on both."""
    values = [-1, 0, 1_700_000_000_123_456, -2_000_000_000_000_001]
    whole = localize(pd.DataFrame({"ts": values}), ["ts"], NEW_YORK)["ts"]
    nullable = pd.Series(pd.array([*values, None], dtype="Int64"))
    with_null = localize(pd.DataFrame({"ts": nullable}), ["ts"], NEW_YORK)["ts"]
    assert whole.dtype == with_null.dtype == pd.DatetimeTZDtype("ns", NEW_YORK)
    assert whole.tolist() == with_null.tolist()[:-1]
    assert [t.value // 1000 for t in whole] == values
    for beyond in (pd.Series([253_402_300_799_000_000]), pd.Series([253_402_300_799_000_000.0])):
        with pytest.raises(pd.errors.OutOfBoundsDatetime):
            localize(pd.DataFrame({"ts": beyond}), ["ts"], NEW_YORK)


def test_nulls_stay_null() -> None:
    frame = localize(pd.DataFrame({"ts": [1.0e15, float("nan")]}), ["ts"], NEW_YORK)
    assert frame["ts"].isna().tolist() == [False, True]
    assert frame_to_arrow(frame, SCHEMA, "x", NEW_YORK).column("ts").null_count == 1


def test_naive_datetimes_are_wall_clock_times_in_the_session_zone() -> None:
    naive = pd.DataFrame({"ts": [pd.Timestamp("2026-06-01 10:30")]})
    table = frame_to_arrow(naive, SCHEMA, "output 'o'", NEW_YORK)
    assert table.column("ts").to_pylist() == [dt.datetime(2026, 6, 1, 14, 30, tzinfo=UTC)]
    objects = pd.DataFrame({"ts": [dt.datetime(2026, 6, 1, 10, 30)]}, dtype=object)
    assert frame_to_arrow(objects, SCHEMA, "x", NEW_YORK).equals(table)


def test_aware_python_datetimes_convert_exactly() -> None:
    objects = pd.DataFrame({"ts": [FIRST_0130, SECOND_0130]}, dtype=object)
    table = frame_to_arrow(objects, SCHEMA, "x", NEW_YORK)
    assert table.column("ts").to_pylist() == [FIRST_0130, SECOND_0130]


@pytest.mark.parametrize("wall", ["2026-11-01 01:30", "2026-03-08 02:30"])
def test_a_naive_datetime_without_one_instant_is_refused(wall: str) -> None:
    frame = pd.DataFrame({"ts": [pd.Timestamp(wall)]})
    with pytest.raises(
        SchemaMismatchError,
        match=rf"output 'o': column 'ts' holds naive datetimes.*session time zone {NEW_YORK}.*"
        rf"Return time-zone-aware datetimes",
    ):
        frame_to_arrow(frame, SCHEMA, "output 'o'", NEW_YORK)
    with pytest.raises(InvalidTimeoutError, match=rf"{wall}.* no single instant .*{NEW_YORK}"):
        to_epoch_ms(pd.Timestamp(wall).to_pydatetime(), NEW_YORK)


def test_timeouts_from_datetimes() -> None:
    assert to_epoch_ms(SECOND_0130, NEW_YORK) == int(SECOND_0130.timestamp() * 1000)
    naive = dt.datetime(2026, 6, 1, 10, 30, 0, 250_000)
    assert to_epoch_ms(naive, NEW_YORK) == int(
        dt.datetime(2026, 6, 1, 14, 30, 0, 250_000, tzinfo=UTC).timestamp() * 1000
    )
    assert to_epoch_ms(naive, "UTC") == int(naive.replace(tzinfo=UTC).timestamp() * 1000)


@pytest.mark.parametrize("value", [1_500, np.int64(1_500), np.int32(1_500), np.uint16(1_500)])
def test_timeouts_from_integers_of_any_kind(value: object) -> None:
    assert to_epoch_ms(value, NEW_YORK) == 1_500  # type: ignore[arg-type]
    assert type(to_epoch_ms(value, NEW_YORK)) is int  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [True, np.bool_(True), 1.5, np.float64(1500.0), "1500", None])
def test_timeouts_that_are_no_integer_or_datetime_are_refused(value: object) -> None:
    with pytest.raises(InvalidTimeoutError, match="must be an int \\(ms\\) or a datetime"):
        to_epoch_ms(value, NEW_YORK)  # type: ignore[arg-type]


def test_only_zoned_timestamps_are_instants() -> None:
    instant: pa.DataType = pa.timestamp("us", tz="UTC")
    naive: pa.DataType = pa.timestamp("us")
    schema = pa.schema([("ts", instant), ("ntz", naive), ("n", pa.int64())])
    assert instant_columns(schema) == ("ts",)
